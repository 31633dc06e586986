// Portable AdamW and sum-of-squares kernels (ISA-neutral translation unit): the reference
// every SIMD variant must match bit for bit, and the tail handler of those variants.
// Built with -ffp-contract=off (src/CMakeLists.txt): no fused multiply-add.
#include <cmath>

#include "core/dtype.h"
#include "optim/kernels.h"

namespace sf::optim_kernels {
namespace {

inline float load_grad(const float* g, int64_t i) { return g[i]; }
inline float load_grad(const uint16_t* g, int64_t i) { return bf16_to_f32(g[i]); }

template <class G, bool kOut>
void adamw_loop(float* __restrict p, float* __restrict m, float* __restrict v,
                const G* __restrict g, uint16_t* __restrict out, int64_t n, const Consts& c) {
  const float gs = c.grad_scale, b1 = c.beta1, omb1 = c.one_minus_beta1, b2 = c.beta2,
              omb2 = c.one_minus_beta2, decay = c.decay, step_size = c.step_size,
              bc2_sqrt = c.bc2_sqrt, eps = c.eps;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = load_grad(g, i) * gs;
    const float mi = b1 * m[i] + omb1 * gi;
    const float vi = b2 * v[i] + omb2 * gi * gi;
    float pi = p[i] * decay;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    pi = pi - step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi;
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
