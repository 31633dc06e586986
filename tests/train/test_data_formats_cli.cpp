// The data formats end to end, through the slideformer binary on the host backend with a tiny
// model whose directory holds a tokenizer and Llama 3.2's chat template: train --data prints the
// detected format of each committed example file (Alpaca, ShareGPT, TRL prompt-completion, a
// JSON array, plain text) and trains; misread files are refused saying what they hold; two
// --data files with weights train, and a stopped run resumes to the same weights as an
// uninterrupted one; eval --data reports loss, perplexity and the tokens with loss, eval
// --tokens refuses a dataset pointing to --data, and both say which backend they use.
#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "data/data_source.h"
#include "data_pipeline/dataset_test_util.h"
#include "train_test_util.h"

namespace sf::test {
namespace {

bool contains(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }

fs::path formats_dir() { return source_dir() / "tests/data/datasets/formats"; }


// A tiny qwen3 model with that vocabulary (padded to 50304) and tokenizer, made once.
const fs::path& model_dir() {
  static TempDir tmp("sf-fmt-model");
  static const fs::path dir = [] {
    ModelConfig cfg = tiny_config(Arch::qwen3);
    cfg.vocab_size = 50304;
    ModelLayout layout = ModelLayout::build(cfg);
    auto params = init_params(layout, 7);
    std::vector<const float*> w;
    for (auto& p : params) w.push_back(p.data());
    SaveModelOptions so;
    so.dtype = DType::f32;
    so.tokenizer_dir = llama32_tokenizer_dir(tmp.path / "tok");
    save_model_dir(tmp.path / "model", cfg, layout, w, so);
    return tmp.path / "model";
  }();
  return dir;
}

std::vector<std::string> train_args(const std::vector<std::string>& data, const fs::path& out) {
  std::vector<std::string> a = {"train", "--model", model_dir().string(), "--out", out.string(),
                                "--steps", "1", "--batch-size", "2", "--seq-len", "64",
                                "--backend", "host", "--progress", "lines", "--chat-date",
                                "26 Jul 2024", "--eval-fraction", "0"};
  for (auto& d : data) a.insert(a.end(), {"--data", d});
  return a;
}

TEST(DataFormatsCli, EveryFormatIsDetectedPrintedAndTrains) {
  TempDir tmp("sf-fmt-cli");
  const struct {
    const char* file;
    std::string line;
  } cases[] = {
      {"alpaca.jsonl", "alpaca (llama3.2 template), 4 samples from 4 records, "},
      {"sharegpt.jsonl", "sharegpt (llama3.2 template), 3 samples from 3 records, "},
      {"chat_prompt_completion.jsonl", "chat_prompt_completion (llama3.2 template), 2 samples from 2 records, "},
      {"records.json", "alpaca (llama3.2 template), 4 samples from 4 records, "},
      {"plain.txt", "plain_text, 3 samples from 3 records, "},
  };
  int n = 0;
  for (auto& c : cases) {
    const fs::path f = formats_dir() / c.file;
    auto r = run_cli(train_args({f.string()}, tmp.path / ("out" + std::to_string(n++))));
    EXPECT_EQ(r.exit_code, 0) << c.file << "\n" << r.output;
    EXPECT_TRUE(contains(r.output, f.string() + ": " + c.line)) << c.file << "\n" << r.output;
    EXPECT_TRUE(std::regex_search(r.output, std::regex(" tokens \\([0-9]+ with loss\\)")))
        << r.output;
  }
  // Refused, saying what the file holds and what --data reads.
  auto pq = run_cli(train_args({(formats_dir() / "alpaca.parquet").string()}, tmp.path / "pq"));
  EXPECT_EQ(pq.exit_code, 2) << pq.output;
  EXPECT_TRUE(contains(pq.output, "alpaca.parquet: not a format slideformer reads (it holds Parquet "
                                  "data); convert it to JSON Lines")) << pq.output;
  auto tools = run_cli(train_args({(formats_dir() / "tools.jsonl").string()}, tmp.path / "tools"));
  EXPECT_EQ(tools.exit_code, 2) << tools.output;
  EXPECT_TRUE(contains(tools.output, "tools.jsonl:1: \"messages[1].tool_calls\": the llama3.2 chat "
                                     "template does not render tool calls")) << tools.output;
  auto bad = run_cli(train_args({(formats_dir() / "alpaca.jsonl:-1").string(),
                                 (formats_dir() / "sharegpt.jsonl:1").string()}, tmp.path / "w"));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(contains(bad.output, "the mixing weight -1 must be a positive number")) << bad.output;
}

TEST(DataFormatsCli, WeightedFilesTrainAndResumeExactly) {
  TempDir tmp("sf-fmt-mix");
  const std::vector<std::string> data = {(formats_dir() / "alpaca.jsonl").string() + ":0.75",
                                         (formats_dir() / "sharegpt.jsonl").string() + ":0.25"};
  auto cfg = run_cli({"train", "--model", "m", "--data", data[0], "--data", data[1], "--print-config"});
  EXPECT_TRUE(contains(cfg.output, "data = [\"" + data[0] + "\", \"" + data[1] + "\"]")) << cfg.output;

  auto args = [&](const fs::path& out, const std::string& steps) {
    auto a = train_args(data, out);
    a[size_t(std::find(a.begin(), a.end(), "--steps") - a.begin() + 1)] = steps;
    a[size_t(std::find(a.begin(), a.end(), "--eval-fraction") - a.begin() + 1)] = "0.25";
    a.insert(a.end(), {"--save-every", "2", "--lr", "1e-3"});
    return a;
  };
  auto whole = run_cli(args(tmp.path / "whole", "4"));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  EXPECT_TRUE(contains(whole.output, "mix of 2 files:\n  75.0% of rows: " + data[0].substr(0, data[0].size() - 5)))
      << whole.output;
  auto first = run_cli(args(tmp.path / "split", "4"), {"SF_TEST_FAULT=sigint@step:2"});
  ASSERT_EQ(first.exit_code, 130) << first.output;
  auto rest = run_cli({"train", "--out", (tmp.path / "split").string(), "--resume", "auto",
                       "--backend", "host", "--progress", "none"});
  ASSERT_EQ(rest.exit_code, 0) << rest.output;
  expect_same_tensors(tmp.path / "whole/checkpoint-4/model.safetensors",
                      tmp.path / "split/checkpoint-4/model.safetensors");
}

// "loss L over N tokens (...), perplexity P: WHAT" -> {L, N, P}.
std::vector<double> eval_numbers(const std::string& out, const std::string& what) {
  std::smatch m;
  const std::regex re("loss ([0-9.e+-]+) over ([0-9]+) tokens \\([^)]*\\), perplexity ([0-9.e+-]+): " +
                      std::regex_replace(what, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)"));
  if (!std::regex_search(out, m, re)) return {};
  return {std::stod(m[1]), std::stod(m[2]), std::stod(m[3])};
}

TEST(DataFormatsCli, EvalTakesWhatTrainTakes) {
  const std::string alpaca = (formats_dir() / "alpaca.jsonl").string();
  const std::string txt = (formats_dir() / "plain.txt").string();
  auto r = run_cli({"eval", "--model", model_dir().string(), "--data", alpaca, "--data", txt,
                    "--seq-len", "64", "--backend", "host", "--chat-date", "26 Jul 2024"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "backend    host (--backend host)\n")) << r.output;
  EXPECT_TRUE(contains(r.output, "data       " + alpaca + ": alpaca (llama3.2 template), 4 samples")) << r.output;
  const auto a = eval_numbers(r.output, alpaca), t = eval_numbers(r.output, txt),
             all = eval_numbers(r.output, "all files");
  ASSERT_EQ(a.size(), 3u) << r.output;
  ASSERT_EQ(t.size(), 3u) << r.output;
  ASSERT_EQ(all.size(), 3u) << r.output;
  // A random model over a 50K vocabulary: about ln(50304) = 10.8; perplexity = exp(loss).
  EXPECT_NEAR(a[0], std::log(50304.0), 1.5);
  EXPECT_NEAR(a[2], std::exp(a[0]), 1e-3 * a[2]);
  EXPECT_EQ(all[1], a[1] + t[1]);
  // Plain text trains every token but the first of each document: 3 documents.
  const Tokenizer tok = Tokenizer::load(model_dir());
  int64_t txt_tokens = 0;
  for (const char* d : {"The first document has two lines:\nthis is the second one.",
                        "The second document follows two blank lines.",
                        "The third document, after a line of spaces and a tab."})
    txt_tokens += int64_t(tok.encode(d).size()) + (tok.eos_id() ? 1 : 0) - (tok.add_bos() ? 0 : 1);
  EXPECT_EQ(int64_t(t[1]), txt_tokens);

  // --tokens still reads token files; a dataset there points to --data.
  TempDir tmp("sf-fmt-eval");
  const fs::path bin = make_tokens(tmp.path / "t.bin", 600, 50);
  auto tk = run_cli({"eval", "--model", model_dir().string(), "--tokens", bin.string(),
                     "--seq-len", "64", "--backend", "host"});
  ASSERT_EQ(tk.exit_code, 0) << tk.output;
  EXPECT_EQ(eval_numbers(tk.output, bin.string()).at(1), 4 * 64);
  auto js = run_cli({"eval", "--model", model_dir().string(), "--tokens", alpaca, "--backend", "host"});
  EXPECT_EQ(js.exit_code, 2) << js.output;
  EXPECT_TRUE(contains(js.output, alpaca + ": this is JSON Lines text, not a token file; --tokens "
                                  "takes token ids (llm.c .bin or raw uint32): pass a dataset with "
                                  "--data " + alpaca)) << js.output;
  EXPECT_FALSE(contains(js.output, "multiple of 4")) << js.output;
}

}  // namespace
}  // namespace sf::test
