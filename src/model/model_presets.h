// Named model shapes for `slideformer init` and benchmarks: real architectures' configs
// (random weights are generated from them) and small ones for tests and the bundled example.
#pragma once
#include <string>
#include <vector>

#include "io/model_config.h"

namespace sf {

// Names: tiny, small, llama3-1b, llama3-8b, mistral-7b, qwen2.5-7b, qwen3-0.6b, qwen3-8b.
// Throws Error(input) listing the known names for an unknown one.
ModelConfig model_preset(const std::string& name);
std::vector<std::string> model_preset_names();

}  // namespace sf
