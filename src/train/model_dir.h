// Saving a whole Hugging Face model directory (config.json, safetensors shards + index,
// tokenizer files, generation_config.json: export/generation_config.h) so that a crash at any moment leaves the previous directory intact:
// everything is written into "<dir>.tmp.<pid>", fsynced, and renamed over <dir> at the end.
#pragma once
#include <cstdint>
#include <filesystem>
#include <vector>

#include "io/model_config.h"
#include "model/param_layout.h"

namespace sf {

struct SaveModelOptions {
  DType dtype = DType::bf16;                     // dtype of the saved weights
  size_t max_shard_bytes = size_t(5) << 30;      // Hugging Face's default 5 GB shards
  std::filesystem::path tokenizer_dir;           // copy tokenizer*.json etc. from here if set
};

// A model's weights per layout unit: fp32, or bf16 bits written as they are (a bf16 master
// store's; the saved dtype must then be bf16). Exactly one of the two is filled.
struct UnitWeights {
  std::vector<const float*> f32;
  std::vector<const uint16_t*> bf16;
};

void save_model_dir(const std::filesystem::path& dir, const ModelConfig& config,
                    const ModelLayout& layout, const std::vector<const float*>& unit_weights,
                    const SaveModelOptions& opt);

// The files of save_model_dir written into an existing directory, without the final rename
// (for callers that assemble a larger directory, e.g. a checkpoint, and rename it whole).
void write_model_files(const std::filesystem::path& dir, const ModelConfig& config,
                       const ModelLayout& layout, const std::vector<const float*>& unit_weights,
                       const SaveModelOptions& opt);
void write_model_files(const std::filesystem::path& dir, const ModelConfig& config,
                       const ModelLayout& layout, const UnitWeights& weights,
                       const SaveModelOptions& opt);

// Replaces `dir` by the complete directory `tmp` (same parent): rename the old one aside,
// rename tmp into place, fsync the parent, then delete the old one.
void replace_dir(const std::filesystem::path& tmp, const std::filesystem::path& dir);

// Files copied with a model: tokenizer and generation settings.
void copy_tokenizer_files(const std::filesystem::path& from, const std::filesystem::path& to);

}  // namespace sf
