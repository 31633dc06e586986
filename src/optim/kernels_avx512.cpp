// AVX-512 (F/BW/VL/DQ) AdamW and sum-of-squares kernels, 16 floats per step; bitwise equal
// to kernels_scalar.cpp (same IEEE operations in the same order, no FMA). Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512dq and called only on CPUs that have them; keep
// the includes to <immintrin.h> and kernels.h (see kernels.h for why).
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

// kOut: 0 no bf16 copy, 1 unaligned stores, 2 non-temporal stores (out + i 32-byte aligned):
// the copy is write-only here, so streaming it skips reading its lines in first.
template <class G, int kOut>
int64_t adamw_body(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
                   const Consts& c) {
  const __m512 gs = _mm512_set1_ps(c.grad_scale), b1 = _mm512_set1_ps(c.beta1),
               omb1 = _mm512_set1_ps(c.one_minus_beta1), b2 = _mm512_set1_ps(c.beta2),
               omb2 = _mm512_set1_ps(c.one_minus_beta2), decay = _mm512_set1_ps(c.decay),
               step_size = _mm512_set1_ps(c.step_size), bc2_sqrt = _mm512_set1_ps(c.bc2_sqrt),
               eps = _mm512_set1_ps(c.eps);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 gi = _mm512_mul_ps(load_grad(g + i), gs);
    const __m512 mi =
        _mm512_add_ps(_mm512_mul_ps(b1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(omb1, gi));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(b2, _mm512_loadu_ps(v + i)),
                                    _mm512_mul_ps(_mm512_mul_ps(omb2, gi), gi));
    __m512 pi = _mm512_mul_ps(_mm512_loadu_ps(p + i), decay);
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2_sqrt), eps);
    pi = _mm512_sub_ps(pi, _mm512_div_ps(_mm512_mul_ps(step_size, mi), denom));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    _mm512_storeu_ps(p + i, pi);
    if constexpr (kOut == 1) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), to_bf16(pi));
    if constexpr (kOut == 2) _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), to_bf16(pi));
  }
  if constexpr (kOut == 2) _mm_sfence();  // order the streamed stores before any later ones
  return i;
}

template <class G>
int64_t adamw_any(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
                  const Consts& c) {
  if (!out) return adamw_body<G, 0>(p, m, v, g, out, n, c);
  if (reinterpret_cast<uintptr_t>(out) % 32 == 0) return adamw_body<G, 2>(p, m, v, g, out, n, c);
  return adamw_body<G, 1>(p, m, v, g, out, n, c);
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

void adamw_f32_avx512(float* p, float* m, float* v, const float* g, uint16_t* out, int64_t n,
                      const Consts& c) {
  const int64_t i = adamw_any(p, m, v, g, out, n, c);
  if (i < n) adamw_f32_scalar(p + i, m + i, v + i, g + i, out ? out + i : nullptr, n - i, c);
}
void adamw_bf16_avx512(float* p, float* m, float* v, const uint16_t* g, uint16_t* out,
                       int64_t n, const Consts& c) {
  const int64_t i = adamw_any(p, m, v, g, out, n, c);
  if (i < n) adamw_bf16_scalar(p + i, m + i, v + i, g + i, out ? out + i : nullptr, n - i, c);
}
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
