// AVX2 AdamW and sum-of-squares kernels, 8 floats per step; bitwise equal to
// kernels_scalar.cpp (same IEEE operations in the same order, no FMA). Compiled with -mavx2
// (FMA is neither needed nor required) and called only on CPUs that have it; keep the
// includes to <immintrin.h> and kernels.h (see kernels.h for why).
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

// kOut: 0 no bf16 copy, 1 unaligned stores, 2 non-temporal stores (out + i 16-byte aligned):
// the copy is write-only here, so streaming it skips reading its lines in first.
template <class G, int kOut>
int64_t adamw_body(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
                   const Consts& c) {
  const __m256 gs = _mm256_set1_ps(c.grad_scale), b1 = _mm256_set1_ps(c.beta1),
               omb1 = _mm256_set1_ps(c.one_minus_beta1), b2 = _mm256_set1_ps(c.beta2),
               omb2 = _mm256_set1_ps(c.one_minus_beta2), decay = _mm256_set1_ps(c.decay),
               step_size = _mm256_set1_ps(c.step_size), bc2_sqrt = _mm256_set1_ps(c.bc2_sqrt),
               eps = _mm256_set1_ps(c.eps);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gi = _mm256_mul_ps(load_grad(g + i), gs);
    const __m256 mi =
        _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(omb1, gi));
    const __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + i)),
                                    _mm256_mul_ps(_mm256_mul_ps(omb2, gi), gi));
    __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(p + i), decay);
    const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2_sqrt), eps);
    pi = _mm256_sub_ps(pi, _mm256_div_ps(_mm256_mul_ps(step_size, mi), denom));
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(p + i, pi);
    if constexpr (kOut == 1) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), to_bf16(pi));
    if constexpr (kOut == 2) _mm_stream_si128(reinterpret_cast<__m128i*>(out + i), to_bf16(pi));
  }
  if constexpr (kOut == 2) _mm_sfence();  // order the streamed stores before any later ones
  return i;
}

template <class G>
int64_t adamw_any(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
                  const Consts& c) {
  if (!out) return adamw_body<G, 0>(p, m, v, g, out, n, c);
  if (reinterpret_cast<uintptr_t>(out) % 16 == 0) return adamw_body<G, 2>(p, m, v, g, out, n, c);
  return adamw_body<G, 1>(p, m, v, g, out, n, c);
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

void adamw_f32_avx2(float* p, float* m, float* v, const float* g, uint16_t* out, int64_t n,
                    const Consts& c) {
  const int64_t i = adamw_any(p, m, v, g, out, n, c);
  if (i < n) adamw_f32_scalar(p + i, m + i, v + i, g + i, out ? out + i : nullptr, n - i, c);
}
void adamw_bf16_avx2(float* p, float* m, float* v, const uint16_t* g, uint16_t* out,
                     int64_t n, const Consts& c) {
  const int64_t i = adamw_any(p, m, v, g, out, n, c);
  if (i < n) adamw_bf16_scalar(p + i, m + i, v + i, g + i, out ? out + i : nullptr, n - i, c);
}
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
