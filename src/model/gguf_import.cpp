#include "model/gguf_import.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <unordered_map>

#include "core/error.h"

namespace sf {

namespace fs = std::filesystem;

namespace {

struct Leaf {
  const char* gguf;
  const char* hf;
};
// blk.N.<gguf>.{weight,bias} -> model.layers.N.<hf>.{weight,bias}
constexpr Leaf kLayerLeaves[] = {
    {"attn_norm", "input_layernorm"},   {"attn_q", "self_attn.q_proj"},
    {"attn_k", "self_attn.k_proj"},     {"attn_v", "self_attn.v_proj"},
    {"attn_output", "self_attn.o_proj"}, {"ffn_norm", "post_attention_layernorm"},
    {"ffn_gate", "mlp.gate_proj"},      {"ffn_up", "mlp.up_proj"},
    {"ffn_down", "mlp.down_proj"},      {"attn_q_norm", "self_attn.q_norm"},
    {"attn_k_norm", "self_attn.k_norm"},
};

std::string list_names(const std::vector<std::string>& names, size_t max = 5) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < max; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > max) s += cat(", ... (", names.size() - max, " more)");
  return s;
}

}  // namespace

std::optional<std::string> gguf_llama_hf_name(std::string_view n) {
  if (n == "token_embd.weight") return "model.embed_tokens.weight";
  if (n == "output_norm.weight") return "model.norm.weight";
  if (n == "output.weight") return "lm_head.weight";
  constexpr std::string_view blk = "blk.";
  if (n.substr(0, blk.size()) != blk) return std::nullopt;
  n.remove_prefix(blk.size());
  size_t digits = 0;
  while (digits < n.size() && std::isdigit(static_cast<unsigned char>(n[digits]))) ++digits;
  // A layer index as llama.cpp writes it: decimal, no leading zeros, then ".".
  if (digits == 0 || digits > 6 || (digits > 1 && n[0] == '0') || digits >= n.size() ||
      n[digits] != '.')
    return std::nullopt;
  const std::string_view layer = n.substr(0, digits);
  std::string_view rest = n.substr(digits + 1);
  const size_t dot = rest.rfind('.');
  if (dot == std::string_view::npos) return std::nullopt;
  const std::string_view leaf = rest.substr(0, dot), suffix = rest.substr(dot + 1);
  if (suffix != "weight" && suffix != "bias") return std::nullopt;
  for (auto& l : kLayerLeaves)
    if (leaf == l.gguf) return cat("model.layers.", layer, ".", l.hf, ".", suffix);
  return std::nullopt;
}

std::optional<std::string> gguf_name_for_hf(std::string_view n) {
  if (n == "model.embed_tokens.weight") return "token_embd.weight";
  if (n == "model.norm.weight") return "output_norm.weight";
  if (n == "lm_head.weight") return "output.weight";
  constexpr std::string_view layers = "model.layers.";
  if (n.substr(0, layers.size()) != layers) return std::nullopt;
  n.remove_prefix(layers.size());
  const size_t dot = n.find('.'), last = n.rfind('.');
  if (dot == std::string_view::npos || last <= dot) return std::nullopt;
  const std::string_view layer = n.substr(0, dot), leaf = n.substr(dot + 1, last - dot - 1);
  const std::string_view suffix = n.substr(last + 1);
  if (layer.empty() || !std::all_of(layer.begin(), layer.end(), [](char ch) {
        return std::isdigit(static_cast<unsigned char>(ch));
      }))
    return std::nullopt;
  if (suffix != "weight" && suffix != "bias") return std::nullopt;
  for (auto& l : kLayerLeaves)
    if (leaf == l.hf) return cat("blk.", layer, ".", l.gguf, ".", suffix);
  return std::nullopt;
}

void permute_qk_rows(const float* src, float* dst, int64_t rows, int64_t cols,
                     int64_t n_heads) {
  SF_CHECK(n_heads > 0 && rows % (2 * n_heads) == 0, "q/k rows ", rows,
           " are not a whole number of heads of even size (", n_heads, " heads)");
  const int64_t D = rows / n_heads, half = D / 2;
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t i = 0; i < half; ++i) {
        const float* s = src + (h * D + j * half + i) * cols;
        std::copy(s, s + cols, dst + (h * D + 2 * i + j) * cols);
      }
}

void unpermute_qk_rows(const float* src, float* dst, int64_t rows, int64_t cols,
                       int64_t n_heads) {
  SF_CHECK(n_heads > 0 && rows % (2 * n_heads) == 0, "q/k rows ", rows,
           " are not a whole number of heads of even size (", n_heads, " heads)");
  const int64_t D = rows / n_heads, half = D / 2;
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t i = 0; i < half; ++i) {
        const float* s = src + (h * D + 2 * i + j) * cols;
        std::copy(s, s + cols, dst + (h * D + j * half + i) * cols);
      }
}

WeightsLoadInfo load_gguf_weights(const fs::path& path, const ModelConfig& c,
                                  const ModelLayout& layout,
                                  const std::vector<float*>& unit_ptrs) {
  SF_CHECK(layout.n_layers == int(c.num_hidden_layers) && layout.tied == c.tie_word_embeddings,
           "layout was not built from this config");
  SF_CHECK(unit_ptrs.size() == layout.units.size(), "got ", unit_ptrs.size(),
           " unit buffers for ", layout.units.size(), " units");
  const std::string src = path.string();
  GgufFile file(path);
  const GgufView& g = file.view();
  WeightsLoadInfo info;

  // 1. The architecture and the sizes the weights depend on.
  const GgufValue* arch = g.find("general.architecture");
  SF_REQUIRE(arch && arch->is_string(), src,
             ": has no string \"general.architecture\"; not a model GGUF file");
  const std::string& a = arch->as_string("general.architecture");
  SF_REQUIRE(a == "llama", src, ": general.architecture is \"", a,
             "\"; only llama-architecture GGUF files (Llama, Mistral, SmolLM, ...) can be "
             "imported");
  SF_REQUIRE(c.arch == Arch::llama || c.arch == Arch::mistral, src,
             ": a llama GGUF cannot hold a ", arch_name(c.arch), " model (the config says \"",
             arch_name(c.arch), "\")");
  const std::string hint = " (config.json and the GGUF describe different models)";
  auto check_size = [&](const char* key, int64_t want, const char* field) {
    const GgufValue* v = g.find(key);
    if (!v) return;
    const int64_t got = v->as_int(key);
    SF_REQUIRE(got == want, src, ": metadata \"", key, "\" is ", got, " but the config's ",
               field, " is ", want, hint);
  };
  check_size("llama.block_count", c.num_hidden_layers, "num_hidden_layers");
  check_size("llama.embedding_length", c.hidden_size, "hidden_size");
  check_size("llama.feed_forward_length", c.intermediate_size, "intermediate_size");
  check_size("llama.vocab_size", c.vocab_size, "vocab_size");
  check_size("llama.attention.key_length", c.head_dim, "head_dim");
  check_size("llama.attention.value_length", c.head_dim, "head_dim");
  // The Q/K un-permutation depends on the head counts: they must agree.
  check_size("llama.attention.head_count", c.num_attention_heads, "num_attention_heads");
  if (g.find("llama.attention.head_count_kv"))
    check_size("llama.attention.head_count_kv", c.num_key_value_heads, "num_key_value_heads");
  else if (const GgufValue* h = g.find("llama.attention.head_count"))
    SF_REQUIRE(h->as_int("llama.attention.head_count") == c.num_key_value_heads, src,
               ": has no \"llama.attention.head_count_kv\" (so as many kv heads as heads, ",
               h->as_int("llama.attention.head_count"), ") but the config's "
               "num_key_value_heads is ", c.num_key_value_heads, hint);
  auto note_number = [&](const char* key, double want, const char* field) {
    const GgufValue* v = g.find(key);
    if (!v || !v->is_number()) return;
    const double got = v->as_double(key);
    // GGUF stores these as float32: compare at that precision.
    if (float(got) != float(want))
      info.notes.push_back(cat(src, ": metadata \"", key, "\" is ", got, " but the config's ",
                               field, " is ", want, "; the config is what runs"));
  };
  note_number("llama.rope.freq_base", c.rope_theta, "rope_theta");
  note_number("llama.attention.layer_norm_rms_epsilon", c.rms_norm_eps, "rms_norm_eps");
  note_number("llama.rope.dimension_count", double(c.head_dim), "head_dim");
  note_number("llama.context_length", double(c.max_position_embeddings),
              "max_position_embeddings");

  // 2. Names: everything expected present, nothing unexpected.
  std::unordered_map<std::string, const GgufTensorInfo*> by_hf;
  std::vector<std::string> unexpected;
  const std::vector<std::string> expected = layout.hf_names();
  const std::set<std::string> expected_set(expected.begin(), expected.end());
  for (auto& t : g.tensors()) {
    auto hf = gguf_llama_hf_name(t.name);
    if (hf && *hf == "lm_head.weight" && layout.tied) {
      info.ignored.push_back(t.name);
      continue;
    }
    if (!hf && t.name == "rope_freqs.weight") {
      info.ignored.push_back(t.name);
      continue;
    }
    if (!hf || !expected_set.count(*hf)) {
      unexpected.push_back(hf ? cat(t.name, " (", *hf, ")") : t.name);
      continue;
    }
    by_hf[*hf] = &t;
  }
  std::vector<std::string> missing;
  for (auto& n : expected)
    if (!by_hf.count(n)) missing.push_back(n);
  if (!missing.empty()) {
    const bool only_head = missing.size() == 1 && missing[0] == "lm_head.weight";
    SF_FAIL(input, src, ": ", missing.size(), " of the ", expected.size(),
            " tensors the config expects are missing: ", list_names(missing),
            only_head ? "; the GGUF has no output.weight, so the model ties its embeddings: "
                        "set \"tie_word_embeddings\": true in config.json"
                      : hint);
  }
  if (!unexpected.empty())
    SF_FAIL(input, src, ": ", unexpected.size(),
            " tensors in the GGUF are not part of the model the config describes: ",
            list_names(unexpected), hint);

  // 3. Shapes and types, all before any buffer is touched.
  for (auto& u : layout.units)
    for (auto& s : u.params)
      for (auto& part : s.parts) {
        const GgufTensorInfo& t = *by_hf.at(part.hf_name);
        SF_REQUIRE(t.shape() == part.hf_shape, src, ": tensor \"", t.name, "\" (",
                   part.hf_name, ") has shape ", shape_str(t.shape()), " (GGUF dims ",
                   shape_str(t.dims), ") but the config expects ", shape_str(part.hf_shape),
                   hint);
        SF_REQUIRE(gguf_can_read_f32(t.type), src, ": tensor \"", t.name, "\" has type ",
                   gguf_tensor_type_name(t.type),
                   "; only F32, F16, BF16, Q8_0 and Q4_1 tensors can be imported");
        SF_CHECK(t.numel == part.numel, "part numel disagrees with its shape");
      }

  // 4. Fill: padding zero, parts from the file (q/k through a scratch for the row order).
  std::vector<float> scratch;
  for (size_t ui = 0; ui < layout.units.size(); ++ui) {
    const Unit& u = layout.units[ui];
    float* base = unit_ptrs[ui];
    SF_CHECK(base || u.numel == 0, "unit ", ui, " has no buffer");
    u.zero_padding(base);
    for (auto& s : u.params)
      for (auto& part : s.parts) {
        const GgufTensorInfo& t = *by_hf.at(part.hf_name);
        const bool is_q = t.name.find(".attn_q.") != std::string::npos;
        const bool is_k = t.name.find(".attn_k.") != std::string::npos;
        if (is_q || is_k) {
          const int64_t rows = part.hf_shape[0];
          const int64_t cols = part.hf_shape.size() > 1 ? part.hf_shape[1] : 1;
          scratch.resize(size_t(t.numel));
          g.read_f32(t, scratch.data());
          unpermute_qk_rows(scratch.data(), base + part.offset, rows, cols,
                            is_q ? c.num_attention_heads : c.num_key_value_heads);
        } else {
          g.read_f32(t, base + part.offset);
        }
        info.tensors += 1;
        info.bytes += t.bytes;
      }
  }
  return info;
}

}  // namespace sf
