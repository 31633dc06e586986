// What the trainer asks of an execution strategy: run one optimizer step (forward, backward
// and AdamW over a list of micro-batches) and evaluate. Implementations: ResidentExecutor
// (everything on one backend; the plain reference step) and the sliding-window engine.
// Both keep the persistent state in a ParamStore, so checkpoints do not care which runs.
#pragma once
#include <cstdint>
#include <span>
#include <string>

#include "core/error.h"
#include "optim/adamw_step.h"
#include "optim/param_store.h"
#include "model/batch.h"

namespace sf {

struct OptimHyper {
  double lr = 1e-5;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float weight_decay = 0.0f;
  float max_grad_norm = 0.0f;  // <= 0: no clipping
};

struct StepStats {
  double loss_sum = 0;     // summed cross-entropy over valid labels
  int64_t n_valid = 0;     // labels that counted
  int64_t n_tokens = 0;    // tokens processed (incl. unlabelled)
  double grad_norm = 0;    // global L2 norm before clipping
  double clip_coef = 1;    // factor applied to the gradients (0: step skipped, ClipDecision)
  // Where the step's wall time went (host clock; 0 when the executor does not say).
  double forward_seconds = 0;      // enqueue + run of the forward and head
  double backward_seconds = 0;     // the backward until every gradient has landed
  double update_wait_seconds = 0;  // this step waiting for the previous step's updates
  double update_seconds = 0;       // the previous step's CPU optimizer, on its own thread
  double gpu_busy_seconds = 0;     // device time of the step's compute kernels (0: unknown)
  // Device idle time (compute stream, between compute ops; 0: unknown): inside the forward
  // (+ head), inside the backward, and between the previous step's last compute op and this
  // step's first (the step boundary: host embedding work, optimizer waits).
  double gpu_idle_forward_seconds = 0, gpu_idle_backward_seconds = 0, gpu_idle_before_seconds = 0;
  // Speculative update (-1: not speculated): units its phase A had not updated when the
  // backward ended (left to after it), and phase A's time in AdamW during the backward.
  int spec_units_left = -1;
  double spec_busy_seconds = 0;
  // Host time from the backward's end until the update is under way (0: not measured).
  double finish_seconds = 0;
  double loss() const { return n_valid ? loss_sum / double(n_valid) : 0.0; }
};

// What every executor's step starts with: the micro-batches' token and label counts (throws
// when no token has a label) ...
inline StepStats count_step(std::span<const Batch> micro) {
  StepStats st;
  for (const Batch& b : micro) {
    st.n_valid += b.n_valid_labels();
    st.n_tokens += b.n_tokens();
  }
  SF_REQUIRE(st.n_valid > 0, "train step: no token of the batch has a label; check the data");
  return st;
}
// ... the gradient scale that makes the loss the mean over every label of every micro-batch ...
inline float mean_loss_scale(const StepStats& st) { return float(1.0 / double(st.n_valid)); }
// ... and, once the norm is known, the AdamW step of the hyper-parameters (executors take
// it through next_adamw_step, engine/clip_decision.h, which also decides clip and skip).
inline AdamWStep adamw_step(const OptimHyper& h, int64_t step, float grad_scale) {
  AdamWStep s;
  s.lr = float(h.lr);
  s.beta1 = h.beta1;
  s.beta2 = h.beta2;
  s.eps = h.eps;
  s.weight_decay = h.weight_decay;
  s.step = step;
  s.grad_scale = grad_scale;
  return s;
}

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  // Gradient accumulation over `micro`: the loss is the mean over every valid label of every
  // micro-batch, exactly as if they were one batch. Increments params().step.
  virtual StepStats train_step(std::span<const Batch> micro, const OptimHyper& h) = 0;
  // Summed loss over the valid labels of b (no gradients).
  virtual double eval_loss_sum(const Batch& b) = 0;
  virtual ParamStore& params() = 0;
  // After params().master was changed from outside (load, resume): refresh device copies.
  virtual void params_changed() = 0;
  virtual const char* name() const = 0;
  // Peak bytes the executor's backend has had allocated (device memory on CUDA); 0: unknown.
  virtual size_t device_peak_bytes() const { return 0; }
  // The same now (Backend::bytes_in_use), and the device's bytes in use as its driver counts
  // them (Backend::device_used_bytes: 0 on the host backend); 0: unknown.
  virtual size_t device_bytes_in_use() const { return 0; }
  virtual size_t device_used_bytes() const { return 0; }
  // Backend::one_off_costs of the executor's backend ("" when unknown).
  virtual std::string one_off_costs() const { return {}; }
};

}  // namespace sf
