// Picks the backend ("auto": CUDA when built with it and a GPU is present, else host) and the
// execution strategy for a model, and returns a ready StepExecutor that owns both.
#pragma once
#include <memory>
#include <string>

#include "engine/step_executor.h"
#include "io/model_config.h"
#include "model/param_layout.h"

namespace sf {

std::unique_ptr<StepExecutor> make_executor(const std::string& backend, const ModelConfig& cfg,
                                            const ModelLayout& layout, int64_t micro_tokens);

}  // namespace sf
