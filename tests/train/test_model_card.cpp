// What a checkpoint carries besides weights and resume state: generation_config.json
// (export/generation_config.h) and the README.md model card (train/model_card.h), written
// inside the atomic checkpoint directory, with the run's own numbers.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/version.h"
#include "train/model_card.h"
#include "train_test_util.h"

namespace sf {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using test::TempDir;

TEST(ModelCard, CheckpointCarriesGenerationConfigAndCardWithTheRunsNumbers) {
  TempDir tmp{"sf-card"};
  const fs::path model = test::make_tiny_model(tmp.path / "base");
  write_file_atomic(model / "README.md", "---\nlicense: apache-2.0\ntags:\n- x\n---\n# base\n");
  write_file_atomic(model / "generation_config.json", R"({"temperature": 0.7, "eos_token_id": 5})");
  const fs::path tokens = test::make_tokens(tmp.path / "tokens.bin", 400);
  TrainOptions o = test::tiny_run(model, tokens, tmp.path / "run");
  std::ostringstream log;
  const TrainResult r = run_training(o, log);
  const fs::path ck = r.checkpoint;
  ASSERT_EQ(ck.filename(), "checkpoint-6") << log.str();

  const json g = json::parse(read_file(ck / "generation_config.json"));
  const ModelConfig c = load_config(ck / "config.json");
  EXPECT_EQ(g["max_length"], c.max_position_embeddings);
  EXPECT_EQ(g["temperature"], 0.7);  // the base model's settings stay
  std::vector<int64_t> want = c.eos_token_ids;
  want.push_back(5);  // config.json's eos first, then the base file's
  EXPECT_EQ(g["eos_token_id"].is_array() ? g["eos_token_id"].get<std::vector<int64_t>>()
                                         : std::vector<int64_t>{g["eos_token_id"].get<int64_t>()},
            want);

  const std::string card = read_file(ck / "README.md");
  const json state = json::parse(read_file(ck / "trainer_state.json"));
  const json& last = state["metrics"].back();
  char loss[32];
  std::snprintf(loss, sizeof loss, "%.4f (step 6)", last["loss"].get<double>());
  for (const std::string& s :
       {std::string("license: apache-2.0"), "`" + model.string() + "`", "`" + tokens.string() + "`",
        std::string("| steps | 6 of 6 |"), cat("| tokens seen | ", state["tokens_seen"].get<int64_t>(), " |"),
        std::string("0.01, cosine schedule, 2 warmup steps"), std::string(loss),
        cat("commit ", build_commit()), std::string("apache-2.0 (the base model's)")})
    EXPECT_NE(card.find(s), std::string::npos) << "missing \"" << s << "\" in\n" << card;
  EXPECT_NE(card.find("| final eval loss | "), std::string::npos);
  EXPECT_EQ(card.find("not measured"), std::string::npos) << card;  // the run evaluated
}

TEST(ModelCard, LicenseOnlyFromFrontMatter) {
  TempDir tmp{"sf-lic"};
  EXPECT_FALSE(model_card_license(tmp.path));
  write_file_atomic(tmp.path / "README.md", "# title\nlicense: mit\n");
  EXPECT_FALSE(model_card_license(tmp.path));  // not front matter
  write_file_atomic(tmp.path / "README.md", "---\nlanguage: en\nlicense: \"llama3.1\"\n---\n");
  EXPECT_EQ(model_card_license(tmp.path), "llama3.1");
  const std::string card = model_card_markdown(json::object(), tiny_config(Arch::llama), {});
  EXPECT_NE(card.find("not stated"), std::string::npos) << card;
  EXPECT_EQ(card.find("license:"), std::string::npos) << card;
}

}  // namespace
}  // namespace sf
