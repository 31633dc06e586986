// The architecture of a decoder model, as read from (and written back to) a Hugging Face
// config.json. Covers llama (incl. llama3 RoPE scaling), mistral, qwen2 (q/k/v bias) and
// qwen3 (per-head q/k RMSNorm, explicit head_dim).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace sf {

enum class Arch { llama, mistral, qwen2, qwen3 };
std::string_view arch_name(Arch a);  // the HF model_type

struct RopeScaling {
  enum class Type { none, llama3, linear } type = Type::none;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  Arch arch = Arch::llama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // qwen2: q/k/v projections carry a bias
  bool qk_norm = false;   // qwen3: RMSNorm over each head of q and k
  DType torch_dtype = DType::bf16;
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  nlohmann::json extra;  // every field of the source file, kept so that writing loses nothing

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  int64_t num_parameters() const;
};

// Parse a config.json. `source` names the file in error messages.
ModelConfig config_from_json(const nlohmann::json& j, const std::string& source);
ModelConfig load_config(const std::filesystem::path& config_json);
nlohmann::json config_to_json(const ModelConfig& c);
// Writes config.json atomically (temporary name, fsync, rename).
void save_config(const ModelConfig& c, const std::filesystem::path& config_json);

// RoPE inverse frequencies [head_dim/2] including the configured scaling.
std::vector<float> rope_inv_freq(const ModelConfig& c);

}  // namespace sf
