// ReferenceModel: the whole model resident in backend memory, no offloading. It is the
// ground truth the sliding-window engine is tested against, and a trainer for models that
// fit. Built only from the recipes of model/recipes.h, so it runs on any Backend.
//
// Owns: per unit, the compute-dtype weights and the f32 gradients (flat, ModelLayout order);
// every layer input of a batch ([L+1, max_tokens, C]: x_0 = embeddings ... x_L = head input);
// one gradient buffer [max_tokens, C] that flows through all layers; one scratch buffer shared
// by LayerActs and HeadActs (keep_activations: one LayerActs scratch per layer instead, so
// the backward does not recompute the forward, plus the head's); the loss scalar; the
// uploaded batch. The layer scratch runs the MLP in tiles of at most mlp_tile_tokens tokens
// (0: untiled; see LayerActs).
//
// Gradients ACCUMULATE across forward_backward calls until zero_grads(), so gradient
// accumulation over micro-batches is repeated calls. Every call synchronizes the backend's
// default stream before returning (it reads the loss back).
#pragma once
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "model/batch.h"
#include "model/device_batch.h"
#include "model/param_layout.h"
#include "model/recipes.h"

namespace sf {

class ReferenceModel {
 public:
  // head_chunk_rows: tokens per lm-head logits chunk (scratch [rows, V] f32).
  // mlp_tile_tokens: tokens per MLP tile of the layer scratch (0: one tile per batch).
  ReferenceModel(Backend& be, const ModelConfig& cfg, int64_t max_tokens,
                 int64_t head_chunk_rows = 256, bool keep_activations = false,
                 int64_t mlp_tile_tokens = 0);
  // Bytes of scratch the model allocates (what resident_memory() counts).
  static size_t scratch_bytes(const ModelConfig& cfg, int64_t max_tokens, DType cd,
                              int64_t head_chunk_rows, bool keep_activations,
                              int64_t mlp_tile_tokens = 0);
  ReferenceModel(const ReferenceModel&) = delete;
  ReferenceModel& operator=(const ReferenceModel&) = delete;
  ~ReferenceModel();

  const ModelConfig& config() const { return cfg_; }
  const ModelLayout& layout() const { return layout_; }
  int n_units() const { return int(layout_.units.size()); }
  int64_t max_tokens() const { return max_tokens_; }

  // fp32 -> compute dtype, the whole flat unit (layout_.units[unit].numel elements).
  void set_unit_weights(int unit, const float* fp32);
  // compute dtype -> fp32 (the weights as the model sees them, e.g. bf16-rounded).
  void get_unit_weights(int unit, float* out);
  // The unit's f32 gradient buffer (numel elements).
  void get_unit_grads(int unit, float* out);
  void zero_grads();

  // Summed cross-entropy over the batch's valid labels (no gradients).
  double forward(const Batch& b);
  // Same loss; gradients of grad_scale * loss accumulate into the gradient buffers.
  double forward_backward(const Batch& b, float grad_scale);

  // The unit's compute-dtype weights and f32 gradients in backend memory (for optimizers
  // that update the model where it lives).
  void* unit_weights_device(int unit) const { return weights_[size_t(unit)]->data(); }
  float* unit_grads_device(int unit) const { return static_cast<float*>(grads_[size_t(unit)]->data()); }
  Stream& stream() const { return s_; }

  // Bound views, for tests of the recipes against the model's own buffers.
  LayerWeights layer_weights(int layer) const;
  LayerGrads layer_grads(int layer) const;
  EmbeddingWeights embedding_weights() const;
  EmbeddingGrads embedding_grads() const;
  HeadWeights head_weights() const;
  HeadGrads head_grads() const;

 private:
  // Upload b and run embedding + all layers; returns the head input x_L.
  const BatchInputs& run_forward(const Batch& b);
  Mat x_at(int i, int64_t T) const;  // layer input i for T tokens
  LayerActs layer_acts(int layer, int64_t T) const;  // its own or the shared scratch
  double read_loss();
  void check_unit(int unit) const;

  Backend& be_;
  Stream& s_;
  ModelConfig cfg_;
  ModelLayout layout_;
  int64_t max_tokens_, head_chunk_rows_, mlp_tile_tokens_;
  DType cd_;
  std::vector<std::unique_ptr<Buffer>> weights_, grads_;
  bool keep_;
  std::unique_ptr<Buffer> xs_, dx_, scratch_, loss_;
  std::vector<std::unique_ptr<Buffer>> layer_scratch_;  // keep_activations: per layer
  std::unique_ptr<DeviceBatch> batch_;
};

}  // namespace sf
