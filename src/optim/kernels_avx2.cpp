// AVX2 AdamW (update, undo, redo) and sum-of-squares kernels, 8 floats per step; bitwise
// equal to kernels_scalar.cpp (same IEEE operations in the same order, no FMA). Compiled with
// -mavx2 (FMA is neither needed nor required) and called only on CPUs that have it; keep the
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

// The step's constants, broadcast.
struct Vc {
  __m256 gs, b1, omb1, b2, omb2, decay, step_size, bc2_sqrt, eps;
};
Vc broadcast(const Consts& c) {
  return {_mm256_set1_ps(c.grad_scale), _mm256_set1_ps(c.beta1), _mm256_set1_ps(c.one_minus_beta1),
          _mm256_set1_ps(c.beta2), _mm256_set1_ps(c.one_minus_beta2), _mm256_set1_ps(c.decay),
          _mm256_set1_ps(c.step_size), _mm256_set1_ps(c.bc2_sqrt), _mm256_set1_ps(c.eps)};
}

// One AdamW step on 8 lanes, p, m, v in place; graw is the unscaled gradient.
inline void update_v(const __m256 graw, __m256& p, __m256& m, __m256& v, const Vc& k) {
  const __m256 gi = _mm256_mul_ps(graw, k.gs);
  const __m256 mi = _mm256_add_ps(_mm256_mul_ps(k.b1, m), _mm256_mul_ps(k.omb1, gi));
  const __m256 vi =
      _mm256_add_ps(_mm256_mul_ps(k.b2, v), _mm256_mul_ps(_mm256_mul_ps(k.omb2, gi), gi));
  __m256 pi = _mm256_mul_ps(p, k.decay);
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), k.bc2_sqrt), k.eps);
  pi = _mm256_sub_ps(pi, _mm256_div_ps(_mm256_mul_ps(k.step_size, mi), denom));
  m = mi;
  v = vi;
  p = pi;
}

// Its inverse, the scalar undo1's operations in its order. max_ps(x, 0) returns its second
// operand unless x > 0, so NaN and -0 give +0 exactly like std::max(0.0f, x).
inline void undo_v(const __m256 graw, __m256& p, __m256& m, __m256& v, const Vc& k) {
  const __m256 gi = _mm256_mul_ps(graw, k.gs);
  const __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), k.bc2_sqrt), k.eps);
  const __m256 p_decayed =
      _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(k.step_size, m), denom));
  p = _mm256_div_ps(p_decayed, k.decay);
  m = _mm256_div_ps(_mm256_sub_ps(m, _mm256_mul_ps(k.omb1, gi)), k.b1);
  const __m256 v_raw =
      _mm256_div_ps(_mm256_sub_ps(v, _mm256_mul_ps(_mm256_mul_ps(k.omb2, gi), gi)), k.b2);
  v = _mm256_max_ps(v_raw, _mm256_setzero_ps());
}

// kOut: 0 no bf16 copy, 1 unaligned stores, 2 non-temporal stores (out + i 16-byte aligned):
// the copy is write-only here, so streaming it skips reading its lines in first.
template <class G, int kOut>
int64_t adamw_body(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
                   const Consts& c) {
  const Vc k = broadcast(c);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 pi = _mm256_loadu_ps(p + i), mi = _mm256_loadu_ps(m + i), vi = _mm256_loadu_ps(v + i);
    update_v(load_grad(g + i), pi, mi, vi, k);
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
int64_t undo_body(float* p, float* m, float* v, const G* g, int64_t n, const Consts& c) {
  const Vc k = broadcast(c);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 pi = _mm256_loadu_ps(p + i), mi = _mm256_loadu_ps(m + i), vi = _mm256_loadu_ps(v + i);
    undo_v(load_grad(g + i), pi, mi, vi, k);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(p + i, pi);
  }
  return i;
}

// Undo with `done`, update with `redo`, in registers; kOut as for adamw_body.
template <class G, int kOut>
int64_t redo_body(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
                  const Consts& done, const Consts& redo, bool fresh) {
  const Vc kd = broadcast(done), kr = broadcast(redo);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 graw = load_grad(g + i);
    __m256 pi = _mm256_loadu_ps(p + i), mi = _mm256_loadu_ps(m + i), vi = _mm256_loadu_ps(v + i);
    if (fresh) update_v(graw, pi, mi, vi, kd);
    undo_v(graw, pi, mi, vi, kd);
    update_v(graw, pi, mi, vi, kr);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    _mm256_storeu_ps(p + i, pi);
    if constexpr (kOut == 1) _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), to_bf16(pi));
    if constexpr (kOut == 2) _mm_stream_si128(reinterpret_cast<__m128i*>(out + i), to_bf16(pi));
  }
  if constexpr (kOut == 2) _mm_sfence();
  return i;
}

template <class G>
int64_t adamw_any(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
                  const Consts& c) {
  if (!out) return adamw_body<G, 0>(p, m, v, g, out, n, c);
  if (reinterpret_cast<uintptr_t>(out) % 16 == 0) return adamw_body<G, 2>(p, m, v, g, out, n, c);
  return adamw_body<G, 1>(p, m, v, g, out, n, c);
}

template <class G>
int64_t redo_any(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
                 const Consts& done, const Consts& redo, bool fresh) {
  if (!out) return redo_body<G, 0>(p, m, v, g, out, n, done, redo, fresh);
  if (reinterpret_cast<uintptr_t>(out) % 16 == 0)
    return redo_body<G, 2>(p, m, v, g, out, n, done, redo, fresh);
  return redo_body<G, 1>(p, m, v, g, out, n, done, redo, fresh);
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
void adamw_undo_f32_avx2(float* p, float* m, float* v, const float* g, int64_t n,
                         const Consts& c) {
  const int64_t i = undo_body(p, m, v, g, n, c);
  if (i < n) adamw_undo_f32_scalar(p + i, m + i, v + i, g + i, n - i, c);
}
void adamw_undo_bf16_avx2(float* p, float* m, float* v, const uint16_t* g, int64_t n,
                          const Consts& c) {
  const int64_t i = undo_body(p, m, v, g, n, c);
  if (i < n) adamw_undo_bf16_scalar(p + i, m + i, v + i, g + i, n - i, c);
}
void adamw_redo_f32_avx2(float* p, float* m, float* v, const float* g, uint16_t* out,
                         int64_t n, const Consts& done, const Consts& redo, bool fresh) {
  const int64_t i = redo_any(p, m, v, g, out, n, done, redo, fresh);
  if (i < n)
    adamw_redo_f32_scalar(p + i, m + i, v + i, g + i, out ? out + i : nullptr, n - i, done,
                          redo, fresh);
}
void adamw_redo_bf16_avx2(float* p, float* m, float* v, const uint16_t* g, uint16_t* out,
                          int64_t n, const Consts& done, const Consts& redo, bool fresh) {
  const int64_t i = redo_any(p, m, v, g, out, n, done, redo, fresh);
  if (i < n)
    adamw_redo_bf16_scalar(p + i, m + i, v + i, g + i, out ? out + i : nullptr, n - i, done,
                           redo, fresh);
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
