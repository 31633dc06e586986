// Each family with each RoPE type, in transformers 5's and 4's spelling of config.json: the
// fp32 loss of a tiny model (tests/data/configs, scripts/gen_config_vectors.py) equals what
// transformers 5.17 computes on the same weights and tokens, and so does the loss of the
// directory slideformer saves from it.
#include <gtest/gtest.h>

#include <fstream>

#include "backend/host/host_backend.h"
#include "io/model_config.h"
#include "model/batch.h"
#include "model/device_batch.h"
#include "model/reference_model.h"
#include "model/weights_io.h"
#include "model_test_util.h"
#include "config_vectors.h"
#include "test_util.h"

namespace sf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

fs::path data_dir() { return test::config_data_dir(); }
const json& vectors() { return test::config_vectors(); }

std::vector<std::string> model_cases() {
  std::vector<std::string> n;
  for (auto& [k, v] : vectors()["cases"].items())
    if (v.contains("loss")) n.push_back(k);
  return n;
}

Batch vector_tokens() {
  std::vector<std::vector<int32_t>> rows = vectors()["tokens"].get<std::vector<std::vector<int32_t>>>();
  return Batch::from_rows(rows);
}

// Mean next-token loss of the model in `weights_dir` under config c, on the host (fp32).
double mean_loss(const ModelConfig& c, const fs::path& weights_dir, const Batch& b) {
  HostBackend be;
  ReferenceModel m(be, c, b.n_tokens());
  std::vector<std::vector<float>> units(size_t(m.n_units()));
  std::vector<float*> ptrs;
  for (int u = 0; u < m.n_units(); ++u) {
    units[size_t(u)].resize(size_t(m.layout().units[size_t(u)].numel));
    ptrs.push_back(units[size_t(u)].data());
  }
  load_model_weights(weights_dir, c, m.layout(), ptrs);
  for (int u = 0; u < m.n_units(); ++u) m.set_unit_weights(u, ptrs[size_t(u)]);
  return m.forward(b) / double(b.n_valid_labels());
}

class ConfigModels : public testing::TestWithParam<std::string> {};

TEST_P(ConfigModels, LossEqualsTransformers) {
  const json& e = vectors()["cases"][GetParam()];
  ModelConfig c = load_config(data_dir() / GetParam() / "config.json");
  const fs::path weights = data_dir() / "weights" / e["weights"].get<std::string>();
  const Batch b = vector_tokens();
  const double want = e["loss"];
  // Both sum in fp32 over the same bf16-valued weights; only the order of the sums differs
  // (~1e-6 relative at these sizes).
  const double got = mean_loss(c, weights, b);
  EXPECT_NEAR(got, want, 1e-5 * want);

  // The directory slideformer writes (config.json + weights) computes the same loss.
  test::TempDir out("sfcfgmodel");
  save_config(c, out.path / "config.json");
  fs::copy_file(weights / "model.safetensors", out.path / "model.safetensors");
  ModelConfig again = load_config(out.path / "config.json");
  EXPECT_EQ(mean_loss(again, out.path, b), got);
}

std::string case_name(const testing::TestParamInfo<std::string>& i) { return i.param; }

INSTANTIATE_TEST_SUITE_P(Transformers, ConfigModels, testing::ValuesIn(model_cases()), case_name);

TEST(ConfigModelsMeta, RopeTypesChangeTheLoss) {
  // The vectors must tell the RoPE types apart, else the loss test above could not fail on a
  // wrong frequency (dynamic equals default inside max_position_embeddings).
  const json& cs = vectors()["cases"];
  for (const char* fam : {"llama", "mistral", "qwen2", "qwen3"}) {
    const double base = cs[std::string(fam) + "_default"]["loss"];
    for (const char* rope : {"linear", "llama3", "yarn"})
      EXPECT_GT(std::fabs(cs[std::string(fam) + "_" + rope]["loss"].get<double>() - base),
                1e-3 * base) << fam << " " << rope;
    EXPECT_EQ(cs[std::string(fam) + "_dynamic"]["loss"].get<double>(), base) << fam;
  }
}

TEST(ConfigModelsMeta, DynamicRopeRefusesSequencesBeyondItsRange) {
  ModelConfig c = load_config(data_dir() / "llama_dynamic" / "config.json");
  ASSERT_EQ(c.max_position_embeddings, 64);
  HostBackend be;
  DeviceBatch db(be, be.default_stream(), c, 256);
  std::mt19937_64 g(3);
  EXPECT_NO_THROW(db.upload(be.default_stream(), test::pack({test::random_tokens(64, 96, g)})));
  try {
    db.upload(be.default_stream(), test::pack({test::random_tokens(65, 96, g)}));
    ADD_FAILURE() << "a 65-token sequence was accepted";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("dynamic"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace sf
