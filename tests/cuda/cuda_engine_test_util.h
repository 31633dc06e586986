// Shared by the GPU engine tests: a model small enough for a fast GPU test but with real head
// and hidden sizes (the kernels' tile shapes), and random token rows as a Batch.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "engine/engine_config.h"
#include "engine/step_executor.h"

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

// A 2-slot window over chunks of `chunk` tokens (4 per step), the last layer's and the head's
// homes resident, their update trips in 777-element ring pieces (many, the last one ragged).
inline EngineConfig small_window(int64_t chunk) {
  EngineConfig ec;
  ec.n_slots = 2;
  ec.max_chunk_tokens = chunk;
  ec.max_chunks = 4;
  ec.resident_layers = 1;
  ec.head_resident = true;
  ec.ring_piece = 777;
  return ec;
}

// Two executors that must train alike: the same initial weights (init_unit with `seed`), 3 steps
// of the same two micro-batches of 2 x 96 tokens (lr 1e-3, weight decay 0.1, no clipping, so an
// ulp of the norm's reduction order cannot change an update); equal losses, norms an ulp apart
// at most (the device reductions may sum in another order), and every bit of master, m and v
// (fp32 state) equal.
inline void expect_same_three_steps(StepExecutor& a, StepExecutor& b, const ModelConfig& cfg, uint64_t seed) {
  const ModelLayout layout = ModelLayout::build(cfg);
  for (int u = 0; u < a.params().n_units(); ++u) {
    init_unit(layout.units[size_t(u)], a.params().master(u), seed);
    init_unit(layout.units[size_t(u)], b.params().master(u), seed);
  }
  a.params_changed();
  b.params_changed();
  OptimHyper h;
  h.lr = 1e-3;
  h.weight_decay = 0.1f;
  h.max_grad_norm = 0.f;
  std::vector<Batch> micro = {random_batch(cfg, 2, 96, 1), random_batch(cfg, 2, 96, 2)};
  for (int step = 0; step < 3; ++step) {
    const StepStats x = a.train_step(micro, h), y = b.train_step(micro, h);
    EXPECT_EQ(x.loss(), y.loss()) << "step " << step;
    EXPECT_NEAR(y.grad_norm, x.grad_norm, 1e-6 * x.grad_norm) << "step " << step;
  }
  ParamStore &pa = a.params(), &pb = b.params();
  for (int u = 0; u < pa.n_units(); ++u) {
    const size_t n = size_t(pa.numel(u)) * 4;
    ASSERT_EQ(0, std::memcmp(pa.master(u), pb.master(u), n)) << "master of unit " << u;
    ASSERT_EQ(0, std::memcmp(pa.m(u), pb.m(u), n)) << "m of unit " << u;
    ASSERT_EQ(0, std::memcmp(pa.v(u), pb.v(u), n)) << "v of unit " << u;
  }
}

}  // namespace sf::test
