// AVX-512 (F/BW/VL/DQ) AdamW (update, undo, redo) and sum-of-squares kernels, 16 floats per
// step; bitwise equal to kernels_scalar.cpp (same IEEE operations in the same order, no
// FMA). Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq and called only on CPUs
// that have them. This file holds the AVX-512 primitives and the sum of squares; the AdamW
// loops are kernels_simd.inl's. Keep the includes to <immintrin.h>, kernels.h and that file
// (see kernels.h for why).
#include <immintrin.h>

#include "optim/kernels.h"

namespace sf::optim_kernels {
namespace {

// f32 -> bf16 bits exactly as sf::f32_to_bf16: NaN -> quiet NaN (upper half | 0x40), else
// round to nearest even by adding 0x7fff + lsb(upper half). (vcvtneps2bf16 is not used: it
// flushes denormal inputs to zero.)
__m256i to_bf16(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(
      _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
  return _mm512_cvtepi32_epi16(r);  // values fit in 16 bits: plain truncation
}

__m512 load_grad(const float* g) { return _mm512_loadu_ps(g); }
__m512 load_grad(const uint16_t* g) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The vector primitives kernels_simd.inl is written over: 16 floats.
using V = __m512;
constexpr int kLanes = 16;
constexpr uintptr_t kOutAlign = 32;
inline V vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, V x) { _mm512_storeu_ps(p, x); }
inline V vset1(float x) { return _mm512_set1_ps(x); }
inline V vzero() { return _mm512_setzero_ps(); }
inline V vadd(V a, V b) { return _mm512_add_ps(a, b); }
inline V vsub(V a, V b) { return _mm512_sub_ps(a, b); }
inline V vmul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V vdiv(V a, V b) { return _mm512_div_ps(a, b); }
inline V vsqrt(V a) { return _mm512_sqrt_ps(a); }
inline V vmax(V a, V b) { return _mm512_max_ps(a, b); }
inline void store_bf16(uint16_t* out, V x) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), to_bf16(x));
}
inline void stream_bf16(uint16_t* out, V x) {
  _mm256_stream_si256(reinterpret_cast<__m256i*>(out), to_bf16(x));
}

// 8 gradient values widened (exactly) to double.
__m512d widen8(const float* g) { return _mm512_cvtps_pd(_mm256_loadu_ps(g)); }
__m512d widen8(const uint16_t* g) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g));
  return _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
}

// Lanes i % 8 in one __m512d; 8 elements per step, so lane order matches the scalar loop.
template <class G>
int64_t sum_squares_body(const G* g, int64_t n, double* acc) {
  __m512d a = _mm512_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m512d x = widen8(g + i);
    a = _mm512_add_pd(a, _mm512_mul_pd(x, x));
  }
  _mm512_storeu_pd(acc, a);
  return i;
}

}  // namespace

#define SF_SIMD_NAME(name) name##_avx512
#include "optim/kernels_simd.inl"
#undef SF_SIMD_NAME

double sum_squares_f32_avx512(const float* g, int64_t n) {
  double acc[8];
  const int64_t i = sum_squares_body(g, n, acc);
  return sum_squares_f32_finish(acc, g, i, n);
}
double sum_squares_bf16_avx512(const uint16_t* g, int64_t n) {
  double acc[8];
  const int64_t i = sum_squares_body(g, n, acc);
  return sum_squares_bf16_finish(acc, g, i, n);
}

}  // namespace sf::optim_kernels
