// The architecture of a decoder model, as read from (and written back to) a Hugging Face
// config.json: llama, mistral, qwen2 (q/k/v bias) and qwen3 (per-head q/k RMSNorm). Parsing
// follows transformers 5.17 for files written by transformers 5 (rope_parameters, dtype) and 4
// (rope_theta, rope_scaling, torch_dtype) alike, with each family's defaults for absent
// fields. Every field that changes the computation is honoured or refused with an error
// naming the file and field; writing keeps the source's spelling and adds no duplicate keys.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"

namespace sf {

enum class Arch { llama, mistral, qwen2, qwen3 };
std::string_view arch_name(Arch a);  // the HF model_type

// RoPE frequency scaling, as transformers 5 computes it (modeling_rope_utils.py). Fields a
// type does not use keep their defaults. Optional fields are the ones a config may omit; they
// stay absent so that a saved config.json says what its source said.
struct RopeScaling {
  enum class Type { none, linear, dynamic, llama3, yarn } type = Type::none;
  double factor = 1.0;                                // linear, dynamic, llama3, yarn
  double low_freq_factor = 1.0;                       // llama3
  double high_freq_factor = 4.0;                      // llama3
  int64_t original_max_position_embeddings = 8192;    // llama3, yarn: the pretraining context
  std::optional<double> beta_fast, beta_slow;         // yarn: 32 and 1 when absent (or 0)
  std::optional<double> attention_factor;             // yarn: cos/sin scale; derived when absent
  std::optional<double> mscale, mscale_all_dim;       // yarn: derive attention_factor from them
  std::optional<bool> truncate;                       // yarn: integer correction range (true)
  bool operator==(const RopeScaling&) const = default;
};
std::string_view rope_type_name(RopeScaling::Type t);  // as transformers spells rope_type

// How the source config.json spelled the fields transformers 5 renamed. A saved config keeps
// its source's spelling; a model made here gets transformers 5's.
enum class RopeSpelling { parameters, legacy };    // rope_parameters{rope_theta,..} | rope_theta + rope_scaling
enum class DtypeSpelling { dtype, torch_dtype };

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
  // Tokens a sliding-window layer attends over (mistral's sliding_window; qwen's layers that
  // layer_types / max_window_layers make sliding); 0: every layer attends to the whole
  // sequence. slideformer has no windowed attention: longer sequences are refused.
  int64_t sliding_window = 0;
  DType torch_dtype = DType::bf16;
  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  RopeSpelling rope_spelling = RopeSpelling::parameters;
  DtypeSpelling dtype_spelling = DtypeSpelling::dtype;
  nlohmann::json extra;  // every field of the source file, kept so that writing loses nothing

  bool operator==(const ModelConfig&) const = default;

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

// RoPE inverse frequencies [head_dim/2] including the configured scaling (dynamic: as at
// sequence lengths up to max_position_embeddings, where it equals the default).
std::vector<float> rope_inv_freq(const ModelConfig& c);
// The factor transformers multiplies cos and sin by (yarn's attention factor; 1 otherwise).
// q and k both carry it, so attention scores scale by its square.
double rope_attention_scaling(const ModelConfig& c);
// The longest sequence the configured RoPE is defined for here: max_position_embeddings for
// dynamic scaling (beyond it transformers recomputes the frequencies per batch), else no limit (0).
int64_t rope_max_sequence(const ModelConfig& c);
// Refuses a sequence length the model does not compute as transformers does (beyond
// sliding_window, or dynamic RoPE's range): train and eval call it with --seq-len before
// anything is loaded, DeviceBatch with each batch's longest sequence. `source` names the
// config.json; `flag` what set the length (e.g. "--seq-len").
void check_sequence_length(const ModelConfig& c, int64_t seq_len, const std::string& source,
                           const std::string& flag = "--seq-len");

}  // namespace sf
