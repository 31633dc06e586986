// Internal to src/optim's scalar kernels (kernels_scalar.cpp, state_kernels_scalar.cpp): the
// one-element AdamW step of adamw.h, written once so the fp32 and the compact-state references
// cannot drift apart. Its functions live in an anonymous namespace (internal linkage), so no
// copy compiled with one ISA's flags can stand in for another's (kernels.h says why); only
// ISA-neutral translation units include it. Built with -ffp-contract=off: no fused multiply-add.
#pragma once
#include <cmath>

#include "optim/kernels.h"

namespace sf::optim_kernels {
namespace {

// One AdamW step on one element, p, m, v in place; graw is the unscaled gradient.
inline void update1(float graw, float& p, float& m, float& v, const Consts& c) {
  const float gi = graw * c.grad_scale;
  const float mi = c.beta1 * m + c.one_minus_beta1 * gi;
  const float vi = c.beta2 * v + c.one_minus_beta2 * gi * gi;
  float pi = p * c.decay;
  const float denom = std::sqrt(vi) / c.bc2_sqrt + c.eps;
  pi = pi - c.step_size * mi / denom;
  m = mi;
  v = vi;
  p = pi;
}

}  // namespace
}  // namespace sf::optim_kernels
