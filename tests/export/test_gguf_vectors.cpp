// `slideformer init` + `slideformer export` of the tiny bundled model (Qwen3 shape, the bundled
// GPT-2 tokenizer, a ChatML template) as f16, bf16 and q8_0, read by our reader and compared
// with what gguf-py (llama.cpp's Python reader) read from the same exports:
// tests/data/export/vectors.json, made by scripts/gen_gguf_export_vectors.py. Every key with its
// type and value, every tensor's name, dims, type and dequantized sums; the vectors also record
// that each tensor's bytes are what gguf-py's own quantizer makes of the source weights.
#include <gtest/gtest.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/gguf.h"
#include "train/train_test_util.h"

namespace sf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A metadata value as gguf-py's reader reports it (see the script's value_of).
json our_value(const GgufValue& v) {
  auto scalar = [](const GgufValue& x) -> json {
    if (x.is_string()) return x.as_string("k");
    if (x.type() == GgufType::boolean) return x.as_bool("k");
    if (x.type() == GgufType::f32 || x.type() == GgufType::f64) return x.as_double("k");
    return x.as_int("k");
  };
  if (!v.is_array()) return {{"type", gguf_type_name(v.type())}, {"value", scalar(v)}};
  json head = json::array();
  for (size_t i = 0; i < v.size() && i < 8; ++i) {
    if (v.elem_type() == GgufType::string) head.push_back(v.string_at(i, "k"));
    else if (v.elem_type() == GgufType::f32) head.push_back(v.double_at(i, "k"));
    else head.push_back(v.int_at(i, "k"));
  }
  return {{"type", "array"}, {"elem", gguf_type_name(v.elem_type())}, {"size", v.size()},
          {"head", head}};
}

TEST(GgufVectors, ExportOfTheTinyModelReadsAsGgufPyReadsIt) {
  const fs::path src = test::source_dir();
  const json vectors = json::parse(read_file(src / "tests/data/export/vectors.json"));
  test::TempDir t("gguf-vec");
  const fs::path tok = t.path / "tok", model = t.path / "m";  // "m": general.name
  fs::create_directories(tok);
  fs::copy_file(src / "examples/sotu/tokenizer.json", tok / "tokenizer.json");
  fs::copy_file(src / "tests/data/export/tokenizer_config.json", tok / "tokenizer_config.json");
  auto r = test::run_cli({"init", "--size", "tiny", "--seed", "7", "--tokenizer", tok.string(),
                          "--out", model.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (auto& [type, want] : vectors.at("exports").items()) {
    const fs::path out = t.path / ("m-" + type + ".gguf");
    r = test::run_cli({"export", "--model", model.string(), "--format", "gguf", "--type", type,
                       "--out", out.string()});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    GgufFile f(out);
    const GgufView& g = f.view();
    const json& meta = want.at("metadata");
    EXPECT_EQ(g.metadata().size(), meta.size()) << type;
    for (auto& [key, v] : meta.items()) {
      const GgufValue* ours = g.find(key);
      ASSERT_NE(ours, nullptr) << type << ": " << key;
      json o = our_value(*ours);
      if (v.at("type") == "float32") {  // gguf-py widened the float32; so did we
        EXPECT_EQ(float(o.at("value").get<double>()), float(v.at("value").get<double>())) << key;
        continue;
      }
      EXPECT_EQ(o, v) << type << ": " << key;
    }
    const json& tensors = want.at("tensors");
    ASSERT_EQ(g.tensors().size(), tensors.size()) << type;
    for (size_t i = 0; i < tensors.size(); ++i) {
      const json& w = tensors[i];
      const GgufTensorInfo& ti = g.tensors()[i];
      EXPECT_EQ(ti.name, w.at("name").get<std::string>());
      EXPECT_EQ(ti.dims, w.at("dims").get<std::vector<int64_t>>()) << ti.name;
      EXPECT_EQ(gguf_tensor_type_name(ti.type), w.at("type").get<std::string>()) << ti.name;
      EXPECT_TRUE(w.at("matches_gguf_py").get<bool>()) << ti.name << ": the vectors say gguf-py "
                                                          "quantizes the source differently";
      std::vector<float> x(size_t(ti.numel));
      g.read_f32(ti, x.data());
      double sum = 0, abs_sum = 0;
      for (float e : x) sum += e, abs_sum += std::fabs(e);
      // The same float32 values summed in float64, numpy pairwise vs in order: ~1e-12 apart.
      const double tol = 1e-9 * w.at("abs_sum").get<double>() + 1e-12;
      EXPECT_NEAR(sum, w.at("sum").get<double>(), tol) << type << " " << ti.name;
      EXPECT_NEAR(abs_sum, w.at("abs_sum").get<double>(), tol) << type << " " << ti.name;
    }
  }
}

}  // namespace
}  // namespace sf
