#include "export/gguf_export.h"

#include <cmath>

#include "core/error.h"
#include "export/gguf_vocab.h"
#include "io/gguf_writer.h"
#include "io/model_config.h"
#include "io/safetensors.h"
#include "model/gguf_import.h"
#include "model/param_layout.h"

namespace sf {

namespace fs = std::filesystem;

namespace {

// llama.cpp's LLAMA_FTYPE_* (general.file_type): what most matrices are.
uint32_t file_type_id(GgufExportType t) {
  switch (t) {
    case GgufExportType::f16: return 1;
    case GgufExportType::q8_0: return 7;
    case GgufExportType::bf16: return 32;
  }
  return 0;
}

uint32_t matrix_type(GgufExportType t) {
  switch (t) {
    case GgufExportType::f16: return ggml_type::F16;
    case GgufExportType::q8_0: return ggml_type::Q8_0;
    case GgufExportType::bf16: return ggml_type::BF16;
  }
  return ggml_type::F32;
}

std::string gguf_arch(const ModelConfig& c) {
  switch (c.arch) {
    case Arch::llama:
    case Arch::mistral: return "llama";  // llama.cpp runs Mistral as a llama
    case Arch::qwen2: return "qwen2";
    case Arch::qwen3: return "qwen3";
  }
  return "";
}

struct Context {
  const ModelConfig& c;
  std::string arch, cfg_src;
  GgufWriter& w;
  std::vector<std::string>& notes;
  std::string key(const char* k) const { return arch + "." + k; }
};

void add_shape(const Context& x) {
  const ModelConfig& c = x.c;
  x.w.add_u32(x.key("vocab_size"), uint32_t(c.vocab_size));
  x.w.add_u32(x.key("context_length"), uint32_t(c.max_position_embeddings));
  x.w.add_u32(x.key("embedding_length"), uint32_t(c.hidden_size));
  x.w.add_u32(x.key("block_count"), uint32_t(c.num_hidden_layers));
  x.w.add_u32(x.key("feed_forward_length"), uint32_t(c.intermediate_size));
  x.w.add_u32(x.key("attention.head_count"), uint32_t(c.num_attention_heads));
  x.w.add_u32(x.key("attention.head_count_kv"), uint32_t(c.num_key_value_heads));
  x.w.add_u32(x.key("attention.key_length"), uint32_t(c.head_dim));
  x.w.add_u32(x.key("attention.value_length"), uint32_t(c.head_dim));
  x.w.add_f32(x.key("attention.layer_norm_rms_epsilon"), float(c.rms_norm_eps));
  x.w.add_u32(x.key("rope.dimension_count"), uint32_t(c.head_dim));
  x.w.add_f32(x.key("rope.freq_base"), float(c.rope_theta));
  if (c.sliding_window)
    x.notes.push_back(cat(x.cfg_src, ": sliding_window ", c.sliding_window, " is not in the "
                          "GGUF (llama.cpp's ", x.arch, " attends over the whole context); "
                          "prompts up to that length behave the same"));
}

// The rope_freqs tensor of Llama 3 scaling: per frequency, the divisor llama.cpp applies to
// the unscaled frequency, i.e. default_inv_freq / scaled_inv_freq.
std::vector<float> rope_freq_factors(const ModelConfig& c) {
  ModelConfig plain = c;
  plain.rope_scaling = RopeScaling{};
  const std::vector<float> base = rope_inv_freq(plain), scaled = rope_inv_freq(c);
  std::vector<float> f(base.size());
  for (size_t i = 0; i < f.size(); ++i) f[i] = base[i] / scaled[i];
  return f;
}

void add_rope_scaling(Context& x) {
  const RopeScaling& r = x.c.rope_scaling;
  using T = RopeScaling::Type;
  if (r.type == T::linear) {
    x.w.add_string(x.key("rope.scaling.type"), "linear");
    x.w.add_f32(x.key("rope.scaling.factor"), float(r.factor));
  } else if (r.type == T::yarn) {
    SF_REQUIRE(!r.attention_factor && !r.mscale && !r.mscale_all_dim && r.truncate.value_or(true),
               x.cfg_src, ": yarn RoPE with attention_factor, mscale, mscale_all_dim or "
               "truncate false has no GGUF form llama.cpp reads the same way; export needs "
               "plain yarn (factor, original_max_position_embeddings, beta_fast, beta_slow)");
    x.w.add_string(x.key("rope.scaling.type"), "yarn");
    x.w.add_f32(x.key("rope.scaling.factor"), float(r.factor));
    x.w.add_u32(x.key("rope.scaling.original_context_length"),
                uint32_t(r.original_max_position_embeddings));
    if (r.beta_fast) x.w.add_f32(x.key("rope.scaling.yarn_beta_fast"), float(*r.beta_fast));
    if (r.beta_slow) x.w.add_f32(x.key("rope.scaling.yarn_beta_slow"), float(*r.beta_slow));
  } else if (r.type == T::llama3) {
    const std::vector<float> f = rope_freq_factors(x.c);
    x.w.add_tensor("rope_freqs.weight", {int64_t(f.size())}, ggml_type::F32,
                   [f](uint8_t* dst) { gguf_encode(f.data(), ggml_type::F32, dst, int64_t(f.size())); });
  } else if (r.type == T::dynamic) {
    x.notes.push_back(cat(x.cfg_src, ": dynamic RoPE scaling is not in the GGUF; up to "
                          "max_position_embeddings (", x.c.max_position_embeddings,
                          ") it computes the same positions"));
  }
}

// q_proj / k_proj of a llama-architecture model: rows permuted for llama.cpp's RoPE.
int64_t permute_heads(const Context& x, const std::string& hf) {
  if (x.arch != "llama") return 0;
  if (hf.find(".self_attn.q_proj.") != std::string::npos) return x.c.num_attention_heads;
  if (hf.find(".self_attn.k_proj.") != std::string::npos) return x.c.num_key_value_heads;
  return 0;
}

void add_weight(Context& x, const SafetensorsModel& st, const std::string& hf,
                const std::vector<int64_t>& shape, GgufExportType type) {
  auto gname = gguf_name_for_hf(hf);
  SF_CHECK(gname.has_value(), "no GGUF name for ", hf);
  const std::vector<int64_t> dims(shape.rbegin(), shape.rend());
  uint32_t t = shape.size() == 1 ? ggml_type::F32 : matrix_type(type);
  if (t == ggml_type::Q8_0 && dims[0] % 32 != 0) {
    t = ggml_type::F16;
    x.notes.push_back(cat(hf, ": rows of ", dims[0], " are not whole Q8_0 blocks of 32; "
                          "written as F16"));
  }
  const int64_t heads = permute_heads(x, hf);
  const int64_t numel = dims.size() == 1 ? dims[0] : dims[0] * dims[1];
  const int64_t rows = shape[0], cols = shape.size() > 1 ? shape[1] : 1;
  x.w.add_tensor(*gname, dims, t, [&st, hf, t, numel, heads, rows, cols](uint8_t* dst) {
    std::vector<float> v(static_cast<size_t>(numel));
    st.read_f32(hf, v.data());
    if (heads > 0) {
      std::vector<float> p(v.size());
      permute_qk_rows(v.data(), p.data(), rows, cols, heads);
      v.swap(p);
    }
    gguf_encode(v.data(), t, dst, numel);
  });
}

// Every tensor the config describes must be in the files with its shape (as a load checks).
void add_weights(Context& x, const SafetensorsModel& st, GgufExportType type) {
  const ModelLayout layout = ModelLayout::build(x.c);
  for (const std::string& hf : layout.hf_names()) {
    const auto loc = layout.find_hf(hf);
    SF_CHECK(loc.has_value(), "layout lacks its own tensor ", hf);
    const std::vector<int64_t>& shape = loc->part->hf_shape;
    const auto e = st.find(hf);
    SF_REQUIRE(e.has_value(), st.dir().string(), ": tensor \"", hf, "\" is missing; the "
               "weights do not match config.json");
    SF_REQUIRE(e->info->shape == shape, st.dir().string(), ": tensor \"", hf, "\" has shape ",
               shape_str(e->info->shape), " but config.json gives ", shape_str(shape));
    add_weight(x, st, hf, shape, type);
  }
}

std::string model_name(const ModelConfig& c, const fs::path& dir) {
  const std::string n = c.extra.value("_name_or_path", std::string());
  if (!n.empty()) return n;
  fs::path p = fs::weakly_canonical(dir);
  return p.filename().empty() ? p.parent_path().filename().string() : p.filename().string();
}

}  // namespace

GgufExportType parse_gguf_export_type(const std::string& s, const std::string& flag) {
  if (s == "f16") return GgufExportType::f16;
  if (s == "bf16") return GgufExportType::bf16;
  if (s == "q8_0") return GgufExportType::q8_0;
  SF_FAIL(input, flag, " \"", s, "\" is unknown; use f16, bf16 or q8_0");
}

GgufExportResult export_gguf(const fs::path& dir, const fs::path& out, GgufExportType type) {
  const fs::path cfg_path = dir / "config.json";
  SF_REQUIRE(fs::exists(cfg_path), dir.string(),
             ": no config.json here; --model must be a Hugging Face model directory");
  const ModelConfig c = load_config(cfg_path);
  GgufExportResult r;
  GgufWriter w;
  Context x{c, gguf_arch(c), cfg_path.string(), w, r.notes};
  r.architecture = x.arch;
  w.add_string("general.architecture", x.arch);
  w.add_string("general.type", "model");
  w.add_string("general.name", model_name(c, dir));
  w.add_u32("general.file_type", file_type_id(type));
  w.add_u32("general.quantization_version", 2);
  add_shape(x);
  const GgufVocabInfo vocab = add_gguf_vocab(w, dir, c.vocab_size);
  r.tokenizer_model = vocab.model;
  r.pre_tokenizer = vocab.pre;
  r.notes.insert(r.notes.end(), vocab.notes.begin(), vocab.notes.end());
  add_rope_scaling(x);
  const SafetensorsModel st(dir);
  add_weights(x, st, type);
  r.tensors = int64_t(w.tensor_count());
  r.bytes = w.write(out);
  return r;
}

}  // namespace sf
