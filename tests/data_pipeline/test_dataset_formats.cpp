// Dataset formats -> tokens and loss masks, token by token: against transformers'
// apply_chat_template / tokenizers (tests/data/datasets/vectors.json) and on small hand-checked
// examples (exact -100 positions), plus JSONL loading, format detection and bad lines.
#include <gtest/gtest.h>

#include <chrono>

#include "core/error.h"
#include "data/sample_set.h"
#include "dataset_test_util.h"

namespace sf {
namespace {

using json = nlohmann::json;

std::vector<uint8_t> as_mask(const json& j) {
  std::vector<uint8_t> m;
  for (const auto& v : j) m.push_back(uint8_t(v.get<int>()));
  return m;
}

std::vector<ChatMessage> messages_of(const json& msgs) {
  std::vector<ChatMessage> m;
  for (const auto& j : msgs) {
    ChatMessage c{j["role"], j["content"], std::nullopt};
    if (j.contains("reasoning_content")) c.reasoning_content = j["reasoning_content"].get<std::string>();
    m.push_back(std::move(c));
  }
  return m;
}

TEST(DatasetFormats, TextAndPromptCompletionMatchTokenizers) {
  int checked = 0;
  for (const auto& e : test::dataset_vectors()["documents"]) {
    auto tok = test::vector_tokenizer(e["tokenizer"]);
    if (!tok) continue;
    TokenizedDoc d = e.contains("text")
                         ? tokenize_text(*tok, e["text"])
                         : tokenize_prompt_completion(*tok, e["prompt"], e["completion"]);
    SCOPED_TRACE(e.dump());
    EXPECT_EQ(d.tokens, e["ids"].get<std::vector<int32_t>>());
    // The first token is never a label: its flag does not matter.
    std::vector<uint8_t> want = as_mask(e["mask"]);
    ASSERT_EQ(d.target.size(), want.size());
    for (size_t i = 1; i < want.size(); ++i) EXPECT_EQ(d.target[i], want[i]) << "token " << i;
    EXPECT_FALSE(d.mask_fallback);
    ++checked;
  }
  EXPECT_GE(checked, 20);
}

ChatFormat vector_format(const std::string& name, const Tokenizer& tok) {
  const auto cfg_path = name.starts_with("shared:")
                            ? test::source_dir() / ".." / "shared/data/tokenizers" / name.substr(7) /
                                  "tokenizer_config.json"
                            : test::source_dir() / "tests/data/datasets/templates" / name /
                                  "tokenizer_config.json";
  const json cfg = test::read_json_file(cfg_path);
  ChatFormat f = detect_chat_format(cfg["chat_template"], cfg_path.string());
  f.bos_token = cfg["bos_token"].is_string() ? cfg["bos_token"].get<std::string>() : "";
  f.eos_token = cfg["eos_token"].get<std::string>();
  (void)tok;
  return f;
}

// Token ids and the assistant mask equal transformers' apply_chat_template(tokenize=True,
// return_assistant_tokens_mask=True) for every template, conversation and tokenizer family.
TEST(DatasetFormats, ChatTokensAndAssistantMaskMatchTransformers) {
  int checked = 0, unavailable = 0;
  std::map<std::string, json> convs;
  for (const auto& c : test::dataset_vectors()["conversations"]) convs[c["case"]] = c["messages"];
  for (const auto& e : test::dataset_vectors()["chat"]) {
    if (e.contains("error")) continue;
    auto tok = test::vector_tokenizer(e["tokenizer"]);
    if (!tok) {  // the Qwen3 tokenizer lives in ../shared/data, absent outside CI and dev boxes
      ++unavailable;
      continue;
    }
    const std::string name = e["template"];
    SCOPED_TRACE(name + " / " + e["case"].get<std::string>());
    const ChatFormat f = vector_format(name, *tok);
    ChatRenderOptions opt;
    if (e.contains("date_string")) opt.date_string = e["date_string"];
    const auto msgs = messages_of(convs[e["case"]]);
    TokenizedDoc d = tokenize_chat(*tok, f, msgs, opt);
    EXPECT_EQ(d.tokens, e["ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(d.target, as_mask(e["mask"]));
    EXPECT_FALSE(d.mask_fallback);
    ++checked;
  }
  EXPECT_GE(checked + unavailable, 70);
  EXPECT_GE(checked, 60);  // the committed tokenizers alone cover these
}

// The labels of a loaded sample, decoded run by run: each maximal run of trained labels.
std::vector<std::string> trained_runs(const Tokenizer& tok, const SampleSet& s, int64_t i) {
  const int64_t n = s.length(i);
  std::vector<int32_t> in(static_cast<size_t>(n)), lab(static_cast<size_t>(n));
  s.read(i, 0, n, in.data(), lab.data());
  std::vector<std::string> runs;
  std::vector<int32_t> cur;
  for (int64_t t = 0; t <= n; ++t) {
    if (t < n && lab[size_t(t)] != kIgnoreLabel) {
      cur.push_back(lab[size_t(t)]);
    } else if (!cur.empty()) {
      runs.push_back(tok.decode(cur));
      cur.clear();
    }
  }
  return runs;
}

TEST(DatasetFormats, PromptCompletionExactIgnorePositions) {
  auto tok = test::vector_tokenizer("llama");
  test::TempDir dir("sf-ds");
  test::write_file(dir.path / "pc.jsonl",
                   R"({"prompt": "The capital of France is", "completion": " Paris."})" "\n");
  DatasetOptions o;
  o.seq_len = 64;
  LoadedData d = load_dataset(dir.path / "pc.jsonl", &*tok, o);
  EXPECT_EQ(d.report.format, DataFormat::prompt_completion);
  ASSERT_EQ(d.samples->size(), 1);
  const int32_t bos = *tok->bos_id(), eos = *tok->eos_id();
  // BOS The ␣capital ␣of ␣France ␣is | ␣Paris . EOS
  const auto p = tok->encode("The capital of France is"), c = tok->encode(" Paris.");
  ASSERT_EQ(p.size(), 5u);
  ASSERT_EQ(c.size(), 2u);
  std::vector<int32_t> in(8), lab(8);
  ASSERT_EQ(d.samples->length(0), 8);
  d.samples->read(0, 0, 8, in.data(), lab.data());
  EXPECT_EQ(in, (std::vector<int32_t>{bos, p[0], p[1], p[2], p[3], p[4], c[0], c[1]}));
  EXPECT_EQ(lab, (std::vector<int32_t>{-100, -100, -100, -100, -100, c[0], c[1], eos}));
}

TEST(DatasetFormats, MultiTurnChatWithSystemExactLabels) {
  auto tok = test::vector_tokenizer("llama");
  test::TempDir dir("sf-ds");
  test::write_file(dir.path / "chat.jsonl",
                   R"({"messages": [{"role": "system", "content": "Be brief."}, )"
                   R"({"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}, )"
                   R"({"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Goodbye"}]})" "\n");
  DatasetOptions o;
  o.seq_len = 256;
  o.chat_format = "llama3.1";  // the stand-in tokenizer has no chat_template
  LoadedData d = load_dataset(dir.path / "chat.jsonl", &*tok, o);
  EXPECT_EQ(d.report.chat_format, "llama3.1");
  ASSERT_EQ(d.samples->size(), 1);
  EXPECT_EQ(trained_runs(*tok, *d.samples, 0),
            (std::vector<std::string>{"Hello there<|eot_id|>", "Goodbye<|eot_id|>"}));
  // Position by position: inputs spell the rendered conversation; a label is set exactly where
  // the next token belongs to an assistant answer.
  const int64_t n = d.samples->length(0);
  std::vector<int32_t> in(static_cast<size_t>(n)), lab(static_cast<size_t>(n));
  d.samples->read(0, 0, n, in.data(), lab.data());
  const std::string header = "<|start_header_id|>assistant<|end_header_id|>\n\n";
  std::vector<int32_t> all = in;
  all.push_back(lab.back());
  std::string prefix;
  int answers_seen = 0;
  bool inside = false;
  for (int64_t t = 0; t < n; ++t) {
    prefix += tok->decode(std::vector<int32_t>{all[size_t(t)]});
    if (prefix.ends_with(header)) {
      inside = true;
      ++answers_seen;
    }
    if (inside) {
      EXPECT_EQ(lab[size_t(t)], all[size_t(t) + 1]) << "position " << t;
    } else {
      EXPECT_EQ(lab[size_t(t)], kIgnoreLabel) << "position " << t << " after " << prefix;
    }
    if (inside && all[size_t(t) + 1] == *tok->eos_id()) inside = false;  // <|eot_id|> is the last
  }
  EXPECT_EQ(answers_seen, 2);
}

TEST(DatasetFormats, TextGetsBosAndEosFromTheConfig) {
  auto tok = test::vector_tokenizer("llama");
  test::TempDir dir("sf-ds");
  test::write_file(dir.path / "t.jsonl", "{\"text\": \"Hello world\"}\n\n{\"text\": \"x\"}\n");
  DatasetOptions o;
  o.seq_len = 16;
  LoadedData d = load_dataset(dir.path / "t.jsonl", &*tok, o);
  EXPECT_EQ(d.report.format, DataFormat::text);
  EXPECT_EQ(d.report.lines, 2);  // the blank line is not a sample
  ASSERT_EQ(d.samples->size(), 2);
  std::vector<int32_t> in(3), lab(3);
  d.samples->read(0, 0, 3, in.data(), lab.data());
  const auto ids = tok->encode("Hello world");
  EXPECT_EQ(in, (std::vector<int32_t>{*tok->bos_id(), ids[0], ids[1]}));
  EXPECT_EQ(lab, (std::vector<int32_t>{ids[0], ids[1], *tok->eos_id()}));
}

TEST(DatasetFormats, DetectsFormatAndHonoursOverride) {
  auto tok = test::vector_tokenizer("llama");
  test::TempDir dir("sf-ds");
  test::write_file(dir.path / "a.jsonl", "\n{\"prompt\": \"a\", \"completion\": \"b\", \"text\": \"t\"}\n");
  DatasetOptions o;
  o.seq_len = 16;
  EXPECT_EQ(load_dataset(dir.path / "a.jsonl", &*tok, o).report.format, DataFormat::prompt_completion);
  o.format = "text";
  EXPECT_EQ(load_dataset(dir.path / "a.jsonl", &*tok, o).report.format, DataFormat::text);
  o.format = "auto";
  test::write_file(dir.path / "b.jsonl", "{\"body\": \"a\", \"title\": 3}\n");
  try {
    load_dataset(dir.path / "b.jsonl", &*tok, o);
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("b.jsonl:1: cannot tell the dataset format"), std::string::npos) << m;
    EXPECT_NE(m.find("body, title"), std::string::npos) << m;
  }
  o.format = "parquet";
  EXPECT_THROW(load_dataset(dir.path / "a.jsonl", &*tok, o), Error);
}

TEST(DatasetFormats, UnknownChatTemplateIsAClearError) {
  auto tok = test::vector_tokenizer("llama");  // no chat_template
  test::TempDir dir("sf-ds");
  test::write_file(dir.path / "c.jsonl",
                   R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})" "\n");
  DatasetOptions o;
  o.seq_len = 16;
  o.tokenizer_dir = "/models/x";
  try {
    load_dataset(dir.path / "c.jsonl", &*tok, o);
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("/models/x/tokenizer_config.json"), std::string::npos) << m;
    EXPECT_NE(m.find("--chat-format"), std::string::npos) << m;
  }
}

// Every kind of bad line: a FILE:LINE error, or skipped and counted with skip_bad_lines.
TEST(DatasetFormats, BadLinesAreFileLineErrorsOrSkippedAndCounted) {
  auto tok = test::vector_tokenizer("llama");
  test::TempDir dir("sf-ds");
  const auto f = dir.path / "bad.jsonl";
  test::write_file(f,
                   "{\"prompt\": \"p\", \"completion\": \"ok\"}\n"     // 1 good
                   "{\"prompt\": \"p\", \"completion\": \"ok\"\n"      // 2 truncated JSON
                   "{\"prompt\": \"p\"}\n"                             // 3 missing field
                   "{\"prompt\": \"p\", \"completion\": 7}\n"          // 4 wrong type
                   "{\"prompt\": \"p\", \"completion\": \"\"}\n"       // 5 empty completion
                   "[1, 2]\n"                                          // 6 not an object
                   "{\"prompt\": \"q\", \"completion\": \"fine\"}\r\n"); // 7 good (CRLF)
  DatasetOptions o;
  o.seq_len = 16;
  try {
    load_dataset(f, &*tok, o);
    FAIL();
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_TRUE(m.starts_with(f.string() + ":2: invalid JSON")) << m;
    EXPECT_NE(m.find("--skip-bad-lines"), std::string::npos) << m;
  }
  o.skip_bad_lines = true;
  LoadedData d = load_dataset(f, &*tok, o);
  EXPECT_EQ(d.report.lines, 7);
  EXPECT_EQ(d.report.bad_lines, 5);
  EXPECT_EQ(d.samples->size(), 2);
  ASSERT_EQ(d.report.bad_examples.size(), 5u);
  const char* want[] = {":2: invalid JSON", ":3: missing field \"completion\"",
                        ":4: \"completion\" must be a string, got a number",
                        ":5: \"completion\" is empty", ":6: expected a JSON object, got an array"};
  for (int i = 0; i < 5; ++i)
    EXPECT_TRUE(d.report.bad_examples[size_t(i)].starts_with(f.string() + want[i]))
        << d.report.bad_examples[size_t(i)];
  EXPECT_NE(d.report.summary().find("5 bad records skipped"), std::string::npos);
}

TEST(DatasetFormats, BadChatLines) {
  auto tok = test::vector_tokenizer("mistral");
  test::TempDir dir("sf-ds");
  const auto f = dir.path / "chat.jsonl";
  test::write_file(f,
                   R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})" "\n"
                   R"({"messages": "hello"})" "\n"
                   R"({"messages": [{"role": "user", "content": "a"}]})" "\n"
                   R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant"}]})" "\n"
                   R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]})" "\n"
                   R"({"messages": [{"role": "tool", "content": "a"}, {"role": "assistant", "content": "c"}]})" "\n"
                   R"({"messages": [{"role": "user", "content": null}, {"role": "assistant", "content": "c"}]})" "\n"
                   R"({"messages": []})" "\n");
  DatasetOptions o;
  o.seq_len = 64;
  o.chat_format = "mistral";
  o.skip_bad_lines = true;
  LoadedData d = load_dataset(f, &*tok, o);
  EXPECT_EQ(d.samples->size(), 1);
  EXPECT_EQ(d.report.bad_lines, 7);
  const char* want[] = {":2: \"messages\" must be an array", ":3: \"messages\" has no assistant message",
                        ":4: missing field \"messages[1].content\"",
                        ":5: the mistral chat template needs roles alternating"};
  for (int i = 0; i < 4; ++i)
    EXPECT_TRUE(d.report.bad_examples[size_t(i)].starts_with(f.string() + want[i]))
        << d.report.bad_examples[size_t(i)];
  EXPECT_NE(d.report.bad_examples[4].find("\"messages[0].role\" is \"tool\", which the mistral chat template does not render"), std::string::npos)
      << d.report.bad_examples[4];
}

TEST(DatasetFormats, TokenFileWindows) {
  test::TempDir dir("sf-ds");
  std::vector<uint32_t> ids(101);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = uint32_t(i * 7 % 50 + 1);
  write_token_file(dir.path / "d.bin", ids.data(), int64_t(ids.size()));
  DatasetOptions o;
  o.seq_len = 16;
  LoadedData d = load_dataset(dir.path / "d.bin", nullptr, o);
  EXPECT_EQ(d.report.format, DataFormat::tokens);
  ASSERT_EQ(d.samples->size(), 7);  // 100 predictions in windows of 16: 6 full + 4
  EXPECT_EQ(d.samples->length(6), 4);
  std::vector<int32_t> in(16), lab(16);
  d.samples->read(2, 0, 16, in.data(), lab.data());
  for (int t = 0; t < 16; ++t) {
    EXPECT_EQ(in[size_t(t)], int32_t(ids[size_t(32 + t)]));
    EXPECT_EQ(lab[size_t(t)], int32_t(ids[size_t(33 + t)]));
  }
  EXPECT_EQ(d.samples->max_token_id(), 50u);
  const DataSplit sp = split_dataset(*d.samples, 0.3);  // the stream's tail: 2 windows
  EXPECT_EQ(sp.eval, (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(sp.train.size(), 5u);
}

// The whole path for a real model: tokenizer_config.json's template recognised, a JSONL chat file
// loaded, labels = transformers' ids with its assistant mask (shifted).
TEST(DatasetFormats, Qwen3ChatFileEndToEnd) {
  auto tok = test::vector_tokenizer("qwen3");
  if (!tok) GTEST_SKIP() << "../shared/data/tokenizers/qwen3 absent";
  const json* want = nullptr;
  for (const auto& e : test::dataset_vectors()["chat"])
    if (e["template"] == "shared:qwen3" && e["case"] == "multi_turn_system") want = &e;
  ASSERT_NE(want, nullptr);
  json line;
  for (const auto& c : test::dataset_vectors()["conversations"])
    if (c["case"] == "multi_turn_system") line = {{"messages", c["messages"]}};
  test::TempDir dir("sf-ds");
  test::write_file(dir.path / "chat.jsonl", line.dump() + "\n");
  DatasetOptions o;
  o.seq_len = 512;
  LoadedData d = load_dataset(dir.path / "chat.jsonl", &*tok, o);
  EXPECT_EQ(d.report.format, DataFormat::messages);
  EXPECT_EQ(d.report.chat_format, "qwen3");
  const auto ids = (*want)["ids"].get<std::vector<int32_t>>();
  const auto mask = as_mask((*want)["mask"]);
  const int64_t n = d.samples->length(0);
  ASSERT_EQ(n + 1, int64_t(ids.size()));
  std::vector<int32_t> in(static_cast<size_t>(n)), lab(static_cast<size_t>(n));
  d.samples->read(0, 0, n, in.data(), lab.data());
  for (int64_t t = 0; t < n; ++t) {
    EXPECT_EQ(in[size_t(t)], ids[size_t(t)]);
    EXPECT_EQ(lab[size_t(t)], mask[size_t(t) + 1] ? ids[size_t(t) + 1] : kIgnoreLabel) << t;
  }
}

// Load speed on the real corpus (run with --gtest_also_run_disabled_tests).
TEST(DatasetFormats, DISABLED_LoadSpeedSotu) {
  auto tok = test::vector_tokenizer("qwen3");
  const auto p = test::source_dir() / ".." / "shared/data/corpus/sotu.jsonl";
  if (!tok || !std::filesystem::exists(p)) GTEST_SKIP();
  DatasetOptions o;
  o.seq_len = 1024;
  const auto t0 = std::chrono::steady_clock::now();
  LoadedData d = load_dataset(p, &*tok, o);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::cerr << d.report.summary() << "\n" << double(std::filesystem::file_size(p)) / 1e6 / s
            << " MB/s\n";
}

}  // namespace
}  // namespace sf
