// Everything on the device, optimizer included: bf16 weights, f32 gradients, and the fp32
// master weights with AdamW m and v (16 bytes per parameter plus activations; a compact
// state, optim/state_format.h, in one buffer per unit as engine/device_state.h lays it out). The fastest
// way to train when the whole state fits on the GPU, and the baseline the sliding window is
// measured against. The global gradient norm and AdamW run on the device; the host ParamStore
// is synchronised only when params() is asked for (checkpoints) or set (params_changed()).
#pragma once
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "engine/step_executor.h"
#include "model/reference_model.h"

namespace sf {

class DeviceResidentExecutor final : public StepExecutor {
 public:
  // keep_activations: one scratch per layer, no recompute in the backward (planner's choice
  // when the memory is there; the same results).
  DeviceResidentExecutor(Backend& be, const ModelConfig& cfg, int64_t max_tokens,
                         bool keep_activations = false, int64_t head_chunk_rows = 256,
                         StateFormat state_format = {});
  StepStats train_step(std::span<const Batch> micro, const OptimHyper& h) override;
  double eval_loss_sum(const Batch& b) override { return model_.forward(b); }
  ParamStore& params() override;  // downloads master, m, v when a step changed them
  void params_changed() override;  // uploads master, m, v and the compute-dtype weights
  const char* name() const override { return name_.c_str(); }

 private:
  Backend& be_;
  ReferenceModel model_;
  ParamStore store_;
  std::vector<std::unique_ptr<Buffer>> master_, m_, v_;  // per unit, device (fp32 state)
  std::vector<std::unique_ptr<Buffer>> state_;  // per unit, device (a compact state: device_state.h)
  bool compact() const { return !state_.empty(); }
  UnitStateView device_view(int u) const;
  std::unique_ptr<Buffer> norm_;                         // device f32 scalar
  bool host_stale_ = false;  // the device state moved on since the last download/upload
  std::string name_;
};

}  // namespace sf
