// AVX2 compact-state AdamW kernels (state_kernels.h), 8 floats per step; bitwise equal to
// state_kernels_scalar.cpp. Compiled with -mavx2 (no FMA) and called only on CPUs that have
// it. This file holds the AVX2 primitives; the loops are state_kernels_simd.inl's. Keep the
// includes to <immintrin.h>, state_kernels.h and that file (see kernels.h for why).
#include <immintrin.h>

#include "optim/state_kernels.h"

namespace sf::optim_kernels {
namespace {

using V = __m256;
using VI = __m256i;
constexpr int kLanes = 8;

inline V vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, V x) { _mm256_storeu_ps(p, x); }
inline V vset1(float x) { return _mm256_set1_ps(x); }
inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
inline V vsub(V a, V b) { return _mm256_sub_ps(a, b); }
inline V vmul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V vdiv(V a, V b) { return _mm256_div_ps(a, b); }
inline V vsqrt(V a) { return _mm256_sqrt_ps(a); }
inline V vabs(V a) { return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }
inline V vmax(V a, V b) { return _mm256_max_ps(a, b); }  // a > b ? a : b

inline VI vi_set1(uint32_t x) { return _mm256_set1_epi32(int(x)); }
inline VI vi_iota() { return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7); }
inline VI vi_add(VI a, VI b) { return _mm256_add_epi32(a, b); }
inline VI vi_xor(VI a, VI b) { return _mm256_xor_si256(a, b); }
inline VI vi_mul(VI a, VI b) { return _mm256_mullo_epi32(a, b); }
template <int kBits>
inline VI vi_shr(VI a) { return _mm256_srli_epi32(a, kBits); }

inline V load_grad(const float* g) { return _mm256_loadu_ps(g); }
inline V load_bf16(const uint16_t* g) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// NaN lanes (|x| > inf as integers) become the quiet NaN (upper half | 0x40); the others
// (u + add) >> 16: add = 0x7fff + lsb for round to nearest even, the noise for stochastic.
inline VI bf16_from(V x, VI add) {
  const VI u = _mm256_castps_si256(x);
  const VI hi = _mm256_srli_epi32(u, 16);
  const VI nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                    _mm256_set1_epi32(0x7f800000));
  const VI r = _mm256_srli_epi32(_mm256_add_epi32(u, add), 16);
  return _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
}
inline VI bf16_bits(V x) {
  const VI lsb = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 16),
                                  _mm256_set1_epi32(1));
  return bf16_from(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
}
inline VI round_bits(V x, VI noise) { return bf16_from(x, noise); }

// Lanes hold values < 2^16, so unsigned saturation is a plain narrowing.
inline void store_u16(uint16_t* out, VI x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                   _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1)));
}
inline VI load_codes(const uint8_t* c) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c)));
}
inline void store_codes(uint8_t* c, VI x) {  // lanes < 256
  const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(c), _mm_packus_epi16(w, w));
}

// Masks are all-ones / all-zero 32-bit lanes.
using M = __m256i;
inline VI vi_sub(VI a, VI b) { return _mm256_sub_epi32(a, b); }
inline VI vi_and(VI a, VI b) { return _mm256_and_si256(a, b); }
inline VI vi_or(VI a, VI b) { return _mm256_or_si256(a, b); }
inline VI vi_min(VI a, VI b) { return _mm256_min_epi32(a, b); }
template <int kBits>
inline VI vi_shl(VI a) { return _mm256_slli_epi32(a, kBits); }
inline VI as_int(V a) { return _mm256_castps_si256(a); }
inline V as_float(VI a) { return _mm256_castsi256_ps(a); }
inline M vf_ge(V a, V b) { return as_int(_mm256_cmp_ps(a, b, _CMP_GE_OQ)); }
inline M vf_le(V a, V b) { return as_int(_mm256_cmp_ps(a, b, _CMP_LE_OQ)); }
inline M vf_lt(V a, V b) { return as_int(_mm256_cmp_ps(a, b, _CMP_LT_OQ)); }
inline M vf_nan(V a) { return as_int(_mm256_cmp_ps(a, a, _CMP_UNORD_Q)); }
inline M vi_eq(VI a, VI b) { return _mm256_cmpeq_epi32(a, b); }
inline M vi_lt(VI a, VI b) { return _mm256_cmpgt_epi32(b, a); }
inline VI vi_sel(M m, VI a, VI b) { return _mm256_blendv_epi8(b, a, m); }
inline V vf_sel(M m, V a, V b) { return _mm256_blendv_ps(b, a, as_float(m)); }
inline VI vi_inc_if(VI c, M m) { return _mm256_sub_epi32(c, m); }  // m is -1 where set
inline V vtable8(const float* t) { return _mm256_loadu_ps(t); }
inline V vlookup8(V table, VI idx) { return _mm256_permutevar8x32_ps(table, idx); }  // idx & 7

}  // namespace

#define SF_SIMD_NAME(name) name##_avx2
#include "optim/state_kernels_simd.inl"
#undef SF_SIMD_NAME

}  // namespace sf::optim_kernels
