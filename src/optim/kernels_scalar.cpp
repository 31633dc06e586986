// Portable AdamW (update, undo, redo) and sum-of-squares kernels (ISA-neutral translation
// unit): the reference every SIMD variant must match bit for bit, and the tail handler of
// those variants.
// Built with -ffp-contract=off (src/CMakeLists.txt): no fused multiply-add.
#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "optim/adamw_element.h"
#include "optim/kernels.h"

namespace sf::optim_kernels {
namespace {

inline float load_grad(const float* g, int64_t i) { return g[i]; }
inline float load_grad(const uint16_t* g, int64_t i) { return bf16_to_f32(g[i]); }

// Its inverse (adamw_undo.h), in the operation order of the engine's first (scalar) rollback:
// std::max(0.0f, x) is (0 < x) ? x : 0, so a NaN or negative v becomes +0.
inline void undo1(float graw, float& p, float& m, float& v, const Consts& c) {
  const float gi = graw * c.grad_scale;
  const float denom = std::sqrt(v) / c.bc2_sqrt + c.eps;
  const float p_decayed = p + c.step_size * m / denom;
  p = p_decayed / c.decay;
  m = (m - c.one_minus_beta1 * gi) / c.beta1;
  v = std::max(0.0f, (v - c.one_minus_beta2 * gi * gi) / c.beta2);
}

template <class G, bool kOut>
void adamw_loop(float* __restrict p, float* __restrict m, float* __restrict v,
                const G* __restrict g, uint16_t* __restrict out, int64_t n, const Consts& c) {
  const Consts k = c;  // a local copy: provably not aliased by the stores
  for (int64_t i = 0; i < n; ++i) {
    update1(load_grad(g, i), p[i], m[i], v[i], k);
    if constexpr (kOut) out[i] = f32_to_bf16(p[i]);
  }
}

template <class G>
void undo_loop(float* __restrict p, float* __restrict m, float* __restrict v,
               const G* __restrict g, int64_t n, const Consts& c) {
  const Consts k = c;
  for (int64_t i = 0; i < n; ++i) undo1(load_grad(g, i), p[i], m[i], v[i], k);
}

template <class G, bool kOut>
void redo_loop(float* __restrict p, float* __restrict m, float* __restrict v,
               const G* __restrict g, uint16_t* __restrict out, int64_t n, const Consts& done,
               const Consts& redo, bool fresh) {
  const Consts kd = done, kr = redo;
  for (int64_t i = 0; i < n; ++i) {
    const float graw = load_grad(g, i);
    float pi = p[i], mi = m[i], vi = v[i];
    if (fresh) update1(graw, pi, mi, vi, kd);
    undo1(graw, pi, mi, vi, kd);
    update1(graw, pi, mi, vi, kr);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if constexpr (kOut) out[i] = f32_to_bf16(pi);
  }
}

template <class G>
void adamw_any(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
               const Consts& c) {
  if (out)
    adamw_loop<G, true>(p, m, v, g, out, n, c);
  else
    adamw_loop<G, false>(p, m, v, g, out, n, c);
}

template <class G>
void redo_any(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
              const Consts& done, const Consts& redo, bool fresh) {
  if (out)
    redo_loop<G, true>(p, m, v, g, out, n, done, redo, fresh);
  else
    redo_loop<G, false>(p, m, v, g, out, n, done, redo, fresh);
}

inline double combine(const double* a) {
  return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
}

template <class G>
double finish(double* acc, const G* g, int64_t i, int64_t n) {
  for (; i < n; ++i) {
    const double x = double(load_grad(g, i));
    acc[i & 7] += x * x;  // x * x is exact in double (24-bit significands)
  }
  return combine(acc);
}

}  // namespace

void adamw_f32_scalar(float* p, float* m, float* v, const float* g, uint16_t* out, int64_t n,
                      const Consts& c) {
  adamw_any(p, m, v, g, out, n, c);
}
void adamw_bf16_scalar(float* p, float* m, float* v, const uint16_t* g, uint16_t* out,
                       int64_t n, const Consts& c) {
  adamw_any(p, m, v, g, out, n, c);
}

void adamw_undo_f32_scalar(float* p, float* m, float* v, const float* g, int64_t n,
                           const Consts& c) {
  undo_loop(p, m, v, g, n, c);
}
void adamw_undo_bf16_scalar(float* p, float* m, float* v, const uint16_t* g, int64_t n,
                            const Consts& c) {
  undo_loop(p, m, v, g, n, c);
}
void adamw_redo_f32_scalar(float* p, float* m, float* v, const float* g, uint16_t* out,
                           int64_t n, const Consts& done, const Consts& redo, bool fresh) {
  redo_any(p, m, v, g, out, n, done, redo, fresh);
}
void adamw_redo_bf16_scalar(float* p, float* m, float* v, const uint16_t* g, uint16_t* out,
                            int64_t n, const Consts& done, const Consts& redo, bool fresh) {
  redo_any(p, m, v, g, out, n, done, redo, fresh);
}

double sum_squares_f32_finish(double* acc, const float* g, int64_t i, int64_t n) {
  return finish(acc, g, i, n);
}
double sum_squares_bf16_finish(double* acc, const uint16_t* g, int64_t i, int64_t n) {
  return finish(acc, g, i, n);
}
double sum_squares_f32_scalar(const float* g, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  return finish(acc, g, 0, n);
}
double sum_squares_bf16_scalar(const uint16_t* g, int64_t n) {
  double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  return finish(acc, g, 0, n);
}

}  // namespace sf::optim_kernels
