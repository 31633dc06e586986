// DeviceBatch: one buffer laid out as tokens | labels | positions | cu_seqlens | inv_freq.
#include "model/device_batch.h"

#include "core/error.h"

namespace sf {

namespace {
int64_t up64(int64_t n) { return (n + 63) / 64 * 64; }
}  // namespace

size_t DeviceBatch::storage_bytes(const ModelConfig& cfg, int64_t max_tokens) {
  return size_t(3 * up64(max_tokens) + up64(max_tokens + 1) + up64(int64_t(rope_inv_freq(cfg).size()))) * 4;
}

DeviceBatch::DeviceBatch(Backend& be, Stream& s, const ModelConfig& cfg, int64_t max_tokens,
                         Buffer* storage)
    : be_(be), cfg_(cfg), max_tokens_(max_tokens) {
  SF_CHECK(max_tokens > 0, "DeviceBatch for ", max_tokens, " tokens");
  inv_freq_host_ = rope_inv_freq(cfg);
  // 4 int32 arrays (cu_seqlens has max_tokens + 1 entries) then the f32 frequencies; each
  // array starts 64-element aligned.
  const int64_t a = up64(max_tokens), c = up64(max_tokens + 1);
  const size_t bytes = storage_bytes(cfg, max_tokens);
  if (!storage) {
    own_ = be.alloc(bytes, "batch inputs");
    storage = own_.get();
  }
  SF_CHECK(storage->bytes() >= bytes, "batch inputs: ", storage->bytes(), " bytes < ", bytes);
  auto* p = static_cast<int32_t*>(storage->data());
  in_.tokens = p;
  in_.labels = p + a;
  in_.positions = p + 2 * a;
  in_.cu_seqlens = p + 3 * a;
  in_.inv_freq = reinterpret_cast<const float*>(p + 3 * a + c);
  be.copy_to_device(s, const_cast<float*>(in_.inv_freq), inv_freq_host_.data(),
                    inv_freq_host_.size() * 4);
}

const BatchInputs& DeviceBatch::upload(Stream& s, const Batch& b) {
  b.validate(cfg_.vocab_size);
  SF_REQUIRE(b.n_tokens() > 0, "empty batch");
  SF_REQUIRE(b.n_tokens() <= max_tokens_, "batch of ", b.n_tokens(),
             " tokens exceeds the capacity of ", max_tokens_, " tokens it was sized for");
  check_sequence_length(cfg_, b.max_seqlen(), "config.json", "a batch sequence of length");
  for (int i = 0; i < b.n_seqs(); ++i)
    SF_REQUIRE(b.cu_seqlens[i + 1] > b.cu_seqlens[i], "batch sequence ", i, " is empty");
  const size_t T = size_t(b.n_tokens());
  be_.copy_to_device(s, const_cast<int32_t*>(in_.tokens), b.tokens.data(), T * 4);
  be_.copy_to_device(s, const_cast<int32_t*>(in_.labels), b.labels.data(), T * 4);
  be_.copy_to_device(s, const_cast<int32_t*>(in_.positions), b.positions.data(), T * 4);
  be_.copy_to_device(s, const_cast<int32_t*>(in_.cu_seqlens), b.cu_seqlens.data(),
                     b.cu_seqlens.size() * 4);
  in_.n_tokens = b.n_tokens();
  in_.attn = attention_shape(cfg_, b.n_seqs(), b.max_seqlen());
  cu_host_ = b.cu_seqlens;  // the host's copy, kept until the next upload as the device's is
  in_.attn.host_cu_seqlens = cu_host_.data();
  return in_;
}

}  // namespace sf
