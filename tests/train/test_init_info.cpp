// `init --tokenizer` takes bos/eos/pad ids from the tokenizer; `info` shows every RoPE
// parameter the model computes with.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "train_test_util.h"

namespace sf::test {
namespace {

using nlohmann::json;

bool contains(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }

TEST(InitInfo, InitTakesTheTokenizersSpecialIds) {
  TempDir tmp("sf-init-ids");
  const fs::path mistral = source_dir() / "tests/data/tokenizers/mistral";
  // The tiny shape is a Qwen3 whose preset says bos 1 / eos 2 only by accident of Llama's
  // defaults; with GPT-2's tokenizer both are <|endoftext|> = 50256.
  const fs::path gpt2 = source_dir() / "examples/sotu", m1 = tmp.path / "m1";
  auto r = run_cli({"init", "--size", "tiny", "--tokenizer", gpt2.string(), "--out", m1.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "bos 50256 (<|endoftext|>), eos 50256 (<|endoftext|>), pad none"))
      << r.output;
  ModelConfig c = load_config(m1 / "config.json");
  EXPECT_EQ(c.bos_token_id, 50256);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{50256});
  // From a config that says otherwise: the tokenizer's ids win, a pad it lacks is dropped.
  json cfg = json::parse(read_file(source_dir() / "tests/data/configs/llama_default/config.json"));
  cfg["bos_token_id"] = 7;
  cfg["eos_token_id"] = {8, 9};
  cfg["pad_token_id"] = 3;
  cfg["vocab_size"] = 32000;
  write_file_atomic(tmp.path / "config.json", cfg.dump());
  const fs::path m2 = tmp.path / "m2";
  r = run_cli({"init", "--from-config", (tmp.path / "config.json").string(), "--tokenizer",
               mistral.string(), "--out", m2.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json saved = json::parse(read_file(m2 / "config.json"));
  EXPECT_EQ(saved["bos_token_id"], 1);
  EXPECT_EQ(saved["eos_token_id"], 2);
  EXPECT_FALSE(saved.contains("pad_token_id")) << saved.dump();
  // A tokenizer with a pad token: written as pad_token_id.
  const fs::path tok = tmp.path / "tok";
  fs::create_directories(tok);
  fs::copy_file(gpt2 / "tokenizer.json", tok / "tokenizer.json");
  json tc = json::parse(read_file(gpt2 / "tokenizer_config.json"));
  tc["pad_token"] = "!";
  write_file_atomic(tok / "tokenizer_config.json", tc.dump());
  const fs::path m3 = tmp.path / "m3";
  r = run_cli({"init", "--size", "tiny", "--tokenizer", tok.string(), "--out", m3.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(json::parse(read_file(m3 / "config.json"))["pad_token_id"], 0);  // "!" is id 0
  const json gen = json::parse(read_file(m3 / "generation_config.json"));
  EXPECT_EQ(gen["pad_token_id"], 0);
  EXPECT_EQ(gen["bos_token_id"], 50256);
  EXPECT_EQ(gen["max_length"], load_config(m3 / "config.json").max_position_embeddings);
}

TEST(InitInfo, InfoShowsTheRopeParameters) {
  const fs::path configs = source_dir() / "tests/data/configs";
  struct Case {
    const char* dir;
    std::vector<std::string> says;
  };
  const std::vector<Case> cases = {
      {"llama_default", {"RoPE default, theta 10000", "context        64 tokens"}},
      {"llama_llama3", {"RoPE llama3, theta 500000, factor 8 (from 16), low_freq_factor 1, "
                        "high_freq_factor 4"}},
      {"qwen2_yarn", {"RoPE yarn, theta 1000000, factor 4 (from 16), beta_fast 32, beta_slow 1"}},
      {"mistral_linear", {"RoPE linear", "factor"}},
  };
  for (auto& c : cases) {
    auto r = run_cli({"info", "--model", (configs / c.dir).string()});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    for (auto& w : c.says) EXPECT_TRUE(contains(r.output, w)) << c.dir << ": " << w << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, "dtype          ")) << r.output;
  }
}

}  // namespace
}  // namespace sf::test
