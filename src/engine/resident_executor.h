// The plain step: every unit resident on one backend (ReferenceModel), host AdamW over the
// ParamStore, exact global-norm clipping. It is the reference the sliding-window engine is
// checked against, and the strategy the planner picks when the whole model fits.
#pragma once
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "engine/step_executor.h"
#include "model/reference_model.h"

namespace sf {

class ResidentExecutor final : public StepExecutor {
 public:
  // `be` must outlive the executor. max_tokens: the largest micro-batch.
  // keep_activations: one scratch per layer, no recompute in the backward (planner's choice
  // when the memory is there; the same results).
  ResidentExecutor(Backend& be, const ModelConfig& cfg, int64_t max_tokens,
                   bool keep_activations = false, int64_t head_chunk_rows = 256,
                   StateFormat state_format = {});
  StepStats train_step(std::span<const Batch> micro, const OptimHyper& h) override;
  double eval_loss_sum(const Batch& b) override { return model_.forward(b); }
  ParamStore& params() override { return store_; }
  void params_changed() override;
  const char* name() const override { return name_.c_str(); }

 private:
  Backend& be_;
  ReferenceModel model_;
  ParamStore store_;
  std::vector<std::vector<float>> grads_;  // host copy of each unit's gradient
  std::string name_;
};

}  // namespace sf
