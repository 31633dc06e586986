// config.json parsing against transformers 5.17: every committed case of tests/data/configs
// (written by scripts/gen_config_vectors.py: files as transformers 5 and 4 spell them, and
// hand-written ones with absent fields) gives the values transformers computes with; saving
// keeps the source's spelling and round-trips.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "core/error.h"
#include "io/model_config.h"
#include "config_vectors.h"
#include "test_util.h"

namespace sf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path data_dir() { return test::config_data_dir(); }
const json& vectors() { return test::config_vectors(); }

std::vector<std::string> case_names() {
  std::vector<std::string> n;
  for (auto& [k, v] : vectors()["cases"].items()) n.push_back(k);
  return n;
}

std::string test_name(const testing::TestParamInfo<std::string>& i) {
  std::string s = i.param;
  for (char& ch : s)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

DType dtype_named(const std::string& s) {
  return s == "float32" ? DType::f32 : s == "float16" ? DType::f16 : DType::bf16;
}

// Everything but `extra`, which holds the source text and so differs after a save adds keys.
void expect_same_math(const ModelConfig& a, ModelConfig b) {
  b.extra = a.extra;
  EXPECT_TRUE(a == b) << config_to_json(a).dump() << "\nvs\n" << config_to_json(b).dump();
}

class ConfigVectors : public testing::TestWithParam<std::string> {
 protected:
  const json& expect() const { return vectors()["cases"][GetParam()]; }
  fs::path file() const { return data_dir() / GetParam() / "config.json"; }
  json source() const {
    std::ifstream f(file());
    return json::parse(f);
  }
};

TEST_P(ConfigVectors, FieldsAsTransformersDerivesThem) {
  const json& e = expect();
  ModelConfig c = load_config(file());
  EXPECT_EQ(c.vocab_size, e["vocab_size"]);
  EXPECT_EQ(c.hidden_size, e["hidden_size"]);
  EXPECT_EQ(c.intermediate_size, e["intermediate_size"]);
  EXPECT_EQ(c.num_hidden_layers, e["num_hidden_layers"]);
  EXPECT_EQ(c.num_attention_heads, e["num_attention_heads"]);
  EXPECT_EQ(c.num_key_value_heads, e["num_key_value_heads"]);
  EXPECT_EQ(c.head_dim, e["head_dim"]);
  EXPECT_EQ(c.max_position_embeddings, e["max_position_embeddings"]);
  EXPECT_EQ(c.rms_norm_eps, e["rms_norm_eps"].get<double>());
  EXPECT_EQ(c.tie_word_embeddings, e["tie_word_embeddings"]);
  EXPECT_EQ(c.qkv_bias, e["qkv_bias"]);
  EXPECT_FALSE(e["o_proj_bias"].get<bool>());  // a config giving o_proj a bias is refused
  EXPECT_EQ(c.qk_norm, e["qk_norm"]);
  if (!e["dtype"].is_null()) {
    EXPECT_EQ(c.torch_dtype, dtype_named(e["dtype"]));
  }
  EXPECT_EQ(rope_type_name(c.rope_scaling.type), e["rope_type"].get<std::string>());
  EXPECT_EQ(c.rope_theta, e["rope_theta"].get<double>());
  // transformers computes each frequency in float32 torch ops, slideformer in double rounded
  // once: a few float ulps apart.
  std::vector<float> f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), e["inv_freq"].size());
  for (size_t i = 0; i < f.size(); ++i) {
    double want = e["inv_freq"][i];
    EXPECT_NEAR(f[i], want, 4e-7 * want) << "frequency " << i;
  }
  // Computed in double by both (Python floats).
  EXPECT_NEAR(rope_attention_scaling(c), e["attention_scaling"].get<double>(), 1e-14);
  EXPECT_EQ(c.sliding_window, e["sliding_window"]);
  EXPECT_EQ(c.bos_token_id, e["bos_token_id"].is_null() ? -1 : e["bos_token_id"].get<int64_t>());
  EXPECT_EQ(c.eos_token_ids, e["eos_token_ids"].get<std::vector<int64_t>>());
}

TEST_P(ConfigVectors, SaveKeepsTheSpellingAndRoundTrips) {
  ModelConfig c = load_config(file());
  json saved = config_to_json(c);
  // No duplicated or contradictory keys: one spelling of RoPE and of the dtype.
  const bool params = saved.contains("rope_parameters");
  EXPECT_NE(params, saved.contains("rope_theta")) << saved.dump();
  EXPECT_FALSE(params && saved.contains("rope_scaling")) << saved.dump();
  EXPECT_NE(saved.contains("dtype"), saved.contains("torch_dtype")) << saved.dump();
  json src = source();
  if (src.contains("rope_parameters")) {
    EXPECT_TRUE(params);
  }
  if (src.contains("rope_theta") && !src.contains("rope_parameters")) {
    EXPECT_FALSE(params);
  }
  if (src.contains("torch_dtype") && !src.contains("dtype")) {
    EXPECT_TRUE(saved.contains("torch_dtype"));
  }
  // Written by transformers (5, or 4 for the _v4 cases): saving changes nothing.
  if (!expect().value("spelling", "").empty()) {
    EXPECT_EQ(saved, src) << saved.dump(2);
  }
  // load -> save -> load is the same config, and saving again writes the same file.
  ModelConfig again = config_from_json(saved, "saved");
  expect_same_math(c, again);
  EXPECT_EQ(config_to_json(again), saved);
}

INSTANTIATE_TEST_SUITE_P(Transformers, ConfigVectors, testing::ValuesIn(case_names()), test_name);

TEST(ConfigVectorsMeta, CoverEveryFamilyAndRopeType) {
  EXPECT_EQ(vectors()["transformers"], "5.17.0");
  for (const char* fam : {"llama", "mistral", "qwen2", "qwen3"})
    for (const char* rope : {"default", "linear", "dynamic", "llama3", "yarn"})
      for (const char* suffix : {"", "_v4"})
        EXPECT_TRUE(vectors()["cases"].contains(std::string(fam) + "_" + rope + suffix))
            << fam << " " << rope << suffix;
}

// ---- the bug that started this: transformers 5's spelling of rope_theta -------------------

TEST(ConfigSpelling, RopeParametersThetaIsRead) {
  // SmolLM2-135M-Instruct as transformers 5 saves it: no top-level rope_theta.
  json j = {{"model_type", "llama"}, {"vocab_size", 49152}, {"hidden_size", 576},
            {"intermediate_size", 1536}, {"num_hidden_layers", 30},
            {"num_attention_heads", 9}, {"num_key_value_heads", 3},
            {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 100000.0}}},
            {"dtype", "bfloat16"}, {"transformers_version", "5.17.0"}};
  ModelConfig c = config_from_json(j, "smollm2.json");
  EXPECT_EQ(c.rope_theta, 100000.0);
  EXPECT_EQ(c.rope_spelling, RopeSpelling::parameters);
  json saved = config_to_json(c);
  EXPECT_FALSE(saved.contains("rope_theta"));
  EXPECT_FALSE(saved.contains("rope_scaling"));
  EXPECT_FALSE(saved.contains("torch_dtype"));
  EXPECT_EQ(saved["rope_parameters"], j["rope_parameters"]);
}

TEST(ConfigSpelling, ModelMadeHereUsesTransformers5Names) {
  ModelConfig c;
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 128;
  c.rope_theta = 5e5;
  c.rope_scaling.type = RopeScaling::Type::yarn;
  c.rope_scaling.factor = 4.0;
  c.rope_scaling.original_max_position_embeddings = 32;
  c.arch = Arch::mistral;
  json j = config_to_json(c);
  EXPECT_EQ(j["rope_parameters"],
            (json{{"rope_type", "yarn"}, {"rope_theta", 5e5}, {"factor", 4.0},
                  {"original_max_position_embeddings", 32}}));
  EXPECT_TRUE(j["sliding_window"].is_null());  // absent would mean 4096 to transformers
  EXPECT_EQ(j["dtype"], "bfloat16");
  expect_same_math(c, config_from_json(j, "made"));
}

TEST(ConfigSpelling, ChangedFieldsReplaceTheSourceObject) {
  // A source object that no longer matches (here: theta changed by a program) is rewritten;
  // legacy spelling stays legacy.
  json j = {{"model_type", "qwen2"}, {"vocab_size", 64}, {"hidden_size", 32},
            {"intermediate_size", 48}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
            {"num_key_value_heads", 2}, {"rope_theta", 1e6},
            {"rope_scaling", {{"type", "yarn"}, {"factor", 4.0},
                              {"original_max_position_embeddings", 32}, {"finetuned", true}}},
            {"torch_dtype", "bfloat16"}, {"use_sliding_window", false}};
  ModelConfig c = config_from_json(j, "qwen.json");
  EXPECT_EQ(c.rope_spelling, RopeSpelling::legacy);
  EXPECT_EQ(config_to_json(c)["rope_scaling"], j["rope_scaling"]);  // kept as written
  c.rope_scaling.factor = 2.0;
  c.sliding_window = 16;
  json saved = config_to_json(c);
  EXPECT_EQ(saved["rope_scaling"]["factor"], 2.0);
  EXPECT_FALSE(saved["rope_scaling"].contains("finetuned"));
  EXPECT_FALSE(saved.contains("rope_parameters"));
  EXPECT_EQ(saved["torch_dtype"], "bfloat16");
  expect_same_math(c, config_from_json(saved, "saved"));
}

// ---- refused: fields that change the computation in ways slideformer does not implement --

json small(const char* arch) {
  return {{"model_type", arch}, {"vocab_size", 64}, {"hidden_size", 32},
          {"intermediate_size", 48}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}};
}

void expect_refused(const json& j, const std::string& field, const std::string& what) {
  try {
    config_from_json(j, "cfg/config.json");
    ADD_FAILURE() << "accepted: " << j.dump();
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::input);
    EXPECT_NE(msg.find("cfg/config.json"), std::string::npos) << msg;
    EXPECT_NE(msg.find("field \"" + field + "\""), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

TEST(ConfigRefused, BiasesSlideformerDoesNotHave) {
  for (const char* arch : {"llama", "qwen3"}) {
    json j = small(arch);
    j["attention_bias"] = true;
    expect_refused(j, "attention_bias", "o_proj a bias");
  }
  json j = small("llama");
  j["mlp_bias"] = true;
  expect_refused(j, "mlp_bias", "not supported");
  // transformers ignores attention_bias for these two (qwen2 always has q/k/v biases).
  for (const char* arch : {"mistral", "qwen2"}) {
    json k = small(arch);
    k["attention_bias"] = true;
    EXPECT_EQ(config_from_json(k, "x").qkv_bias, std::string(arch) == "qwen2");
  }
}

TEST(ConfigRefused, PartialRotaryAndUnknownRope) {
  json j = small("llama");
  j["partial_rotary_factor"] = 0.5;
  expect_refused(j, "partial_rotary_factor", "is 0.5");
  j = small("qwen3");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e4},
                          {"partial_rotary_factor", 0.25}};
  expect_refused(j, "rope_parameters.partial_rotary_factor", "is 0.25");
  j["rope_parameters"]["partial_rotary_factor"] = 1.0;
  EXPECT_NO_THROW(config_from_json(j, "x"));
  j = small("qwen2");
  j["rope_parameters"] = {{"rope_type", "longrope"}, {"rope_theta", 1e4}};
  expect_refused(j, "rope_parameters.rope_type", "supported: default, linear, dynamic, llama3, yarn");
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 1e4}};
  expect_refused(j, "rope_parameters.factor", "is missing");
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"truncate", "yes"}};
  expect_refused(j, "rope_parameters.truncate", "must be true or false");
  j["rope_parameters"] = 5;
  expect_refused(j, "rope_parameters", "must be an object or null");
}

TEST(ConfigRefused, DropoutQuantizationActivation) {
  json j = small("qwen2");
  j["attention_dropout"] = 0.1;
  expect_refused(j, "attention_dropout", "set it to 0.0");
  j = small("llama");
  j["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}};
  expect_refused(j, "quantization_config", "dequantize");
  j = small("mistral");
  j["hidden_act"] = "gelu_pytorch_tanh";
  expect_refused(j, "hidden_act", "only \"silu\"");
}

TEST(ConfigRefused, LayerTypes) {
  json j = small("qwen3");
  j["use_sliding_window"] = true;
  j["layer_types"] = {"full_attention", "sliding_attention"};  // 2 of 4 layers
  expect_refused(j, "layer_types", "must list num_hidden_layers (4) entries");
  j["layer_types"] = {"full_attention", "chunked_attention", "full_attention", "full_attention"};
  expect_refused(j, "layer_types", "\"chunked_attention\"");
  j = small("mistral");
  j["sliding_window"] = -4;
  expect_refused(j, "sliding_window", "positive integer");
}

TEST(ConfigRopeMath, DynamicHasARangeAndYarnScalesScores) {
  json j = small("llama");
  j["max_position_embeddings"] = 256;
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  ModelConfig d = config_from_json(j, "x");
  EXPECT_EQ(rope_max_sequence(d), 256);
  j.erase("rope_scaling");
  ModelConfig plain = config_from_json(j, "x");
  EXPECT_EQ(rope_inv_freq(d), rope_inv_freq(plain));  // equal within the range
  EXPECT_EQ(rope_max_sequence(plain), 0);
  EXPECT_EQ(rope_attention_scaling(plain), 1.0);
  j["rope_parameters"] = {{"rope_type", "yarn"}, {"factor", 16.0}, {"rope_theta", 1e4}};
  EXPECT_DOUBLE_EQ(rope_attention_scaling(config_from_json(j, "x")), 0.1 * std::log(16.0) + 1);
}

TEST(ConfigSequenceLength, WindowAndDynamicRangeAreCheckedUpFront) {
  json j = small("mistral");
  j["sliding_window"] = 4096;
  ModelConfig m = config_from_json(j, "m/config.json");
  EXPECT_NO_THROW(check_sequence_length(m, 4096, "m/config.json"));
  try {
    check_sequence_length(m, 8192, "m/config.json");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::input);
    EXPECT_NE(std::string(e.what()).find("m/config.json: sliding_window"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("use --seq-len 4096 or less"), std::string::npos) << e.what();
  }
  j = small("llama");
  j["max_position_embeddings"] = 1024;
  j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
  ModelConfig d = config_from_json(j, "d/config.json");
  EXPECT_NO_THROW(check_sequence_length(d, 1024, "d"));
  EXPECT_THROW(check_sequence_length(d, 1025, "d"), Error);
  j.erase("rope_scaling");
  EXPECT_NO_THROW(check_sequence_length(config_from_json(j, "x"), 1 << 20, "x"));
}

}  // namespace
}  // namespace sf
