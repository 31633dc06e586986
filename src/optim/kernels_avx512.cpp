// AVX-512 (F/BW/VL/DQ) AdamW (update, undo, redo) and sum-of-squares kernels, 16 floats per
// step; bitwise equal to kernels_scalar.cpp (same IEEE operations in the same order, no
// FMA). Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq and called only on CPUs
// that have them; keep the includes to <immintrin.h> and kernels.h (see kernels.h for why).
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

// The step's constants, broadcast.
struct Vc {
  __m512 gs, b1, omb1, b2, omb2, decay, step_size, bc2_sqrt, eps;
};
Vc broadcast(const Consts& c) {
  return {_mm512_set1_ps(c.grad_scale), _mm512_set1_ps(c.beta1), _mm512_set1_ps(c.one_minus_beta1),
          _mm512_set1_ps(c.beta2), _mm512_set1_ps(c.one_minus_beta2), _mm512_set1_ps(c.decay),
          _mm512_set1_ps(c.step_size), _mm512_set1_ps(c.bc2_sqrt), _mm512_set1_ps(c.eps)};
}

// One AdamW step on 16 lanes, p, m, v in place; graw is the unscaled gradient.
inline void update_v(const __m512 graw, __m512& p, __m512& m, __m512& v, const Vc& k) {
  const __m512 gi = _mm512_mul_ps(graw, k.gs);
  const __m512 mi = _mm512_add_ps(_mm512_mul_ps(k.b1, m), _mm512_mul_ps(k.omb1, gi));
  const __m512 vi =
      _mm512_add_ps(_mm512_mul_ps(k.b2, v), _mm512_mul_ps(_mm512_mul_ps(k.omb2, gi), gi));
  __m512 pi = _mm512_mul_ps(p, k.decay);
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), k.bc2_sqrt), k.eps);
  pi = _mm512_sub_ps(pi, _mm512_div_ps(_mm512_mul_ps(k.step_size, mi), denom));
  m = mi;
  v = vi;
  p = pi;
}

// Its inverse, the scalar undo1's operations in its order. max_ps(x, 0) returns its second
// operand unless x > 0, so NaN and -0 give +0 exactly like std::max(0.0f, x).
inline void undo_v(const __m512 graw, __m512& p, __m512& m, __m512& v, const Vc& k) {
  const __m512 gi = _mm512_mul_ps(graw, k.gs);
  const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), k.bc2_sqrt), k.eps);
  const __m512 p_decayed =
      _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(k.step_size, m), denom));
  p = _mm512_div_ps(p_decayed, k.decay);
  m = _mm512_div_ps(_mm512_sub_ps(m, _mm512_mul_ps(k.omb1, gi)), k.b1);
  const __m512 v_raw =
      _mm512_div_ps(_mm512_sub_ps(v, _mm512_mul_ps(_mm512_mul_ps(k.omb2, gi), gi)), k.b2);
  v = _mm512_max_ps(v_raw, _mm512_setzero_ps());
}

// kOut: 0 no bf16 copy, 1 unaligned stores, 2 non-temporal stores (out + i 32-byte aligned):
// the copy is write-only here, so streaming it skips reading its lines in first.
template <class G, int kOut>
int64_t adamw_body(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
                   const Consts& c) {
  const Vc k = broadcast(c);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 pi = _mm512_loadu_ps(p + i), mi = _mm512_loadu_ps(m + i), vi = _mm512_loadu_ps(v + i);
    update_v(load_grad(g + i), pi, mi, vi, k);
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
int64_t undo_body(float* p, float* m, float* v, const G* g, int64_t n, const Consts& c) {
  const Vc k = broadcast(c);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 pi = _mm512_loadu_ps(p + i), mi = _mm512_loadu_ps(m + i), vi = _mm512_loadu_ps(v + i);
    undo_v(load_grad(g + i), pi, mi, vi, k);
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    _mm512_storeu_ps(p + i, pi);
  }
  return i;
}

// Undo with `done`, update with `redo`, in registers; kOut as for adamw_body.
template <class G, int kOut>
int64_t redo_body(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
                  const Consts& done, const Consts& redo, bool fresh) {
  const Vc kd = broadcast(done), kr = broadcast(redo);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 graw = load_grad(g + i);
    __m512 pi = _mm512_loadu_ps(p + i), mi = _mm512_loadu_ps(m + i), vi = _mm512_loadu_ps(v + i);
    if (fresh) update_v(graw, pi, mi, vi, kd);
    undo_v(graw, pi, mi, vi, kd);
    update_v(graw, pi, mi, vi, kr);
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
    _mm512_storeu_ps(p + i, pi);
    if constexpr (kOut == 1) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), to_bf16(pi));
    if constexpr (kOut == 2) _mm256_stream_si256(reinterpret_cast<__m256i*>(out + i), to_bf16(pi));
  }
  if constexpr (kOut == 2) _mm_sfence();
  return i;
}

template <class G>
int64_t adamw_any(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
                  const Consts& c) {
  if (!out) return adamw_body<G, 0>(p, m, v, g, out, n, c);
  if (reinterpret_cast<uintptr_t>(out) % 32 == 0) return adamw_body<G, 2>(p, m, v, g, out, n, c);
  return adamw_body<G, 1>(p, m, v, g, out, n, c);
}

template <class G>
int64_t redo_any(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
                 const Consts& done, const Consts& redo, bool fresh) {
  if (!out) return redo_body<G, 0>(p, m, v, g, out, n, done, redo, fresh);
  if (reinterpret_cast<uintptr_t>(out) % 32 == 0)
    return redo_body<G, 2>(p, m, v, g, out, n, done, redo, fresh);
  return redo_body<G, 1>(p, m, v, g, out, n, done, redo, fresh);
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
void adamw_undo_f32_avx512(float* p, float* m, float* v, const float* g, int64_t n,
                           const Consts& c) {
  const int64_t i = undo_body(p, m, v, g, n, c);
  if (i < n) adamw_undo_f32_scalar(p + i, m + i, v + i, g + i, n - i, c);
}
void adamw_undo_bf16_avx512(float* p, float* m, float* v, const uint16_t* g, int64_t n,
                            const Consts& c) {
  const int64_t i = undo_body(p, m, v, g, n, c);
  if (i < n) adamw_undo_bf16_scalar(p + i, m + i, v + i, g + i, n - i, c);
}
void adamw_redo_f32_avx512(float* p, float* m, float* v, const float* g, uint16_t* out,
                           int64_t n, const Consts& done, const Consts& redo, bool fresh) {
  const int64_t i = redo_any(p, m, v, g, out, n, done, redo, fresh);
  if (i < n)
    adamw_redo_f32_scalar(p + i, m + i, v + i, g + i, out ? out + i : nullptr, n - i, done,
                          redo, fresh);
}
void adamw_redo_bf16_avx512(float* p, float* m, float* v, const uint16_t* g, uint16_t* out,
                            int64_t n, const Consts& done, const Consts& redo, bool fresh) {
  const int64_t i = redo_any(p, m, v, g, out, n, done, redo, fresh);
  if (i < n)
    adamw_redo_bf16_scalar(p + i, m + i, v + i, g + i, out ? out + i : nullptr, n - i, done,
                           redo, fresh);
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
