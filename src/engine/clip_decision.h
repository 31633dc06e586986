// The one place a training step decides what its update does once the gradients' sum of
// squares is known, and the one place the optimizer step counter advances. Every executor
// (resident, device-resident, sliding deferred and speculative) only collects the sum of
// squares, asks decide_clip(), and applies the decision:
//
//   skip      the global norm is not finite (an inf or NaN somewhere in the gradient): no
//             update at all, weights and moments stay (the speculative engine undoes what it
//             had applied), the step counter does not advance; StepStats says clip_coef 0.
//   otherwise AdamW with grad_scale = coef = clip_coefficient(norm, max_grad_norm)
//             (torch's clip_grad_norm_: min(1, max / (norm + 1e-6)); 1 when max <= 0), the
//             step number next_adamw_step() gives, then advance_step().
//
// may_speculate() is the gate of the speculative update (host_speculation.cpp): whether a
// unit may be updated with coefficient 1 before the global norm is known.
//
// In engine, not optim: the step counter lives in ParamStore and the hyper-parameters and
// statistics are engine types; the arithmetic itself is optim's clip_coefficient().
#pragma once
#include <cstdint>

#include "optim/adamw_step.h"
#include "optim/param_store.h"
#include "engine/step_executor.h"

namespace sf {

struct ClipDecision {
  double norm = 0;    // global L2 norm before clipping: sqrt of the summed squares
  float coef = 1;     // the update's AdamWStep::grad_scale; 0 when skipped
  bool skip = false;  // norm not finite: no update, the step counter stays
  // What StepStats reports of it (grad_norm, clip_coef).
  void report(StepStats& st) const {
    st.grad_norm = norm;
    st.clip_coef = coef;
  }
};

// The decision for a step whose gradients' squares sum to `sumsq` (added in the executor's
// fixed unit order), clipping to max_grad_norm (<= 0: off).
ClipDecision decide_clip(double sumsq, float max_grad_norm);

// Whether the speculative update may apply a unit's AdamW with coefficient 1 now, the units
// taken so far (this one included) summing to `sumsq_so_far`: that sum is finite and its norm
// stays below max_grad_norm - 1e-6 (or clipping is off), so the step's coefficient can still
// be 1. Once false it stays false for the step (the sum only grows). ignore_norm (the tests'
// EngineTestModes::speculate_everything) drops the clipping condition, not the finiteness one.
// A speculated unit whose final coefficient is not 1 is redone (or undone, skipped) after.
bool may_speculate(double sumsq_so_far, float max_grad_norm, bool ignore_norm = false);

// Whether a step with these hyper-parameters may be speculated at all: a zero beta forgets
// the old moment, so such a step cannot be undone or redone (optim/adamw_undo.h).
bool step_may_speculate(const OptimHyper& h);

// The AdamW step the next update of `store` takes: number store.step + 1 (1-based, for the
// bias correction) and grad_scale `coef`. The counter itself is not touched.
AdamWStep next_adamw_step(const OptimHyper& h, const ParamStore& store, float coef);

// The optimizer step `taken` (from next_adamw_step on this store) is applied, or under way on
// the update thread: the store's counter becomes its number. The only place the counter
// advances during training; a skipped step never calls it.
void advance_step(ParamStore& store, const AdamWStep& taken);

}  // namespace sf
