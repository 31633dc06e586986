// Helpers shared by the model tests: random batches and a ReferenceModel with random params.
#pragma once
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "backend/host/host_backend.h"
#include "model/batch.h"
#include "model/model_init.h"
#include "model/reference_model.h"

namespace sf::test {

// One sequence of `len` random tokens; labels are the next token (last: none), and each
// other label is dropped with probability `p_ignore` (at least one label is kept).
inline std::vector<int32_t> random_tokens(int len, int64_t vocab, std::mt19937_64& g) {
  std::uniform_int_distribution<int32_t> d(0, int32_t(vocab - 1));
  std::vector<int32_t> t(static_cast<size_t>(len));
  for (auto& x : t) x = d(g);
  return t;
}

// Packs sequences: positions restart at 0 per sequence; labels are the next token of the
// same sequence; labels at the indices in `ignore` (global token index) are set to -100.
inline Batch pack(const std::vector<std::vector<int32_t>>& seqs,
                  const std::vector<int>& ignore = {}) {
  Batch b = Batch::from_rows(seqs);
  for (int i : ignore) b.labels[size_t(i)] = kIgnoreLabel;
  return b;
}

// Concatenates batches (as if their sequences had been packed together).
inline Batch concat(const Batch& a, const Batch& b) {
  Batch c = a;
  const int32_t off = int32_t(a.n_tokens());
  c.tokens.insert(c.tokens.end(), b.tokens.begin(), b.tokens.end());
  c.labels.insert(c.labels.end(), b.labels.begin(), b.labels.end());
  c.positions.insert(c.positions.end(), b.positions.begin(), b.positions.end());
  for (size_t i = 1; i < b.cu_seqlens.size(); ++i) c.cu_seqlens.push_back(off + b.cu_seqlens[i]);
  return c;
}

struct Fixture {
  HostBackend be;
  ModelConfig cfg;
  std::unique_ptr<ReferenceModel> model;
  std::vector<std::vector<float>> params;

  Fixture(const ModelConfig& c, int64_t max_tokens, uint64_t seed, const InitOptions& opt,
          bool keep_activations = false, int64_t mlp_tile_tokens = 0)
      : cfg(c) {
    // 5: several head chunks
    model = std::make_unique<ReferenceModel>(be, cfg, max_tokens, 5, keep_activations,
                                             mlp_tile_tokens);
    params = init_params(model->layout(), seed, opt);
    upload_all();
  }
  void upload_all() {
    for (int u = 0; u < model->n_units(); ++u) model->set_unit_weights(u, params[size_t(u)].data());
  }
  std::vector<std::vector<float>> grads() {
    std::vector<std::vector<float>> g(params.size());
    for (int u = 0; u < model->n_units(); ++u) {
      g[size_t(u)].resize(params[size_t(u)].size());
      model->get_unit_grads(u, g[size_t(u)].data());
    }
    return g;
  }
};

// Options for gradient checks: matrices ~ 1/sqrt(C)-scaled so that every gradient is O(1)
// rather than damped by 0.02-scale weights, norm weights and biases visibly non-trivial.
inline InitOptions gradcheck_init() {
  InitOptions o;
  o.matrix_std = 0.15f;
  o.norm_jitter = 0.3f;
  o.bias_std = 0.2f;
  return o;
}

}  // namespace sf::test
