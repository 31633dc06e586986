#include "model/weights_io.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "core/error.h"

namespace sf {

namespace fs = std::filesystem;

namespace {

// Lists up to `max` names, then how many more.
std::string list_names(const std::vector<std::string>& names, size_t max = 5) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < max; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > max) s += cat(", ... (", names.size() - max, " more)");
  return s;
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void check_layout(const ModelConfig& c, const ModelLayout& layout, size_t n_ptrs) {
  SF_CHECK(layout.n_layers == int(c.num_hidden_layers) && layout.tied == c.tie_word_embeddings,
           "layout was not built from this config");
  SF_CHECK(n_ptrs == layout.units.size(), "got ", n_ptrs, " unit buffers for ",
           layout.units.size(), " units");
}

}  // namespace

WeightsLoadInfo load_model_weights(const fs::path& dir, const ModelConfig& c,
                                   const ModelLayout& layout,
                                   const std::vector<float*>& unit_ptrs) {
  check_layout(c, layout, unit_ptrs.size());
  return load_model_weights(dir, c, layout, [&](size_t u) { return unit_ptrs[u]; },
                            [](size_t) {});
}

WeightsLoadInfo load_model_weights(const fs::path& dir, const ModelConfig& c,
                                   const ModelLayout& layout,
                                   const std::function<float*(size_t unit)>& buffer,
                                   const std::function<void(size_t unit)>& done) {
  check_layout(c, layout, layout.units.size());
  const std::string d = dir.string();
  SafetensorsModel model(dir);
  WeightsLoadInfo info;
  info.sharded = model.sharded();
  info.notes = model.notes();
  const std::string hint = cat(" (", d, "/config.json may not match these weights: it says ",
                               arch_name(c.arch), ", hidden_size ", c.hidden_size,
                               ", intermediate_size ", c.intermediate_size, ", ",
                               c.num_hidden_layers, " layers, ", c.num_attention_heads, "/",
                               c.num_key_value_heads, " heads of ", c.head_dim, ", vocab ",
                               c.vocab_size, ", tie_word_embeddings ",
                               c.tie_word_embeddings ? "true" : "false", ")");

  // 1. Names: everything expected present, nothing unexpected.
  std::vector<std::string> expected = layout.hf_names();
  std::set<std::string> expected_set(expected.begin(), expected.end());
  std::vector<std::string> missing, unexpected;
  for (auto& n : expected)
    if (!model.find(n)) missing.push_back(n);
  for (auto& n : model.names()) {
    if (expected_set.count(n)) continue;
    if ((layout.tied && n == "lm_head.weight") || ends_with(n, "rotary_emb.inv_freq")) {
      info.ignored.push_back(n);
      continue;
    }
    unexpected.push_back(n);
  }
  if (!missing.empty()) {
    bool only_head = missing.size() == 1 && missing[0] == "lm_head.weight";
    SF_FAIL(input, d, ": ", missing.size(), " of the ", expected.size(),
            " tensors the config expects are missing: ", list_names(missing),
            only_head ? "; if this model ties its embeddings, set \"tie_word_embeddings\": "
                        "true in config.json"
                      : hint);
  }
  if (!unexpected.empty())
    SF_FAIL(input, d, ": ", unexpected.size(),
            " tensors in the checkpoint are not part of the model the config describes: ",
            list_names(unexpected), hint);

  // 2. Shapes and dtypes, all before any buffer is touched.
  for (auto& u : layout.units)
    for (auto& s : u.params)
      for (auto& part : s.parts) {
        auto e = model.get(part.hf_name);
        const std::string file = e.file->path().filename().string();
        SF_REQUIRE(e.info->shape == part.hf_shape, d, "/", file, ": tensor \"", part.hf_name,
                   "\" has shape ", shape_str(e.info->shape), " but the config expects ",
                   shape_str(part.hf_shape), hint);
        SF_REQUIRE(st_weight_dtype(e.info->dtype), d, "/", file, ": tensor \"", part.hf_name,
                   "\" has dtype ", st_dtype_name(e.info->dtype),
                   "; weights must be BF16, F16 or F32 (quantized checkpoints are not "
                   "supported)");
        SF_CHECK(e.info->numel == part.numel, "part numel disagrees with its shape");
      }

  // 3. Fill: padding zero, parts from the files.
  for (size_t ui = 0; ui < layout.units.size(); ++ui) {
    const Unit& u = layout.units[ui];
    float* base = buffer(ui);
    SF_CHECK(base || u.numel == 0, "unit ", ui, " has no buffer");
    u.zero_padding(base);  // parts tile each slot; what lies between them is zero
    for (auto& s : u.params)
      for (auto& part : s.parts) {
        auto e = model.get(part.hf_name);
        e.file->read_f32(*e.info, base + part.offset);
        info.tensors += 1;
        info.bytes += e.info->bytes();
      }
    done(ui);
  }
  return info;
}

std::vector<fs::path> save_model_weights(const fs::path& dir, const ModelConfig& c,
                                         const ModelLayout& layout,
                                         const std::vector<const float*>& unit_ptrs,
                                         DType out_dtype, uint64_t max_shard_bytes) {
  check_layout(c, layout, unit_ptrs.size());
  SF_REQUIRE(out_dtype == DType::bf16 || out_dtype == DType::f16 || out_dtype == DType::f32,
             dir.string(), ": weights can be saved as bf16, f16 or f32, not ",
             dtype_name(out_dtype));
  std::vector<TensorWrite> tensors;
  for (size_t ui = 0; ui < layout.units.size(); ++ui)
    for (auto& s : layout.units[ui].params)
      for (auto& part : s.parts) {
        SF_CHECK(unit_ptrs[ui], "unit ", ui, " has no buffer");
        tensors.push_back({part.hf_name, out_dtype, part.hf_shape, unit_ptrs[ui] + part.offset,
                           nullptr});
      }
  return write_safetensors_model(dir, tensors, max_shard_bytes);
}

std::vector<fs::path> save_model_weights_bf16(const fs::path& dir, const ModelConfig& c,
                                              const ModelLayout& layout,
                                              const std::vector<const uint16_t*>& unit_bf16,
                                              uint64_t max_shard_bytes) {
  check_layout(c, layout, unit_bf16.size());
  std::vector<TensorWrite> tensors;
  for (size_t ui = 0; ui < layout.units.size(); ++ui)
    for (auto& s : layout.units[ui].params)
      for (auto& part : s.parts) {
        SF_CHECK(unit_bf16[ui], "unit ", ui, " has no buffer");
        tensors.push_back({part.hf_name, DType::bf16, part.hf_shape, nullptr,
                           unit_bf16[ui] + part.offset});
      }
  return write_safetensors_model(dir, tensors, max_shard_bytes);
}

std::vector<fs::path> save_model_weights(const fs::path& dir, const ModelConfig& c,
                                         const ModelLayout& layout,
                                         const std::vector<float*>& unit_ptrs,
                                         DType out_dtype, uint64_t max_shard_bytes) {
  std::vector<const float*> p(unit_ptrs.begin(), unit_ptrs.end());
  return save_model_weights(dir, c, layout, p, out_dtype, max_shard_bytes);
}

}  // namespace sf
