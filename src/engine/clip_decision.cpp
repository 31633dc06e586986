// The clip/skip decision, the speculation gates and the step counter (clip_decision.h).
#include "engine/clip_decision.h"

#include <cmath>

#include "core/error.h"
#include "optim/grad_norm.h"

namespace sf {

ClipDecision decide_clip(double sumsq, float max_grad_norm) {
  ClipDecision d;
  d.norm = std::sqrt(sumsq);
  d.skip = !std::isfinite(d.norm);
  d.coef = d.skip ? 0.f : clip_coefficient(d.norm, max_grad_norm);
  return d;
}

bool may_speculate(double sumsq_so_far, float max_grad_norm, bool ignore_norm) {
  if (!std::isfinite(sumsq_so_far)) return false;
  if (ignore_norm || !(max_grad_norm > 0)) return true;  // off: as clip_coefficient decides
  return std::sqrt(sumsq_so_far) + 1e-6 < double(max_grad_norm);
}

bool step_may_speculate(const OptimHyper& h) { return h.beta1 > 0 && h.beta2 > 0; }

AdamWStep next_adamw_step(const OptimHyper& h, const ParamStore& store, float coef) {
  return adamw_step(h, store.step + 1, coef);
}

void advance_step(ParamStore& store, const AdamWStep& taken) {
  SF_CHECK(taken.step == store.step + 1, "optimizer step ", taken.step,
           " applied to a store at step ", store.step,
           ": an executor advanced the step counter twice or skipped one");
  store.step = taken.step;
}

}  // namespace sf
