// model/weights_io: save a tiny model directory and load it back bit-exactly for every
// architecture (tied and untied, single file and shards); missing / unexpected / misshapen
// tensors are refused with messages naming them; the layout covers exactly
// ModelConfig::num_parameters() for each architecture.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>

#include "core/error.h"
#include "io/safetensors.h"
#include "model/model_presets.h"
#include "model/param_layout.h"
#include "model/weights_io.h"
#include "test_util.h"

namespace sf {
namespace {

namespace fs = std::filesystem;

// Odd sizes so that every unit has alignment padding between its slots.
ModelConfig tiny(Arch arch, bool tied) {
  ModelConfig c;
  c.arch = arch;
  c.vocab_size = 50;
  c.hidden_size = 37;  // q_dim 40 != hidden: o_proj is not square
  c.intermediate_size = 72;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 10;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = tied;
  c.qkv_bias = arch == Arch::qwen2;
  c.qk_norm = arch == Arch::qwen3;
  return c;
}

// Unit buffers with seeded random values in every part and zero padding.
struct Weights {
  ModelLayout layout;
  std::vector<std::vector<float>> units;
  explicit Weights(const ModelLayout& l, float fill = 0.f, uint64_t seed = 0) : layout(l) {
    for (size_t u = 0; u < l.units.size(); ++u) {
      units.emplace_back(size_t(l.units[u].numel), fill);
      if (seed == 0) continue;
      for (auto& s : l.units[u].params)
        for (auto& p : s.parts) {
          auto v = test::random_vec(size_t(p.numel), seed++ * 7919);
          std::copy(v.begin(), v.end(), units[u].begin() + p.offset);
        }
    }
  }
  std::vector<float*> ptrs() {
    std::vector<float*> p;
    for (auto& u : units) p.push_back(u.data());
    return p;
  }
};

bool in_part(const Unit& u, int64_t i) {
  for (auto& s : u.params)
    for (auto& p : s.parts)
      if (i >= p.offset && i < p.offset + p.numel) return true;
  return false;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::input) << e.what();
    return e.what();
  }
  return "";
}

struct Case {
  Arch arch;
  bool tied;
  DType dtype;
  uint64_t shard_bytes;
};

struct WeightsRoundTrip : ::testing::TestWithParam<Case> {};

TEST_P(WeightsRoundTrip, SaveThenLoadIsBitExact) {
  const Case k = GetParam();
  ModelConfig c = tiny(k.arch, k.tied);
  ModelLayout layout = ModelLayout::build(c);
  Weights src(layout, 0.f, 1);
  test::TempDir dir;
  auto files = save_model_weights(dir.path, c, layout, src.ptrs(), k.dtype, k.shard_bytes);
  EXPECT_EQ(files.size() > 1, k.shard_bytes < (1u << 20));

  // Destination pre-filled with NaN: padding must come back zero, parts from the file.
  Weights dst(layout, std::numeric_limits<float>::quiet_NaN());
  WeightsLoadInfo info = load_model_weights(dir.path, c, layout, dst.ptrs());
  int64_t padding = 0;
  for (auto& u : layout.units)
    for (int64_t i = 0; i < u.numel; ++i) padding += !in_part(u, i);
  EXPECT_GT(padding, 0) << "the tiny shapes should leave alignment padding to check";
  EXPECT_EQ(info.tensors, int64_t(layout.hf_names().size()));
  EXPECT_EQ(info.sharded, files.size() > 1);
  EXPECT_TRUE(info.ignored.empty());
  for (size_t u = 0; u < layout.units.size(); ++u)
    for (int64_t i = 0; i < layout.units[u].numel; ++i) {
      float want = src.units[u][size_t(i)];
      if (k.dtype == DType::bf16) want = round_bf16(want);
      if (k.dtype == DType::f16) want = f16_to_f32(f32_to_f16(want));
      float got = dst.units[u][size_t(i)];
      ASSERT_EQ(std::memcmp(&got, &want, 4), 0)
          << "unit " << u << " element " << i << (in_part(layout.units[u], i) ? "" : " (padding)")
          << ": " << got << " vs " << want;
    }

  // The files hold HF names and shapes, in layout order.
  SafetensorsModel m(dir.path);
  EXPECT_EQ(m.names(), layout.hf_names());
  EXPECT_EQ(m.get("model.embed_tokens.weight").info->shape, (std::vector<int64_t>{50, 37}));
  EXPECT_EQ(m.get("model.norm.weight").info->shape, (std::vector<int64_t>{37}));
  EXPECT_EQ(m.find("lm_head.weight").has_value(), !k.tied);
  EXPECT_EQ(m.get("model.layers.1.self_attn.k_proj.weight").info->dtype, st_dtype_of(k.dtype));
}

INSTANTIATE_TEST_SUITE_P(
    Archs, WeightsRoundTrip,
    ::testing::Values(Case{Arch::llama, false, DType::bf16, 1 << 20},
                      Case{Arch::llama, false, DType::f32, 4000},
                      Case{Arch::mistral, false, DType::f16, 1 << 20},
                      Case{Arch::qwen2, false, DType::bf16, 3000},
                      Case{Arch::qwen3, false, DType::bf16, 1 << 20},
                      Case{Arch::qwen3, true, DType::bf16, 5000}),
    [](const auto& i) {
      return cat(arch_name(i.param.arch), i.param.tied ? "_tied_" : "_", dtype_name(i.param.dtype),
                 i.param.shard_bytes < (1u << 20) ? "_sharded" : "_single");
    });

// A checkpoint of `c` with the layout's tensors, edited by `edit` before writing.
void write_checkpoint(const fs::path& dir, const ModelConfig& c,
                      const std::function<void(std::vector<TensorWrite>&)>& edit,
                      std::vector<std::vector<float>>& keep) {
  ModelLayout layout = ModelLayout::build(c);
  std::vector<TensorWrite> ts;
  uint64_t seed = 100;
  for (auto& u : layout.units)
    for (auto& s : u.params)
      for (auto& p : s.parts) {
        keep.push_back(test::random_vec(size_t(p.numel), seed++));
        ts.push_back({p.hf_name, DType::bf16, p.hf_shape, keep.back().data(), nullptr});
      }
  edit(ts);
  write_safetensors_model(dir, ts, 1 << 20);
}

std::string load_error(const ModelConfig& c,
                       const std::function<void(std::vector<TensorWrite>&)>& edit) {
  test::TempDir dir;
  std::vector<std::vector<float>> keep;
  keep.reserve(1000);  // TensorWrite points into these
  write_checkpoint(dir.path, c, edit, keep);
  ModelLayout layout = ModelLayout::build(c);
  Weights dst(layout);
  return error_of([&] { load_model_weights(dir.path, c, layout, dst.ptrs()); });
}

void erase_named(std::vector<TensorWrite>& ts, const std::string& name) {
  std::erase_if(ts, [&](const TensorWrite& t) { return t.name == name; });
}

TEST(WeightsIoBad, MissingTensors) {
  std::string msg = load_error(tiny(Arch::llama, false), [](auto& ts) {
    erase_named(ts, "model.layers.1.mlp.up_proj.weight");
    erase_named(ts, "model.norm.weight");
  });
  EXPECT_NE(msg.find("2 of the 21 tensors the config expects are missing: "
                     "model.layers.1.mlp.up_proj.weight, model.norm.weight"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("config.json may not match these weights"), std::string::npos) << msg;
}

TEST(WeightsIoBad, ManyMissingAreCut) {
  std::string msg = load_error(tiny(Arch::llama, false), [](auto& ts) { ts.resize(1); });
  EXPECT_NE(msg.find("20 of the 21 tensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(15 more)"), std::string::npos) << msg;
}

TEST(WeightsIoBad, MissingLmHeadSuggestsTying) {
  std::string msg =
      load_error(tiny(Arch::qwen3, false), [](auto& ts) { erase_named(ts, "lm_head.weight"); });
  EXPECT_NE(msg.find("lm_head.weight"), std::string::npos) << msg;
  EXPECT_NE(msg.find("\"tie_word_embeddings\": true"), std::string::npos) << msg;
}

TEST(WeightsIoBad, UnexpectedTensors) {
  static std::vector<float> extra = test::random_vec(40, 5);
  std::string msg = load_error(tiny(Arch::mistral, false), [](auto& ts) {
    ts.push_back({"model.layers.0.self_attn.q_proj.bias", DType::bf16, {40}, extra.data(), nullptr});
    ts.push_back({"model.layers.2.input_layernorm.weight", DType::bf16, {37}, extra.data(), nullptr});
  });
  EXPECT_NE(msg.find("2 tensors in the checkpoint are not part of the model the config "
                     "describes: model.layers.0.self_attn.q_proj.bias, "
                     "model.layers.2.input_layernorm.weight"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("it says mistral, hidden_size 37"), std::string::npos) << msg;
}

TEST(WeightsIoBad, WrongShape) {
  std::string msg = load_error(tiny(Arch::qwen2, false), [](auto& ts) {
    for (auto& t : ts)
      if (t.name == "model.layers.1.self_attn.k_proj.weight") t.shape = {37, 20};  // transposed
  });
  EXPECT_NE(msg.find("/model.safetensors: tensor \"model.layers.1.self_attn.k_proj.weight\" has "
                     "shape [37, 20] but the config expects [20, 37]"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("config.json may not match"), std::string::npos) << msg;
}

TEST(WeightsIoBad, WrongDtype) {
  static std::vector<int32_t> ints(37, 1);
  std::string msg = load_error(tiny(Arch::llama, false), [](auto& ts) {
    for (auto& t : ts)
      if (t.name == "model.norm.weight") t = {t.name, DType::i32, {37}, nullptr, ints.data()};
  });
  EXPECT_NE(msg.find("tensor \"model.norm.weight\" has dtype I32"), std::string::npos) << msg;
}

TEST(WeightsIo, TiedLmHeadAndInvFreqAreIgnored) {
  ModelConfig c = tiny(Arch::qwen3, true);
  static std::vector<float> extra = test::random_vec(50 * 40, 6);
  test::TempDir dir;
  std::vector<std::vector<float>> keep;
  keep.reserve(1000);
  write_checkpoint(dir.path, c, [](auto& ts) {
    ts.push_back({"lm_head.weight", DType::bf16, {50, 37}, extra.data(), nullptr});
    ts.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", DType::f32, {5}, extra.data(),
                  nullptr});
  }, keep);
  ModelLayout layout = ModelLayout::build(c);
  Weights dst(layout);
  auto info = load_model_weights(dir.path, c, layout, dst.ptrs());
  EXPECT_EQ(info.ignored, (std::vector<std::string>{
                              "lm_head.weight", "model.layers.0.self_attn.rotary_emb.inv_freq"}));
  EXPECT_EQ(dst.units[0][0], round_bf16(keep[0][0]));  // the embedding, not lm_head
}

TEST(WeightsIo, LayoutCoversExactlyTheParameters) {
  auto check = [](const ModelConfig& c) {
    ModelLayout l = ModelLayout::build(c);
    int64_t n = 0;
    for (auto& u : l.units)
      for (auto& s : u.params) {
        int64_t parts = 0;
        for (auto& p : s.parts) {
          int64_t shape_numel = 1;
          for (int64_t d : p.hf_shape) shape_numel *= d;
          EXPECT_EQ(shape_numel, p.numel) << p.hf_name;
          parts += p.numel;
        }
        EXPECT_EQ(parts, s.numel());
        n += parts;
      }
    EXPECT_EQ(n, c.num_parameters()) << arch_name(c.arch);
    EXPECT_GE(l.total_numel(), n);
  };
  for (Arch a : {Arch::llama, Arch::mistral, Arch::qwen2, Arch::qwen3})
    for (bool tied : {false, true}) check(tiny(a, tied));
  // Real shapes (layouts are cheap: no buffers).
  ModelConfig llama8b = tiny(Arch::llama, false);
  llama8b.vocab_size = 128256;
  llama8b.hidden_size = 4096;
  llama8b.intermediate_size = 14336;
  llama8b.num_hidden_layers = 32;
  llama8b.num_attention_heads = 32;
  llama8b.num_key_value_heads = 8;
  llama8b.head_dim = 128;
  check(llama8b);
  EXPECT_EQ(llama8b.num_parameters(), 8030261248);  // Llama 3.1 8B's published count
}

// The larger presets (the compact state's scale targets) have their published counts.
TEST(WeightsIo, LargePresetsHaveThePublishedParameterCounts) {
  EXPECT_EQ(model_preset("qwen2.5-14b").num_parameters(), 14770033664);
  EXPECT_EQ(model_preset("qwen2.5-32b").num_parameters(), 32763876352);
  EXPECT_EQ(model_preset("llama3-70b").num_parameters(), 70553706496);
  EXPECT_EQ(model_preset("mistral-large-123b").num_parameters(), 122610069504);
}

TEST(WeightsIoBad, SaveRefusesIntegerDtype) {
  ModelConfig c = tiny(Arch::llama, false);
  ModelLayout layout = ModelLayout::build(c);
  Weights w(layout, 0.f, 1);
  test::TempDir dir;
  std::string msg = error_of([&] { save_model_weights(dir.path, c, layout, w.ptrs(), DType::i32); });
  EXPECT_NE(msg.find("can be saved as bf16, f16 or f32"), std::string::npos) << msg;
}

}  // namespace
}  // namespace sf
