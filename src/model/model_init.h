// Parameter initialisation and tiny model configs (for tests, examples and `init`).
//
// init_unit writes a unit's whole fp32 flat buffer (padding zeroed). Values depend only on
// (seed, unit, parameter, row), never on the thread count: each row draws from its own
// counter-based generator, and rows are spread over sf::host_pool().
#pragma once
#include <cstdint>
#include <vector>

#include "io/model_config.h"
#include "model/param_layout.h"

namespace sf {

struct InitOptions {
  float matrix_std = 0.02f;  // matrices (embedding, projections, lm_head): normal(0, std)
  float norm_jitter = 0.f;   // norm weights: 1 + normal(0, norm_jitter)
  float bias_std = 0.f;      // biases: normal(0, bias_std)
};

// Fills out[0, unit.numel) for `unit` of `layout`.
void init_unit(const Unit& unit, float* out, uint64_t seed, const InitOptions& opt = {});
// Every unit of `layout`, in unit order.
std::vector<std::vector<float>> init_params(const ModelLayout& layout, uint64_t seed,
                                            const InitOptions& opt = {});

// A tiny model of `arch` for tests: 2 layers, hidden 32 (24 for qwen3, whose head_dim 8 * 4
// heads != hidden), grouped-query attention (4 heads, 2 kv heads), vocab 53. llama carries
// llama3 rope_scaling with a short original context so that all three frequency bands are
// exercised; qwen2 has the q/k/v bias; qwen3 has q/k norm.
ModelConfig tiny_config(Arch arch, bool tied = false);

}  // namespace sf
