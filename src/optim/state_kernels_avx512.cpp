// AVX-512 (F/BW/VL/DQ) compact-state AdamW kernels (state_kernels.h), 16 floats per step;
// bitwise equal to state_kernels_scalar.cpp. Compiled with the AVX-512 flags of
// kernels_avx512.cpp and called only on CPUs that have them. This file holds the primitives;
// the loops are state_kernels_simd.inl's. Keep the includes to <immintrin.h>,
// state_kernels.h and that file (see kernels.h for why).
#include <immintrin.h>

#include "optim/state_kernels.h"

namespace sf::optim_kernels {
namespace {

using V = __m512;
using VI = __m512i;
constexpr int kLanes = 16;

inline V vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, V x) { _mm512_storeu_ps(p, x); }
inline V vset1(float x) { return _mm512_set1_ps(x); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline V vsub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V vdiv(V a, V b) { return _mm512_div_ps(a, b); }
inline V vsqrt(V a) { return _mm512_sqrt_ps(a); }
inline V vabs(V a) {
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7fffffff)));
}
inline V vmax(V a, V b) { return _mm512_max_ps(a, b); }  // a > b ? a : b

inline VI vi_set1(uint32_t x) { return _mm512_set1_epi32(int(x)); }
inline VI vi_iota() {
  return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
inline VI vi_add(VI a, VI b) { return _mm512_add_epi32(a, b); }
inline VI vi_xor(VI a, VI b) { return _mm512_xor_si512(a, b); }
inline VI vi_mul(VI a, VI b) { return _mm512_mullo_epi32(a, b); }
template <int kBits>
inline VI vi_shr(VI a) { return _mm512_srli_epi32(a, kBits); }

inline V load_grad(const float* g) { return _mm512_loadu_ps(g); }
inline V load_bf16(const uint16_t* g) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// As state_kernels_avx2.cpp: NaN -> quiet NaN, else (u + add) >> 16.
inline VI bf16_from(V x, VI add) {
  const VI u = _mm512_castps_si512(x);
  const VI hi = _mm512_srli_epi32(u, 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const VI r = _mm512_srli_epi32(_mm512_add_epi32(u, add), 16);
  return _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
}
inline VI bf16_bits(V x) {
  const VI lsb = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(x), 16),
                                  _mm512_set1_epi32(1));
  return bf16_from(x, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb));
}
inline VI round_bits(V x, VI noise) { return bf16_from(x, noise); }

inline void store_u16(uint16_t* out, VI x) {  // lanes < 2^16: plain truncation
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_cvtepi32_epi16(x));
}
inline VI load_codes(const uint8_t* c) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
}
inline void store_codes(uint8_t* c, VI x) {  // lanes < 256
  _mm_storeu_si128(reinterpret_cast<__m128i*>(c), _mm512_cvtepi32_epi8(x));
}

using M = __mmask16;
inline VI vi_sub(VI a, VI b) { return _mm512_sub_epi32(a, b); }
inline VI vi_and(VI a, VI b) { return _mm512_and_si512(a, b); }
inline VI vi_or(VI a, VI b) { return _mm512_or_si512(a, b); }
inline VI vi_min(VI a, VI b) { return _mm512_min_epi32(a, b); }
template <int kBits>
inline VI vi_shl(VI a) { return _mm512_slli_epi32(a, kBits); }
inline VI as_int(V a) { return _mm512_castps_si512(a); }
inline V as_float(VI a) { return _mm512_castsi512_ps(a); }
inline M vf_ge(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
inline M vf_le(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LE_OQ); }
inline M vf_lt(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
inline M vf_nan(V a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
inline M vi_eq(VI a, VI b) { return _mm512_cmpeq_epi32_mask(a, b); }
inline M vi_lt(VI a, VI b) { return _mm512_cmplt_epi32_mask(a, b); }
inline VI vi_sel(M m, VI a, VI b) { return _mm512_mask_mov_epi32(b, m, a); }
inline V vf_sel(M m, V a, V b) { return _mm512_mask_mov_ps(b, m, a); }
inline VI vi_inc_if(VI c, M m) { return _mm512_mask_add_epi32(c, m, c, _mm512_set1_epi32(1)); }
// The 8 entries twice, so that the 4-bit permute index k & 15 reads entry k & 7.
inline V vtable8(const float* t) {
  const __m256 h = _mm256_loadu_ps(t);
  return _mm512_insertf32x8(_mm512_castps256_ps512(h), h, 1);
}
inline V vlookup8(V table, VI idx) { return _mm512_permutexvar_ps(idx, table); }

}  // namespace

#define SF_SIMD_NAME(name) name##_avx512
#include "optim/state_kernels_simd.inl"
#undef SF_SIMD_NAME

}  // namespace sf::optim_kernels
