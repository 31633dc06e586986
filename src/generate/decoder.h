// Decoder: inference of one sequence with a KV cache, on any Backend. append() runs new tokens
// (a prompt, a chat turn, or the one token just sampled) through every layer at their
// positions after the cached ones, keeps their keys / values (after RoPE) in the cache, and
// returns the logits of the last one; truncate() drops the cached tail (a chat whose rendered
// prefix changed).
//
// Owns: the compute-dtype weights (resident: every unit in backend memory; streamed: the
// embedding and head units in backend memory, the layers in host memory that the backend can
// copy from asynchronously, and two layer slots in backend memory that a copy stream fills one
// layer ahead of the compute stream); the KV cache [L][k|v][max_context, kv_dim]; one layer's
// scratch for chunk_tokens tokens (model/recipes.h LayerActs, forward slots only); the
// hidden state; the f32 logits of one token, on the device and in host memory.
//
// A prompt longer than chunk_tokens runs in chunks of chunk_tokens (the cache makes chunks
// exact: each one attends to everything before it). Every append() synchronizes the backend's
// default stream before it returns (it reads the logits back).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "io/model_config.h"
#include "model/param_layout.h"
#include "model/recipes.h"

namespace sf {

enum class WeightPlacement {
  placement_resident,  // every unit in backend memory
  placement_streamed,  // layers in host memory, copied into two backend slots as they run
};

struct DecoderOptions {
  int64_t max_context = 2048;  // tokens the cache holds: positions 0 .. max_context - 1
  int64_t chunk_tokens = 256;  // most tokens one pass through the layers takes
  WeightPlacement placement = WeightPlacement::placement_resident;
};

class Decoder {
 public:
  // Validates max_context against the config (sliding window, dynamic RoPE's range) and
  // allocates everything; weights are zero until set_unit_weights.
  Decoder(Backend& be, const ModelConfig& cfg, const DecoderOptions& opt);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // Backend memory the decoder allocates with this placement (weights, cache, scratch):
  // what choosing a placement compares with the device's free memory.
  static size_t device_bytes(const ModelConfig& cfg, const DecoderOptions& opt, DType cd);

  const ModelConfig& config() const { return cfg_; }
  const ModelLayout& layout() const { return layout_; }
  const DecoderOptions& options() const { return opt_; }
  int n_units() const { return int(layout_.units.size()); }

  // fp32 -> compute dtype, the whole flat unit (layout().units[unit].numel elements).
  void set_unit_weights(int unit, const float* fp32);

  // Runs `tokens` (non-empty; ids in [0, vocab)) at positions cached() .. cached() + n - 1
  // and returns the logits [vocab] of the last, f32 in host memory, valid until the next call.
  // Throws Error(input) when the cache would exceed max_context.
  std::span<const float> append(std::span<const int32_t> tokens);
  // Tokens in the cache (the position of the next token).
  int64_t cached() const { return cached_; }
  // Keeps the first n cached tokens (0 <= n <= cached()); later appends overwrite the rest.
  void truncate(int64_t n);

 private:
  struct Streaming;  // the host copies of the layers, the two slots and their events

  void run_chunk(std::span<const int32_t> tokens);
  void run_layer(int layer, const LayerWeights& w, const BatchInputs& in, Mat x);
  LayerWeights layer_weights(int layer);
  HeadWeights head_weights() const;
  void logits_of_last(Mat x);
  Mat cache_rows(int layer, int kv) const;  // [max_context, kv_dim]: kv 0 = keys, 1 = values

  Backend& be_;
  Stream& s_;
  ModelConfig cfg_;
  ModelLayout layout_;
  DecoderOptions opt_;
  DType cd_;
  int64_t cached_ = 0;
  std::vector<std::unique_ptr<Buffer>> units_;  // resident: all; streamed: embedding, head
  std::unique_ptr<Streaming> stream_;
  std::unique_ptr<Buffer> cache_, scratch_, x_, head_xn_, logits_dev_, logits_host_;
  std::unique_ptr<Buffer> inputs_dev_, inputs_host_;  // tokens | positions | cu_seqlens | inv_freq
};

}  // namespace sf
