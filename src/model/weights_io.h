// Model weights <-> Hugging Face safetensors, mapped onto slideformer's flat per-unit
// parameter layout (model/param_layout.h): each HF tensor is a ParamPart at a fixed element
// offset in its unit's fp32 buffer.
//
// load_model_weights OVERWRITES every element of each unit buffer: parts get the file's
// values (converted to fp32), alignment padding between slots is set to zero. It validates
// the whole checkpoint against the config before writing anything: every expected tensor
// present, no unexpected one, every shape and dtype right.
// save_model_weights (and save_model_weights_bf16, from bf16 bits) writes the HF tensors in
// layout order; it does not write config.json
// (io/model_config.h: save_config).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/param_layout.h"

namespace sf {

struct WeightsLoadInfo {
  int64_t tensors = 0;               // HF tensors loaded
  uint64_t bytes = 0;                // their bytes in the files
  bool sharded = false;
  std::vector<std::string> ignored;  // tensors skipped on purpose (tied lm_head, inv_freq)
  std::vector<std::string> notes;    // oddities worth a log line (holes, unindexed tensors)
};

// dir: a model directory (model.safetensors or an index + shards). unit_ptrs[u] points to
// layout.units[u].numel floats. Throws Error(input) naming tensor, file and what is wrong.
// Ignored without error: "lm_head.weight" when embeddings are tied, "*.rotary_emb.inv_freq".
WeightsLoadInfo load_model_weights(const std::filesystem::path& dir, const ModelConfig& c,
                                   const ModelLayout& layout,
                                   const std::vector<float*>& unit_ptrs);
// The same unit by unit, for a store that keeps the weights in another form: after every
// check has passed, each unit in order is filled into buffer(u) (numel floats, overwritten)
// and then done(u) is called (e.g. to encode them into the store and reuse the buffer).
WeightsLoadInfo load_model_weights(const std::filesystem::path& dir, const ModelConfig& c,
                                   const ModelLayout& layout,
                                   const std::function<float*(size_t unit)>& buffer,
                                   const std::function<void(size_t unit)>& done);

// Writes the weights in unit_ptrs (fp32, layout.units[u].numel each) to dir as out_dtype
// (bf16, f16 or f32; bf16/f16 round to nearest even), in shards of at most max_shard_bytes
// (write_safetensors_model). Tied models write no lm_head.weight. Returns the files written.
std::vector<std::filesystem::path> save_model_weights(
    const std::filesystem::path& dir, const ModelConfig& c, const ModelLayout& layout,
    const std::vector<const float*>& unit_ptrs, DType out_dtype = DType::bf16,
    uint64_t max_shard_bytes = kDefaultMaxShardBytes);
std::vector<std::filesystem::path> save_model_weights(
    const std::filesystem::path& dir, const ModelConfig& c, const ModelLayout& layout,
    const std::vector<float*>& unit_ptrs, DType out_dtype = DType::bf16,
    uint64_t max_shard_bytes = kDefaultMaxShardBytes);
// The same from bf16 weights (unit_bf16[u]: layout.units[u].numel values), written as bf16
// bit for bit (a bf16 master's exact bits).
std::vector<std::filesystem::path> save_model_weights_bf16(
    const std::filesystem::path& dir, const ModelConfig& c, const ModelLayout& layout,
    const std::vector<const uint16_t*>& unit_bf16,
    uint64_t max_shard_bytes = kDefaultMaxShardBytes);

}  // namespace sf
