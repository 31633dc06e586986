// Shared by the GPU engine tests: a model small enough for a fast GPU test but with real head
// and hidden sizes (the kernels' tile shapes), and random token rows as a Batch.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "io/model_config.h"
#include "model/batch.h"
#include "model/model_init.h"
#include "test_util.h"

namespace sf::test {

inline ModelConfig small_config(Arch arch, bool tied = false) {
  ModelConfig c = tiny_config(arch, tied);
  c.hidden_size = 256;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 512;
  c.vocab_size = 1000;
  c.num_hidden_layers = 4;
  return c;
}

inline Batch random_batch(const ModelConfig& cfg, int rows, int seq, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::vector<int32_t>> r(static_cast<size_t>(rows));
  for (auto& row : r)
    for (int i = 0; i < seq; ++i) row.push_back(int32_t(g() % uint64_t(cfg.vocab_size)));
  return Batch::from_rows(r);
}

}  // namespace sf::test
