// GGUF export (export/gguf_export.h) read back with our reader (io/gguf.h): the writer's
// format, Q8_0 within its block error, llama.cpp's names and Q/K permutation (through the
// importer, which undoes it), Qwen's norms and biases, the tokenizer metadata, and the file
// gguf-py reads (tests/data/export/vectors.json, made by scripts/gen_gguf_export_vectors.py).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "export/generation_config.h"
#include "export/gguf_export.h"
#include "export/gguf_vocab.h"
#include "io/gguf.h"
#include "io/gguf_writer.h"
#include "model/gguf_import.h"
#include "model/weights_io.h"
#include "text/tokenizer.h"
#include "train/train_test_util.h"

namespace sf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::TempDir;

constexpr const char* kChatml =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

// A byte-level BPE tokenizer of 11 tokens (ids 0..10) with merges, an added special token
// and a ChatML template, small enough for tiny_config's vocabulary of 53.
void write_small_tokenizer(const fs::path& dir) {
  json tj = {
      {"version", "1.0"},
      {"added_tokens", json::array({{{"id", 10}, {"content", "<|im_end|>"}, {"single_word", false},
                                     {"lstrip", false}, {"rstrip", false}, {"normalized", false},
                                     {"special", true}}})},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false},
                         {"trim_offsets", true}, {"use_regex", true}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true},
                   {"use_regex", true}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr},
                 {"continuing_subword_prefix", nullptr}, {"end_of_word_suffix", nullptr},
                 {"fuse_unk", false}, {"byte_fallback", false},
                 {"vocab", {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"abc", 4}, {"\xc4\xa0", 5},
                            {"\xc4\xa0" "a", 6}, {"d", 7}, {"e", 8}, {"f", 9}}},
                 {"merges", json::array({"a b", "ab c", "\xc4\xa0 a"})}}}};
  write_file_atomic(dir / "tokenizer.json", tj.dump());
  json cfg = {{"bos_token", nullptr}, {"eos_token", "<|im_end|>"}, {"chat_template", kChatml}};
  write_file_atomic(dir / "tokenizer_config.json", cfg.dump());
}

fs::path small_model(const fs::path& dir, Arch arch) {
  test::make_tiny_model(dir, arch);
  write_small_tokenizer(dir);
  return dir;
}

std::vector<std::vector<float>> load_units(const ModelConfig& c, const ModelLayout& l,
                                           const fs::path& src, bool gguf) {
  std::vector<std::vector<float>> u;
  std::vector<float*> p;
  for (auto& unit : l.units) u.emplace_back(size_t(unit.numel));
  for (auto& v : u) p.push_back(v.data());
  if (gguf) load_gguf_weights(src, c, l, p);
  else load_model_weights(src, c, l, p);
  return u;
}

TEST(GgufWriter, MetadataAndTensorsReadBack) {
  TempDir t("gguf-w");
  GgufWriter w;
  w.add_u32("a.u32", 7);
  w.add_i32("a.i32", -3);
  w.add_f32("a.f32", 0.25f);
  w.add_bool("a.bool", true);
  w.add_string("a.str", "héllo");
  w.add_strings("a.strs", {"x", "", "yz"});
  w.add_i32s("a.i32s", {1, -2, 3});
  w.add_f32s("a.f32s", {1.5f, -2.5f});
  const std::vector<float> m = test::random_vec(3 * 64, 1);
  w.add_tensor("m", {64, 3}, ggml_type::F16, [&](uint8_t* d) { gguf_encode(m.data(), ggml_type::F16, d, 192); });
  w.add_tensor("v", {5}, ggml_type::F32, [&](uint8_t* d) { gguf_encode(m.data(), ggml_type::F32, d, 5); });
  w.add_tensor("b", {64, 3}, ggml_type::BF16, [&](uint8_t* d) { gguf_encode(m.data(), ggml_type::BF16, d, 192); });
  EXPECT_THROW(w.add_u32("a.u32", 1), Error);
  EXPECT_THROW(w.add_tensor("q", {33}, ggml_type::Q8_0, {}), Error);  // not whole blocks
  const uint64_t size = w.write(t.path / "x.gguf");
  EXPECT_EQ(size, fs::file_size(t.path / "x.gguf"));
  GgufFile f(t.path / "x.gguf");
  const GgufView& g = f.view();
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.get("a.u32").as_int("k"), 7);
  EXPECT_EQ(g.get("a.u32").type(), GgufType::u32);
  EXPECT_EQ(g.get("a.i32").as_int("k"), -3);
  EXPECT_EQ(g.get("a.f32").as_double("k"), 0.25);
  EXPECT_TRUE(g.get("a.bool").as_bool("k"));
  EXPECT_EQ(g.get("a.str").as_string("k"), "héllo");
  ASSERT_EQ(g.get("a.strs").size(), 3u);
  EXPECT_EQ(g.get("a.strs").string_at(2, "k"), "yz");
  EXPECT_EQ(g.get("a.i32s").int_at(1, "k"), -2);
  EXPECT_EQ(g.get("a.f32s").double_at(1, "k"), -2.5);
  ASSERT_EQ(g.tensors().size(), 3u);
  EXPECT_EQ(g.get_tensor("m").shape(), (std::vector<int64_t>{3, 64}));
  const auto mf = g.read_f32("m"), vf = g.read_f32("v"), bf = g.read_f32("b");
  for (size_t i = 0; i < 192; ++i) {
    EXPECT_EQ(mf[i], f16_to_f32(f32_to_f16(m[i])));  // exact: one rounding to nearest even
    EXPECT_EQ(bf[i], round_bf16(m[i]));
  }
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(vf[i], m[i]);
  for (auto& ti : g.tensors()) EXPECT_EQ((g.data_offset() + ti.offset) % 32, 0u) << ti.name;
}

// Q8_0: every value within half a quantization step (d/2) of the input, plus what rounding
// d to f16 moves the grid (|q| <= 127 steps of at most half an f16 ulp of d each).
TEST(GgufWriter, Q8_0WithinItsBlockError) {
  std::vector<float> x = test::random_vec(32 * 40, 2, -3.f, 3.f);
  for (int j = 0; j < 32; ++j) x[32 + size_t(j)] = 0;  // an all-zero block: d = 0
  x[70] = 1e-30f;                                      // a tiny value beside large ones
  std::vector<uint8_t> q(40 * 34);
  gguf_encode(x.data(), ggml_type::Q8_0, q.data(), int64_t(x.size()));
  std::vector<float> y(x.size());
  gguf_dequantize(q.data(), ggml_type::Q8_0, y.data(), int64_t(x.size()), "test");
  for (size_t b = 0; b < 40; ++b) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + size_t(j)]));
    const float d = amax / 127;
    const float bound = d / 2 + 127 * std::fabs(f16_to_f32(f32_to_f16(d)) - d) + 1e-7f;
    for (int j = 0; j < 32; ++j)
      EXPECT_LE(std::fabs(y[b * 32 + size_t(j)] - x[b * 32 + size_t(j)]), bound)
          << "block " << b << " element " << j;
  }
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[32 + size_t(j)], 0.f);
}

TEST(GgufNames, PermuteIsTheInverseOfUnpermuteAndNamesRoundTrip) {
  const int64_t heads = 3, D = 8, cols = 5;
  const std::vector<float> x = test::random_vec(size_t(heads * D * cols), 3);
  std::vector<float> p(x.size()), back(x.size());
  permute_qk_rows(x.data(), p.data(), heads * D, cols, heads);
  unpermute_qk_rows(p.data(), back.data(), heads * D, cols, heads);
  EXPECT_EQ(back, x);
  EXPECT_NE(p, x);
  // Row h*D + 2i + j of the GGUF is HF row h*D + j*D/2 + i.
  EXPECT_EQ(p[size_t((1 * D + 2 * 1 + 1) * cols)], x[size_t((1 * D + 4 + 1) * cols)]);
  for (std::string hf : {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
                         "model.layers.12.self_attn.q_proj.weight",
                         "model.layers.0.self_attn.k_proj.bias",
                         "model.layers.3.mlp.down_proj.weight",
                         "model.layers.1.self_attn.q_norm.weight"}) {
    auto g = gguf_name_for_hf(hf);
    ASSERT_TRUE(g.has_value()) << hf;
    EXPECT_EQ(gguf_llama_hf_name(*g), hf);
  }
  EXPECT_EQ(*gguf_name_for_hf("model.layers.1.self_attn.k_norm.weight"), "blk.1.attn_k_norm.weight");
  EXPECT_FALSE(gguf_name_for_hf("model.layers.x.mlp.up_proj.weight"));
}

// Llama and Mistral: the GGUF, imported back (importer: names, shapes, metadata, un-permuted
// Q/K), equals the HF weights: exactly in BF16 (the source is f32 rounded to bf16 each way),
// f16-rounded in F16, within Q8_0's block error.
TEST(GgufExport, LlamaAndMistralReadBackThroughTheImporter) {
  for (Arch arch : {Arch::llama, Arch::mistral}) {
    TempDir t("gguf-llama");
    const fs::path dir = small_model(t.path / "m", arch);
    const ModelConfig c = load_config(dir / "config.json");
    const ModelLayout l = ModelLayout::build(c);
    const auto hf = load_units(c, l, dir, false);
    for (auto type : {GgufExportType::bf16, GgufExportType::f16, GgufExportType::q8_0}) {
      const fs::path out = t.path / "m.gguf";
      const GgufExportResult r = export_gguf(dir, out, type);
      EXPECT_EQ(r.architecture, "llama");
      const auto g = load_units(c, l, out, true);
      for (size_t u = 0; u < hf.size(); ++u) {
        // Q8_0: within one quantization step of the unit's largest block (twice its bound).
        float amax = 0;
        for (float w : hf[u]) amax = std::max(amax, std::fabs(w));
        const float q8_tol = type == GgufExportType::q8_0 ? amax / 127 : 0.f;
        for (size_t i = 0; i < hf[u].size(); ++i) {
          const float w = hf[u][i];
          const float want = type == GgufExportType::bf16  ? round_bf16(w)
                             : type == GgufExportType::f16 ? f16_to_f32(f32_to_f16(w))
                                                           : w;
          ASSERT_NEAR(g[u][i], want, q8_tol) << "unit " << u << " element " << i;
        }
      }
      GgufFile f(out);
      EXPECT_EQ(f.view().get_tensor("blk.0.attn_q.weight").type,
                type == GgufExportType::q8_0 ? ggml_type::Q8_0
                : type == GgufExportType::f16 ? ggml_type::F16 : ggml_type::BF16);
      EXPECT_EQ(f.view().get_tensor("blk.0.attn_norm.weight").type, ggml_type::F32);
      EXPECT_EQ(f.view().find_tensor("output.weight") != nullptr, !c.tie_word_embeddings);
    }
  }
}

// Qwen2 (q/k/v biases) and Qwen3 (q/k norms): llama.cpp's names, F32 vectors, no permutation.
TEST(GgufExport, QwenNamesBiasesAndNormsUnpermuted) {
  for (Arch arch : {Arch::qwen2, Arch::qwen3}) {
    TempDir t("gguf-qwen");
    const fs::path dir = small_model(t.path / "m", arch);
    const ModelConfig c = load_config(dir / "config.json");
    const fs::path out = t.path / "m.gguf";
    EXPECT_EQ(export_gguf(dir, out, GgufExportType::f16).architecture, arch_name(arch));
    GgufFile f(out);
    const GgufView& g = f.view();
    const SafetensorsModel st(dir);
    std::set<std::string> names;
    for (auto& ti : g.tensors()) names.insert(ti.name);
    EXPECT_EQ(names.size(), st.size() - (st.find("lm_head.weight") && c.tie_word_embeddings));
    for (const std::string& hf : st.names()) {
      auto gname = gguf_name_for_hf(hf);
      ASSERT_TRUE(gname && names.count(*gname)) << hf;
      const GgufTensorInfo& ti = g.get_tensor(*gname);
      EXPECT_EQ(ti.shape(), st.get(hf).info->shape) << hf;
      EXPECT_EQ(ti.type, ti.dims.size() == 1 ? ggml_type::F32 : ggml_type::F16) << hf;
      std::vector<float> want(size_t(ti.numel));
      st.read_f32(hf, want.data());
      const std::vector<float> got = g.read_f32(*gname);
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(got[i], ti.dims.size() == 1 ? want[i] : f16_to_f32(f32_to_f16(want[i])))
            << hf << " " << i;
    }
    EXPECT_EQ(names.count("blk.0.attn_q.bias"), arch == Arch::qwen2 ? 1u : 0u);
    EXPECT_EQ(names.count("blk.1.attn_k_norm.weight"), arch == Arch::qwen3 ? 1u : 0u);
    const std::string a(arch_name(arch));
    EXPECT_EQ(g.get(a + ".block_count").as_int("k"), c.num_hidden_layers);
    EXPECT_EQ(g.get(a + ".attention.head_count_kv").as_int("k"), c.num_key_value_heads);
    EXPECT_EQ(float(g.get(a + ".rope.freq_base").as_double("k")), float(c.rope_theta));
    EXPECT_EQ(g.get(a + ".context_length").as_int("k"), c.max_position_embeddings);
  }
}

TEST(GgufExport, Gpt2TokenizerTypesMergesIdsAndTemplate) {
  TempDir t("gguf-tok");
  const fs::path dir = small_model(t.path / "m", Arch::qwen3);
  export_gguf(dir, t.path / "m.gguf", GgufExportType::bf16);
  GgufFile f(t.path / "m.gguf");
  const GgufView& g = f.view();
  EXPECT_EQ(g.get("tokenizer.ggml.model").as_string("k"), "gpt2");
  EXPECT_EQ(g.get("tokenizer.ggml.pre").as_string("k"), "gpt-2");
  const GgufValue& tokens = g.get("tokenizer.ggml.tokens");
  ASSERT_EQ(int64_t(tokens.size()), 53);  // tiny_config's vocab_size: ids 11..52 unused
  EXPECT_EQ(tokens.string_at(4, "k"), "abc");
  EXPECT_EQ(tokens.string_at(10, "k"), "<|im_end|>");
  EXPECT_EQ(tokens.string_at(52, "k"), "[PAD52]");
  const GgufValue& types = g.get("tokenizer.ggml.token_type");
  EXPECT_EQ(types.int_at(0, "k"), gguf_token_type::normal);
  EXPECT_EQ(types.int_at(10, "k"), gguf_token_type::control);
  EXPECT_EQ(types.int_at(11, "k"), gguf_token_type::unused);
  const GgufValue& merges = g.get("tokenizer.ggml.merges");
  ASSERT_EQ(merges.size(), 3u);
  EXPECT_EQ(merges.string_at(1, "k"), "ab c");
  EXPECT_EQ(g.get("tokenizer.ggml.eos_token_id").as_int("k"), 10);
  EXPECT_EQ(g.get("tokenizer.ggml.eot_token_id").as_int("k"), 10);
  EXPECT_EQ(g.find("tokenizer.ggml.bos_token_id"), nullptr);
  EXPECT_EQ(g.get("tokenizer.chat_template").as_string("k"), kChatml);
  EXPECT_EQ(g.get("general.file_type").as_int("k"), 32);
}

// Mistral's SentencePiece-style BPE (byte fallback): "llama" with byte tokens and scores that
// put merges in rank order.
TEST(GgufExport, SentencePieceTokenizerIsLlamaWithBytesAndScores) {
  TempDir t("gguf-spm");
  const fs::path tok = test::source_dir() / "tests/data/tokenizers/mistral";
  ModelConfig c = tiny_config(Arch::mistral);
  c.vocab_size = 32000;
  GgufWriter w;
  const GgufVocabInfo v = add_gguf_vocab(w, tok, c.vocab_size);
  EXPECT_EQ(v.model, "llama");
  w.write(t.path / "v.gguf");
  GgufFile f(t.path / "v.gguf");
  const GgufView& g = f.view();
  const GgufValue& tokens = g.get("tokenizer.ggml.tokens");
  const GgufValue& types = g.get("tokenizer.ggml.token_type");
  const GgufValue& scores = g.get("tokenizer.ggml.scores");
  ASSERT_EQ(tokens.size(), 32000u);
  EXPECT_EQ(tokens.string_at(3, "k"), "<0x00>");
  EXPECT_EQ(types.int_at(3, "k"), gguf_token_type::byte);
  EXPECT_EQ(types.int_at(0, "k"), gguf_token_type::unknown);  // <unk>
  EXPECT_EQ(types.int_at(1, "k"), gguf_token_type::control);  // <s>
  EXPECT_EQ(g.get("tokenizer.ggml.bos_token_id").as_int("k"), 1);
  EXPECT_EQ(g.get("tokenizer.ggml.eos_token_id").as_int("k"), 2);
  EXPECT_EQ(g.get("tokenizer.ggml.unknown_token_id").as_int("k"), 0);
  EXPECT_TRUE(g.get("tokenizer.ggml.add_bos_token").as_bool("k"));
  EXPECT_TRUE(g.get("tokenizer.ggml.add_space_prefix").as_bool("k"));
  // The first merge of the file ("▁ t") makes "▁t": score -0, above a later merge's token.
  const int32_t first = int32_t(Tokenizer::load(tok).token_to_id("\xe2\x96\x81t"));
  ASSERT_GE(first, 0);
  EXPECT_EQ(scores.double_at(size_t(first), "k"), 0.0);
  EXPECT_LT(scores.double_at(size_t(Tokenizer::load(tok).token_to_id("\xe2\x96\x81the")), "k"), 0.0);
  EXPECT_EQ(scores.double_at(3, "k"), -1e9f);  // <0x00>: no merge makes it
}

TEST(GgufExport, RefusesWhatItCannotWrite) {
  TempDir t("gguf-bad");
  const fs::path dir = t.path / "m";
  test::make_tiny_model(dir, Arch::llama);
  try {
    export_gguf(dir, t.path / "m.gguf", GgufExportType::f16);
    FAIL() << "exported a model without a tokenizer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tokenizer.json"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(t.path / "m.gguf"));
  EXPECT_THROW(parse_gguf_export_type("q4_0", "--type"), Error);
  // A tokenizer larger than the model.
  const fs::path big = t.path / "big";
  test::make_tiny_model(big, Arch::llama);
  fs::copy_file(test::source_dir() / "tests/data/tokenizers/gpt2/tokenizer.json", big / "tokenizer.json");
  try {
    export_gguf(big, t.path / "b.gguf", GgufExportType::f16);
    FAIL() << "exported a vocabulary larger than the model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size 53"), std::string::npos) << e.what();
  }
}

TEST(GenerationConfig, IdsFromTheTokenizerAndTheEndOfTurnToken) {
  TempDir t("gen");
  const fs::path dir = small_model(t.path / "m", Arch::qwen3);
  const ModelConfig c = load_config(dir / "config.json");
  const json g = generation_config_json(c, dir);
  EXPECT_FALSE(g.contains("bos_token_id") && g["bos_token_id"] == 10);
  EXPECT_EQ(g["max_length"], c.max_position_embeddings);
  // eos: the tokenizer's (<|im_end|>, 10) first, then config.json's.
  const json eos = g["eos_token_id"];
  ASSERT_TRUE(eos.is_array() || eos.is_number());
  EXPECT_EQ(eos.is_array() ? eos[0] : eos, 10);
  const json m = generation_config_json(c, test::source_dir() / "tests/data/tokenizers/mistral");
  EXPECT_EQ(m["bos_token_id"], 1);
  EXPECT_EQ(m["eos_token_id"].is_array() ? m["eos_token_id"][0] : m["eos_token_id"], 2);
  EXPECT_EQ(*end_of_turn_token(kChatml, "</s>"), "<|im_end|>");
  EXPECT_FALSE(end_of_turn_token("{{ unknown }}", "</s>"));
}

}  // namespace
}  // namespace sf

namespace sf {
namespace {

// RoPE scaling in llama.cpp's form: Llama 3's as rope_freqs (the divisor of each default
// frequency), yarn and linear as rope.scaling.* keys.
TEST(GgufExport, RopeScalingAsLlamaCppReadsIt) {
  TempDir t("gguf-rope");
  const fs::path tok = t.path / "tok";
  fs::create_directories(tok);
  write_small_tokenizer(tok);
  for (const char* name : {"llama_llama3", "qwen2_yarn", "mistral_linear"}) {
    const fs::path m = t.path / name, out = t.path / (std::string(name) + ".gguf");
    auto r = test::run_cli({"init", "--from-config",
                            (test::source_dir() / "tests/data/configs" / name / "config.json").string(),
                            "--tokenizer", tok.string(), "--out", m.string()});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = test::run_cli({"export", "--model", m.string(), "--format", "gguf", "--out", out.string()});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const ModelConfig c = load_config(m / "config.json");
    GgufFile f(out);
    const GgufView& g = f.view();
    const std::string a = g.get("general.architecture").as_string("k");
    if (c.rope_scaling.type == RopeScaling::Type::llama3) {
      ModelConfig plain = c;
      plain.rope_scaling = RopeScaling{};
      const std::vector<float> base = rope_inv_freq(plain), scaled = rope_inv_freq(c);
      const std::vector<float> got = g.read_f32("rope_freqs.weight");
      ASSERT_EQ(got.size(), base.size());
      for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(base[i] / got[i], scaled[i]) << i;
      // The lowest frequency (wavelength beyond the pretraining context) is divided by the factor.
      EXPECT_EQ(got.back(), float(c.rope_scaling.factor));
      EXPECT_EQ(g.find(a + ".rope.scaling.type"), nullptr);
      // The importer reads the file back (rope_freqs ignored: the config carries it).
      const ModelLayout l = ModelLayout::build(c);
      EXPECT_NO_THROW(load_units(c, l, out, true));
    } else {
      EXPECT_EQ(g.find_tensor("rope_freqs.weight"), nullptr);
      const bool yarn = c.rope_scaling.type == RopeScaling::Type::yarn;
      EXPECT_EQ(g.get(a + ".rope.scaling.type").as_string("k"), yarn ? "yarn" : "linear");
      EXPECT_EQ(g.get(a + ".rope.scaling.factor").as_double("k"), c.rope_scaling.factor);
      if (yarn) {
        EXPECT_EQ(g.get(a + ".rope.scaling.original_context_length").as_int("k"),
                  c.rope_scaling.original_max_position_embeddings);
      }
    }
    EXPECT_EQ(float(g.get(a + ".rope.freq_base").as_double("k")), float(c.rope_theta)) << name;
  }
}

// The command's own checks: each names the flag and the fix; nothing is written.
TEST(GgufExport, CommandRefusesBadFlagsAndModelsWithoutTokenizer) {
  TempDir t("gguf-cli");
  const fs::path m = t.path / "m";
  ASSERT_EQ(test::run_cli({"init", "--size", "tiny", "--out", m.string()}).exit_code, 0);
  const std::string out = (t.path / "x.gguf").string();
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--format", "onnx", "--out", out}, "--format \"onnx\" is unknown"},
      {{"--format", "gguf", "--type", "q4_0", "--out", out}, "--type \"q4_0\" is unknown; use f16, bf16 or q8_0"},
      {{"--format", "gguf", "--out", t.path.string()}, "is a directory; give a file name"},
      {{"--format", "gguf", "--out", (t.path / "no/x.gguf").string()}, "does not exist"},
      {{"--format", "gguf", "--out", out}, "no tokenizer.json; a GGUF file carries its tokenizer"},
  };
  for (auto& c : cases) {
    std::vector<std::string> args = {"export", "--model", m.string()};
    args.insert(args.end(), c.args.begin(), c.args.end());
    auto r = test::run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << r.output;
  }
  for (auto& e : fs::directory_iterator(t.path)) EXPECT_NE(e.path().extension(), ".gguf") << e.path();
}

}  // namespace
}  // namespace sf
