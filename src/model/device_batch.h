// DeviceBatch: owns the backend copy of one batch (or chunk) of tokens and the RoPE inverse
// frequencies, and hands out the BatchInputs the recipes read.
//
// upload() enqueues copy_to_device on the given stream: the host Batch must stay alive and
// unchanged until that stream has run the copies (synchronize it, or record an event), and a
// new upload must not be enqueued while ops reading the previous one may still run.
#pragma once
#include <memory>

#include "backend/backend.h"
#include "io/model_config.h"
#include "model/batch.h"
#include "model/recipes.h"

namespace sf {

class DeviceBatch {
 public:
  // Room for up to max_tokens tokens (and as many sequences). Uploads inv_freq on `s`.
  // storage: a device buffer of at least storage_bytes() that the caller allocated (the
  // sliding window's buffer list); null: the batch allocates its own.
  DeviceBatch(Backend& be, Stream& s, const ModelConfig& cfg, int64_t max_tokens,
              Buffer* storage = nullptr);
  static size_t storage_bytes(const ModelConfig& cfg, int64_t max_tokens);
  DeviceBatch(const DeviceBatch&) = delete;
  DeviceBatch& operator=(const DeviceBatch&) = delete;

  // Validates b against the vocabulary, the capacity, the sliding window of the config
  // (ModelConfig::sliding_window: longer sequences are refused, since the attention ops are
  // full-causal) and dynamic RoPE's range (rope_max_sequence), then copies its arrays.
  const BatchInputs& upload(Stream& s, const Batch& b);
  const BatchInputs& inputs() const { return in_; }
  int64_t max_tokens() const { return max_tokens_; }

 private:
  Backend& be_;
  ModelConfig cfg_;
  int64_t max_tokens_;
  std::unique_ptr<Buffer> own_;  // when no storage was given
  std::vector<float> inv_freq_host_;  // kept alive for the asynchronous first copy
  std::vector<int32_t> cu_host_;      // the batch's cu_seqlens: in_.attn.host_cu_seqlens
  BatchInputs in_;
};

}  // namespace sf
