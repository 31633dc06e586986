// AVX2 AdamW (update, undo, redo) and sum-of-squares kernels, 8 floats per step; bitwise
// equal to kernels_scalar.cpp (same IEEE operations in the same order, no FMA). Compiled with
// -mavx2 (FMA is neither needed nor required) and called only on CPUs that have it. This file
// holds the AVX2 primitives and the sum of squares; the AdamW loops are kernels_simd.inl's.
// Keep the includes to <immintrin.h>, kernels.h and that file (see kernels.h for why).
#include <immintrin.h>

#include "optim/kernels.h"

namespace sf::optim_kernels {
namespace {

// f32 -> bf16 bits exactly as sf::f32_to_bf16: NaN -> quiet NaN (upper half | 0x40), else
// round to nearest even by adding 0x7fff + lsb(upper half).
__m128i to_bf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                         _mm256_set1_epi32(0x7f800000));
  const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  __m256i r = _mm256_srli_epi32(
      _mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), nan);
  // Values fit in 16 bits, so unsigned saturation is a plain narrowing.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

__m256 load_grad(const float* g) { return _mm256_loadu_ps(g); }
__m256 load_grad(const uint16_t* g) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// The vector primitives kernels_simd.inl is written over: 8 floats.
using V = __m256;
constexpr int kLanes = 8;
constexpr uintptr_t kOutAlign = 16;
inline V vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, V x) { _mm256_storeu_ps(p, x); }
inline V vset1(float x) { return _mm256_set1_ps(x); }
inline V vzero() { return _mm256_setzero_ps(); }
inline V vadd(V a, V b) { return _mm256_add_ps(a, b); }
inline V vsub(V a, V b) { return _mm256_sub_ps(a, b); }
inline V vmul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V vdiv(V a, V b) { return _mm256_div_ps(a, b); }
inline V vsqrt(V a) { return _mm256_sqrt_ps(a); }
inline V vmax(V a, V b) { return _mm256_max_ps(a, b); }
inline void store_bf16(uint16_t* out, V x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), to_bf16(x));
}
inline void stream_bf16(uint16_t* out, V x) {
  _mm_stream_si128(reinterpret_cast<__m128i*>(out), to_bf16(x));
}

__m256 load8(const float* g) { return _mm256_loadu_ps(g); }
__m256 load8(const uint16_t* g) { return load_grad(g); }

// Lanes 0..3 and 4..7 of the 8 accumulators in two __m256d; 8 elements per step, so lane
// order matches the scalar loop.
template <class G>
int64_t sum_squares_body(const G* g, int64_t n, double* acc) {
  __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = load8(g + i);
    const __m256d xl = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d xh = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    lo = _mm256_add_pd(lo, _mm256_mul_pd(xl, xl));
    hi = _mm256_add_pd(hi, _mm256_mul_pd(xh, xh));
  }
  _mm256_storeu_pd(acc, lo);
  _mm256_storeu_pd(acc + 4, hi);
  return i;
}

}  // namespace

#define SF_SIMD_NAME(name) name##_avx2
#include "optim/kernels_simd.inl"
#undef SF_SIMD_NAME

double sum_squares_f32_avx2(const float* g, int64_t n) {
  double acc[8];
  const int64_t i = sum_squares_body(g, n, acc);
  return sum_squares_f32_finish(acc, g, i, n);
}
double sum_squares_bf16_avx2(const uint16_t* g, int64_t n) {
  double acc[8];
  const int64_t i = sum_squares_body(g, n, acc);
  return sum_squares_bf16_finish(acc, g, i, n);
}

}  // namespace sf::optim_kernels
