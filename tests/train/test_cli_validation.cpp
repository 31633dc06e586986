// The command line refuses what it cannot use, through the slideformer binary: every flag
// value is checked (none silently ignored), CLI11's parse errors come in the house style with
// exit status 2 and a "did you mean", Hugging Face's flag spellings are aliases, `init` sizes
// the vocabulary from its tokenizer and will not clobber a model directory, and `info`
// validates the weights' headers.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"
#include "train_test_util.h"

namespace sf::test {
namespace {

bool contains(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }

// Exit status 2 (a user error) and every one of `words` in the output.
void expect_refused(const std::vector<std::string>& args, const std::vector<std::string>& words) {
  auto r = run_cli(args);
  std::string cmd;
  for (auto& a : args) cmd += a + " ";
  EXPECT_EQ(r.exit_code, 2) << cmd << "\n" << r.output;
  for (auto& w : words) EXPECT_TRUE(contains(r.output, w)) << cmd << ": \"" << w << "\" in\n" << r.output;
  EXPECT_TRUE(contains(r.output, "slideformer: error: ")) << cmd << "\n" << r.output;
}

// The backend `plan` chose, from its "backend    <kind> (<why>)" line.
std::string planned_backend(const std::string& out) {
  const size_t p = out.find("backend    ");
  if (p == std::string::npos) return "";
  return out.substr(p + 11, out.find(' ', p + 11) - (p + 11));
}

TEST(CliValidation, EveryFlagValueIsChecked) {
  // --progress, also when --quiet would have made it moot.
  for (auto extra : {std::vector<std::string>{}, std::vector<std::string>{"--quiet"}}) {
    std::vector<std::string> a = {"train", "--progress", "foo", "--print-config"};
    a.insert(a.end(), extra.begin(), extra.end());
    expect_refused(a, {"--progress \"foo\"", "auto, bar, lines or none"});
  }
  // Sizes: parsed whatever the backend, so a typo never goes unnoticed.
  for (const char* flag : {"--gpu-memory", "--host-memory"}) {
    expect_refused({"train", flag, "abc", "--print-config"}, {std::string(flag) + " \"abc\"", "24GiB"});
    expect_refused({"plan", "--size", "tiny", flag, "abc"}, {std::string(flag) + " \"abc\"", "24GiB"});
  }
  // --chat-format: an unknown name, and any name with token data (nothing to format).
  expect_refused({"train", "--chat-format", "foo", "--print-config"},
                 {"--chat-format foo is not known", "chatml", "llama3"});
  expect_refused({"train", "--chat-format", "chatml", "--print-config"},
                 {"--chat-format chatml does not apply", "token data"});
  TempDir tmp("sf-cli-validation");
  const fs::path tokens = make_tokens(tmp.path / "tokens.bin", 400);
  expect_refused({"train", "--model", "m", "--data", tokens.string(), "--chat-format", "chatml",
                  "--print-config"},
                 {"--chat-format chatml does not apply to " + tokens.string()});
  // A JSONL file is not refused (whether it holds conversations is the data's business).
  auto ok = run_cli({"train", "--model", "m", "--data", "d.jsonl", "--chat-format", "chatml",
                     "--print-config"});
  EXPECT_EQ(ok.exit_code, 0) << ok.output;

  // --gpu-memory with --backend host is a contradiction; chosen automatically, a note.
  expect_refused({"train", "--backend", "host", "--gpu-memory", "24GiB", "--print-config"},
                 {"--gpu-memory 24GiB does not apply with --backend host", "--host-memory"});
  expect_refused({"plan", "--size", "tiny", "--backend", "host", "--gpu-memory", "24GiB"},
                 {"--gpu-memory 24GiB does not apply with --backend host"});
  auto host = run_cli({"plan", "--size", "tiny", "--backend", "host"});
  ASSERT_EQ(host.exit_code, 0) << host.output;
  EXPECT_TRUE(contains(host.output, "backend    host (--backend host)\n")) << host.output;
  auto plan = run_cli({"plan", "--size", "tiny", "--gpu-memory", "24GiB"});
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_TRUE(contains(plan.output, "backend    " + planned_backend(plan.output) + " (auto: "))
      << plan.output;
  if (planned_backend(plan.output) == "host") {
    EXPECT_TRUE(contains(plan.output, "note: --gpu-memory 24GiB does not apply: this runs on the "
                                      "host backend (auto: "))
        << plan.output;
  }

  // train says the same before training (a one-step run of a tiny model).
  const fs::path model = make_tiny_model(tmp.path / "model");
  auto t = run_cli({"train", "--model", model.string(), "--data", tokens.string(), "--out",
                    (tmp.path / "out").string(), "--steps", "1", "--batch-size", "1",
                    "--seq-len", "16", "--eval-batches", "1", "--gpu-memory", "24GiB"});
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const std::string kind = planned_backend(t.output);
  EXPECT_TRUE(contains(t.output, "backend    " + kind + " (auto: ")) << t.output;
  if (kind == "host") {
    EXPECT_TRUE(contains(t.output, "note: --gpu-memory 24GiB does not apply")) << t.output;
  }
}

TEST(CliValidation, ParseErrorsSayWhatWasWrongAndHowToFixIt) {
  expect_refused({"train", "--stepz", "3"},
                 {"unknown option --stepz for `slideformer train`", "did you mean --steps?",
                  "`slideformer train --help`"});
  expect_refused({"train", "--learning_rate", "3e-4"}, {"did you mean --learning-rate?"});
  expect_refused({"plan", "--no-such-flag-at-all"}, {"unknown option --no-such-flag-at-all"});
  expect_refused({"train", "--steps", "abc"}, {"--steps \"abc\" is not a whole number", "e.g. --steps "});
  expect_refused({"train", "--lr", "fast"}, {"--lr \"fast\" is not a number"});
  expect_refused({"train", "--out"}, {"--out needs a value"});
  expect_refused({"init"}, {"`slideformer init` needs --out"});
  expect_refused({"trian"}, {"unknown command \"trian\"", "did you mean train?"});
  expect_refused({}, {"no command given", "init, train"});
  expect_refused({"train", "stray"}, {"unexpected argument \"stray\""});
  expect_refused({"plan", "--layers", "0"}, {"--layers 0: must be a positive number of layers"});
  auto help = run_cli({"plan", "--help"});
  EXPECT_EQ(help.exit_code, 0) << help.output;
  EXPECT_TRUE(contains(help.output, "--gpu-memory")) << help.output;

  // Hugging Face's spellings of the same flags.
  auto a = run_cli({"train", "--learning-rate", "0.002", "--per-device-train-batch-size", "3",
                    "--max-seq-length", "48", "--gradient-accumulation-steps", "2",
                    "--print-config"});
  ASSERT_EQ(a.exit_code, 0) << a.output;
  for (const char* line : {"lr = 0.002\n", "batch-size = 3\n", "seq-len = 48\n", "grad-accum = 2\n"})
    EXPECT_TRUE(contains(a.output, line)) << line << " in\n" << a.output;
  auto p = run_cli({"plan", "--size", "tiny", "--backend", "host", "--per-device-train-batch-size",
                    "2", "--max-seq-length", "64", "--gradient-accumulation-steps", "3"});
  ASSERT_EQ(p.exit_code, 0) << p.output;
  EXPECT_TRUE(contains(p.output, "step       3 x 128 tokens")) << p.output;
}

// A copy of the GPT-2 tokenizer with `extra` added special tokens after its 50257.
fs::path tokenizer_with_added(const fs::path& dir, int extra) {
  const fs::path src = fs::path(SF_SOURCE_DIR) / "tests" / "data" / "tokenizers" / "gpt2";
  nlohmann::json t = nlohmann::json::parse(read_file(src / "tokenizer.json"));
  for (int i = 0; i < extra; ++i)
    t["added_tokens"].push_back({{"id", 50257 + i}, {"content", "<|extra_" + std::to_string(i) + "|>"},
                                 {"single_word", false}, {"lstrip", false}, {"rstrip", false},
                                 {"normalized", false}, {"special", true}});
  fs::create_directories(dir);
  write_file_atomic(dir / "tokenizer.json", t.dump());
  return dir;
}

TEST(CliValidation, InitSizesTheVocabularyFromTheTokenizerAndKeepsExistingModels) {
  TempDir tmp("sf-cli-init");
  // 50257 + 100 = 50357 tokens: the tiny shape's 50304 is too small; 50368 = 787 x 64.
  const fs::path tok = tokenizer_with_added(tmp.path / "tok", 100);
  const int64_t n = Tokenizer::load(tok).vocab_size();
  ASSERT_EQ(n, 50357);
  const fs::path out = tmp.path / "m";
  auto r = run_cli({"init", "--size", "tiny", "--tokenizer", tok.string(), "--out", out.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(load_config(out / "config.json").vocab_size, 50368) << r.output;
  EXPECT_TRUE(contains(r.output, "vocab_size 50368 from the tokenizer")) << r.output;
  // Smaller than the shape's own: sized down as well (the Mistral test tokenizer, 32000).
  const fs::path mistral = fs::path(SF_SOURCE_DIR) / "tests" / "data" / "tokenizers" / "mistral";
  const fs::path out2 = tmp.path / "m2";
  r = run_cli({"init", "--size", "tiny", "--tokenizer", mistral.string(), "--out", out2.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(load_config(out2 / "config.json").vocab_size, 32000) << r.output;
  // --from-config keeps its vocab_size, but not one the tokenizer overflows.
  expect_refused({"init", "--from-config", (out2 / "config.json").string(), "--tokenizer",
                  tok.string(), "--out", (tmp.path / "m3").string()},
                 {"vocab_size 32000 is smaller than the tokenizer", "at least 50357"});
  expect_refused({"init", "--tokenizer", tmp.path.string(), "--out", (tmp.path / "m4").string()},
                 {"no tokenizer.json"});

  // An existing model directory is kept unless --overwrite.
  expect_refused({"init", "--size", "tiny", "--out", out.string()},
                 {"--out " + out.string() + " already exists and is not empty", "--overwrite"});
  EXPECT_EQ(load_config(out / "config.json").vocab_size, 50368);
  r = run_cli({"init", "--size", "tiny", "--out", out.string(), "--overwrite"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(load_config(out / "config.json").vocab_size, 50304);
  fs::create_directories(tmp.path / "empty");
  r = run_cli({"init", "--size", "tiny", "--out", (tmp.path / "empty").string()});
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(CliValidation, InfoReadsTheWeightsHeadersAndRefusesATruncatedFile) {
  TempDir tmp("sf-cli-info-weights");
  const fs::path model = tmp.path / "m";
  ASSERT_EQ(run_cli({"init", "--size", "tiny", "--out", model.string()}).exit_code, 0);
  auto r = run_cli({"info", "--model", model.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* w : {"dtype          bf16 (config.json), in the files: BF16 ", "context        ",
                        "positions      RoPE default, theta ", "weights        ", "headers checked"})
    EXPECT_TRUE(contains(r.output, w)) << w << " in\n" << r.output;

  // Cut the data section short: the last tensor's bytes are missing.
  const fs::path st = model / "model.safetensors";
  fs::resize_file(st, fs::file_size(st) - 1000);
  r = run_cli({"info", "--model", model.string()});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_FALSE(contains(r.output, "architecture")) << r.output;  // the error, not half a report
  EXPECT_TRUE(contains(r.output, st.string() + ": tensor \"")) << r.output;
  EXPECT_TRUE(contains(r.output, "truncated")) << r.output;
}

}  // namespace
}  // namespace sf::test
