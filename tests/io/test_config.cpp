// io/model_config: real configs (Llama 3.1 8B, Mistral 7B v0.1, Qwen2.5 7B, Qwen3 8B,
// Qwen3 0.6B) parse to every expected field and to the published parameter counts; llama3
// RoPE scaling matches reference values; malformed configs name the file and the field.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "core/error.h"
#include "io/model_config.h"
#include "test_util.h"

namespace sf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The config.json files as published on the Hugging Face hub (unused keys kept, so that
// parsing is tested against what users really have).
constexpr const char* kLlama31_8B = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256})";

constexpr const char* kMistral7B = R"({
  "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0",
  "use_cache": true, "vocab_size": 32000})";

constexpr const char* kQwen25_7B = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584,
  "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 131072,
  "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
  "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 152064})";

constexpr const char* kQwen3_8B = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
  "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
  "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

constexpr const char* kQwen3_06B = R"({
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
  "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
  "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000,
  "sliding_window": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0", "use_cache": true, "use_sliding_window": false,
  "vocab_size": 151936})";

ModelConfig parse(const char* text) { return config_from_json(json::parse(text), "config.json"); }

// Every parsed field, compared at once so a failure shows them all.
struct Expect {
  Arch arch;
  int64_t V, C, F, L, H, KV, D, max_pos;
  double eps, theta;
  bool tied, qkv_bias, qk_norm;
  int64_t bos;
  std::vector<int64_t> eos;
  int64_t params;  // the count the model card publishes
};

void check(const ModelConfig& c, const Expect& e) {
  EXPECT_EQ(c.arch, e.arch);
  EXPECT_EQ(c.vocab_size, e.V);
  EXPECT_EQ(c.hidden_size, e.C);
  EXPECT_EQ(c.intermediate_size, e.F);
  EXPECT_EQ(c.num_hidden_layers, e.L);
  EXPECT_EQ(c.num_attention_heads, e.H);
  EXPECT_EQ(c.num_key_value_heads, e.KV);
  EXPECT_EQ(c.head_dim, e.D);
  EXPECT_EQ(c.q_dim(), e.H * e.D);
  EXPECT_EQ(c.kv_dim(), e.KV * e.D);
  EXPECT_EQ(c.max_position_embeddings, e.max_pos);
  EXPECT_EQ(c.rms_norm_eps, e.eps);
  EXPECT_EQ(c.rope_theta, e.theta);
  EXPECT_EQ(c.tie_word_embeddings, e.tied);
  EXPECT_EQ(c.qkv_bias, e.qkv_bias);
  EXPECT_EQ(c.qk_norm, e.qk_norm);
  EXPECT_EQ(c.torch_dtype, DType::bf16);
  EXPECT_EQ(c.bos_token_id, e.bos);
  EXPECT_EQ(c.eos_token_ids, e.eos);
  EXPECT_EQ(c.num_parameters(), e.params);
  EXPECT_TRUE(c.extra.contains("transformers_version"));  // the source is kept whole
  // Writing and reading back loses nothing.
  ModelConfig r = config_from_json(config_to_json(c), "roundtrip");
  EXPECT_EQ(config_to_json(r), config_to_json(c));
  EXPECT_EQ(r.num_parameters(), e.params);
}

TEST(Config, Llama31_8B) {
  ModelConfig c = parse(kLlama31_8B);
  check(c, {Arch::llama, 128256, 4096, 14336, 32, 32, 8, 128, 131072, 1e-5, 500000.0, false,
            false, false, 128000, {128001, 128008, 128009}, 8030261248});
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::llama3);
  EXPECT_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
}

TEST(Config, Mistral7B) {
  ModelConfig c = parse(kMistral7B);
  check(c, {Arch::mistral, 32000, 4096, 14336, 32, 32, 8, 128, 32768, 1e-5, 10000.0, false,
            false, false, 1, {2}, 7241732096});
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::none);
}

TEST(Config, Qwen25_7B) {
  ModelConfig c = parse(kQwen25_7B);
  check(c, {Arch::qwen2, 152064, 3584, 18944, 28, 28, 4, 128, 131072, 1e-6, 1e6, false,
            true, false, 151643, {151643}, 7615616512});
}

TEST(Config, Qwen3_8B) {
  ModelConfig c = parse(kQwen3_8B);
  check(c, {Arch::qwen3, 151936, 4096, 12288, 36, 32, 8, 128, 40960, 1e-6, 1e6, false, false,
            true, 151643, {151645}, 8190735360});
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::none);  // "rope_scaling": null
}

TEST(Config, Qwen3_06B_TiedWithHeadDimAboveHidden) {
  // 16 heads of 128 = 2048 > hidden 1024: head_dim must come from the file, not C / H.
  ModelConfig c = parse(kQwen3_06B);
  check(c, {Arch::qwen3, 151936, 1024, 3072, 28, 16, 8, 128, 40960, 1e-6, 1e6, true, false,
            true, 151643, {151645}, 596049920});
}

TEST(Config, LoadAndSaveFiles) {
  test::TempDir dir;
  fs::path p = dir.path / "config.json";
  std::ofstream(p) << kQwen3_06B;
  ModelConfig c = load_config(p);
  EXPECT_EQ(c.hidden_size, 1024);
  fs::path out = dir.path / "out" / "config.json";
  fs::create_directories(out.parent_path());
  save_config(c, out);
  ModelConfig r = load_config(out);
  EXPECT_EQ(config_to_json(r), config_to_json(c));
  json j = json::parse(std::ifstream(out));
  EXPECT_EQ(j["architectures"], json::array({"Qwen3ForCausalLM"}));
  EXPECT_EQ(j["max_window_layers"], 28);  // a key slideformer does not use survives
}

TEST(Config, DefaultsWhenOptionalFieldsAreAbsent) {
  ModelConfig c = parse(R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4})");
  EXPECT_EQ(c.num_key_value_heads, 4);  // MHA when absent, as transformers does
  EXPECT_EQ(c.head_dim, 16);            // hidden_size / heads
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.tie_word_embeddings, false);
  EXPECT_EQ(c.torch_dtype, DType::bf16);
  EXPECT_EQ(c.bos_token_id, 1);  // LlamaConfig's defaults
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
}

// Llama 3.1's RoPE inverse frequencies (head_dim 128, theta 5e5, llama3 scaling factor 8,
// low 1, high 4, original 8192), computed in float64 with plain Python and rounded to fp32:
//   def f32(x): return struct.unpack('f', struct.pack('f', x))[0]
//   for i in range(64):
//     f = 1.0 / 500000.0 ** (2 * i / 128); wl = 2 * math.pi / f
//     if wl > 8192 / 1.0: f = f / 8
//     elif wl >= 8192 / 4.0:
//       s = (8192 / wl - 1.0) / (4.0 - 1.0); f = (1 - s) * f / 8 + s * f
//     print(f32(f))
// Entries 0..28 are unscaled, 29..34 smoothed, 35..63 divided by 8.
constexpr float kLlama31InvFreq[64] = {
    1.000000000e+00f, 8.146172166e-01f, 6.636012197e-01f, 5.405809879e-01f,
    4.403665960e-01f, 3.587302268e-01f, 2.922278345e-01f, 2.380538136e-01f,
    1.939227432e-01f, 1.579728127e-01f, 1.286873668e-01f, 1.048309505e-01f,
    8.539710194e-02f, 6.956595182e-02f, 5.666962266e-02f, 4.616405070e-02f,
    3.760603070e-02f, 3.063452058e-02f, 2.495540865e-02f, 2.032910660e-02f,
    1.656044088e-02f, 1.349041983e-02f, 1.098952815e-02f, 8.952259086e-03f,
    7.292664610e-03f, 5.940730218e-03f, 4.839421250e-03f, 3.942275885e-03f,
    3.211446106e-03f, 2.166570863e-03f, 1.371893566e-03f, 8.567514014e-04f,
    5.248461384e-04f, 3.126937372e-04f, 1.785078057e-04f, 9.556212171e-05f,
    7.784655463e-05f, 6.341514381e-05f, 5.165906987e-05f, 4.208236714e-05f,
    3.428102355e-05f, 2.792591113e-05f, 2.274892904e-05f, 1.853166941e-05f,
    1.509621688e-05f, 1.229763893e-05f, 1.001786859e-05f, 8.160728612e-06f,
    6.647869668e-06f, 5.415469332e-06f, 4.411534519e-06f, 3.593712108e-06f,
    2.927499963e-06f, 2.384791742e-06f, 1.942692506e-06f, 1.582550794e-06f,
    1.289173156e-06f, 1.050182732e-06f, 8.554969213e-07f, 6.969025321e-07f,
    5.677088097e-07f, 4.624653798e-07f, 3.767322596e-07f, 3.068925878e-07f,
};

TEST(Config, RopeInvFreqLlama3Scaling) {
  std::vector<float> f = rope_inv_freq(parse(kLlama31_8B));
  ASSERT_EQ(f.size(), 64u);
  for (size_t i = 0; i < 64; ++i) {
    // Same float64 formula on both sides; 2^-22 relative (2 fp32 ulps) allows only for a
    // libm pow() that differs by an ulp from glibc's and so rounds to the other fp32.
    // (transformers evaluates it in fp32 and lands within ~1e-6 relative of these.)
    EXPECT_NEAR(f[i], kLlama31InvFreq[i], std::ldexp(kLlama31InvFreq[i], -22)) << "i = " << i;
  }
  // Without scaling only the unscaled band agrees; the low band is 8x larger.
  json j = json::parse(kLlama31_8B);
  j["rope_scaling"] = nullptr;
  std::vector<float> plain = rope_inv_freq(config_from_json(j, "x"));
  EXPECT_EQ(plain[10], f[10]);
  EXPECT_NEAR(plain[40] / 8, f[40], std::ldexp(f[40], -20));
  EXPECT_GT(plain[31], f[31]);
  EXPECT_LT(plain[31] / 8, f[31]);
}

TEST(Config, RopeInvFreqLinearScaling) {
  json j = json::parse(kMistral7B);
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  std::vector<float> f = rope_inv_freq(config_from_json(j, "x"));
  // 1 / 10000^(2i/128) / 4, float64 then fp32: i = 0 and i = 32 exactly 0.25 and 0.0025.
  EXPECT_EQ(f[0], 0.25f);
  EXPECT_NEAR(f[32], 0.0025f, 0.0025f * 0x1p-22f);  // 2 ulps: as above
}

// ---- errors: each names the file and the field ------------------------------------------

std::string load_error(const json& j, fs::path* where = nullptr) {
  test::TempDir dir("sfcfg");
  fs::path p = dir.path / "config.json";
  std::ofstream(p) << j.dump();
  if (where) *where = p;
  try {
    load_config(p);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::input);
    std::string msg = e.what();
    EXPECT_NE(msg.find(p.string()), std::string::npos) << "message does not name the file: " << msg;
    return msg;
  }
  ADD_FAILURE() << "config accepted: " << j.dump();
  return "";
}

json llama() { return json::parse(kLlama31_8B); }

void expect_field_error(json j, const std::string& field, const std::string& what) {
  std::string msg = load_error(j);
  EXPECT_NE(msg.find("field \"" + field + "\""), std::string::npos) << msg;
  EXPECT_NE(msg.find(what), std::string::npos) << msg;
}

TEST(ConfigBad, UnknownModelType) {
  json j = llama();
  j["model_type"] = "gpt_neox";
  expect_field_error(j, "model_type", "\"gpt_neox\", an architecture slideformer does not support");
  j["model_type"] = 3;
  expect_field_error(j, "model_type", "must be a string");
  j.erase("model_type");
  expect_field_error(j, "model_type", "is missing");
}

TEST(ConfigBad, MissingHiddenSize) {
  json j = llama();
  j.erase("hidden_size");
  expect_field_error(j, "hidden_size", "is missing");
}

TEST(ConfigBad, NegativeHeads) {
  json j = llama();
  j["num_attention_heads"] = -32;
  expect_field_error(j, "num_attention_heads", "must be a positive integer, got -32");
  j = llama();
  j["num_key_value_heads"] = 0;
  expect_field_error(j, "num_key_value_heads", "must be a positive integer, got 0");
  j = llama();
  j["num_hidden_layers"] = 2.5;
  expect_field_error(j, "num_hidden_layers", "must be a positive integer, got 2.5");
}

TEST(ConfigBad, KvHeadsNotDividingHeads) {
  json j = llama();
  j["num_key_value_heads"] = 5;
  expect_field_error(j, "num_key_value_heads", "(5) must divide num_attention_heads (32)");
}

TEST(ConfigBad, HeadDim) {
  json j = llama();
  j["hidden_size"] = 4100;  // 4100 / 32 is not whole
  expect_field_error(j, "head_dim", "hidden_size is not a multiple of num_attention_heads");
  j = llama();
  j["head_dim"] = 127;
  expect_field_error(j, "head_dim", "must be even for RoPE");
}

TEST(ConfigBad, TorchDtype) {
  json j = llama();
  j["torch_dtype"] = "int8";
  expect_field_error(j, "torch_dtype", "is \"int8\"; supported: bfloat16, float16, float32");
  j["torch_dtype"] = 16;
  expect_field_error(j, "torch_dtype", "must be a string");
}

TEST(ConfigBad, RopeScaling) {
  json j = llama();
  j["rope_scaling"]["rope_type"] = "longrope";  // Phi-3's: not one of these families'
  expect_field_error(j, "rope_scaling.rope_type",
                     "is \"longrope\"; supported: default, linear, dynamic, llama3, yarn");
  j = llama();
  j["rope_scaling"].erase("factor");
  expect_field_error(j, "rope_scaling.factor", "is missing");
  j = llama();
  j["rope_scaling"]["original_max_position_embeddings"] = -1;
  expect_field_error(j, "rope_scaling.original_max_position_embeddings", "positive integer");
  j = llama();
  j["rope_scaling"]["high_freq_factor"] = 0.5;
  expect_field_error(j, "rope_scaling.high_freq_factor", "must be greater than low_freq_factor");
  j = llama();
  j["rope_scaling"]["factor"] = "8";
  expect_field_error(j, "rope_scaling.factor", "must be a positive number");
  j = llama();
  j["rope_scaling"] = "llama3";
  expect_field_error(j, "rope_scaling", "must be an object or null");
  j = llama();
  j["rope_scaling"]["rope_type"] = 3;  // used to be read as "default": scaling silently lost
  expect_field_error(j, "rope_scaling.rope_type", "must be a string");
  j = llama();
  j["rope_scaling"] = {{"type", "proportional"}, {"factor", 2.0}};
  expect_field_error(j, "rope_scaling.type", "is \"proportional\"");
  j = llama();
  j["rope_scaling"] = {{"type", "dynamic"}};
  expect_field_error(j, "rope_scaling.factor", "is missing");
}

TEST(ConfigBad, OtherFields) {
  json j = llama();
  j["hidden_act"] = "gelu";
  expect_field_error(j, "hidden_act", "only \"silu\"");
  j = llama();
  j["mlp_bias"] = true;
  expect_field_error(j, "mlp_bias", "not supported");
  j = llama();
  j["rms_norm_eps"] = 0;
  expect_field_error(j, "rms_norm_eps", "must be a positive number");
  j = llama();
  j["tie_word_embeddings"] = "no";
  expect_field_error(j, "tie_word_embeddings", "must be true or false");
}

TEST(ConfigBad, FileNotJsonOrMissing) {
  test::TempDir dir;
  fs::path p = dir.path / "config.json";
  std::ofstream(p) << "{\"model_type\": ";
  try {
    load_config(p);
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(p.string() + ": not valid JSON"), std::string::npos)
        << e.what();
  }
  try {
    load_config(dir.path / "absent.json");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("absent.json: cannot open"), std::string::npos)
        << e.what();
  }
  try {
    config_from_json(json::array(), "arr.json");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("arr.json: expected a JSON object"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace sf
