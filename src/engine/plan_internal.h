// Private to the planner's files (plan_*.cpp), not for other users: the few helpers the plan
// search, the step-time prediction and the plan's text share. planner.h is the interface.
#pragma once
#include <algorithm>

#include "engine/planner.h"

namespace sf::plan_internal {

// Layers whose home is on the device: the last resident_layers and the first
// device_adamw_layers (which may overlap).
inline int resident_layer_count(int n_layers, const EngineConfig& ec) {
  return ec.resident_layers + std::min(ec.device_adamw_layers, n_layers - ec.resident_layers);
}

// The share of a sliding window's GPU compute that keeping every layer's attention saves
// (its forward in the backward's recompute), at the request's largest chunk (where the GEMMs
// run fastest: the largest share any chunk size gives). plan_prediction.cpp.
double kept_attention_share(const ModelConfig& cfg, const StepRequest& req, const HardwareModel& hw);

// Fills p's prediction (step, compute, transfer and optimizer seconds, the clipped step,
// the bound, the model FLOPs, hw) from its mode, engine and memory; overwrites those fields
// and reads the rest (plan_prediction.cpp).
void predict(const ModelConfig& cfg, const StepRequest& req, const HardwareModel& hw, Plan& p);

}  // namespace sf::plan_internal
