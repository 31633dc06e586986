// The record formats beyond text / prompt-completion / messages, on the committed files of
// tests/data/datasets/formats: Alpaca, ShareGPT and TRL's conversational prompt-completion give
// exactly the tokens and loss masks of the equivalent {"messages"} (or prompt/completion)
// records; a .json array reads as its .jsonl lines do; a .txt file is split on blank lines;
// tool turns and unknown ShareGPT roles are refused naming the line and the value; and a file
// is never misread as token ids (data/data_file_kind.h).
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/data_file_kind.h"
#include "data/record_formats.h"
#include "data/sample_set.h"
#include "dataset_test_util.h"

namespace sf::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

fs::path formats_dir() { return source_dir() / "tests/data/datasets/formats"; }

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The llama stand-in tokenizer's directory with Llama-3's chat template (no clock date).
DatasetOptions llama3_options() {
  DatasetOptions o;
  o.chat_format = "llama3";
  o.seq_len = 256;
  return o;
}

// Every sample of `d` as (inputs, labels).
std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> samples_of(const LoadedData& d) {
  std::vector<std::pair<std::vector<int32_t>, std::vector<int32_t>>> out;
  for (int64_t i = 0; i < d.samples->size(); ++i) {
    const int64_t n = d.samples->length(i);
    std::vector<int32_t> in(static_cast<size_t>(n)), lab(static_cast<size_t>(n));
    d.samples->read(i, 0, n, in.data(), lab.data());
    out.push_back({in, lab});
  }
  return out;
}

// Writes `records` as {"messages"} lines and loads them: the reference for the chat formats.
LoadedData load_messages(const std::vector<json>& conversations, const Tokenizer& tok,
                         const DatasetOptions& o, const fs::path& dir) {
  std::string s;
  for (auto& m : conversations) s += json{{"messages", m}}.dump() + "\n";
  write_file(dir / "reference.jsonl", s);
  return load_dataset(dir / "reference.jsonl", &tok, o);
}

json msg(const std::string& role, const std::string& content) {
  return {{"role", role}, {"content", content}};
}

TEST(RecordFormats, AlpacaIsAUserAndAnAssistantTurn) {
  auto tok = vector_tokenizer("llama");
  TempDir tmp("sf-alpaca");
  const LoadedData a = load_dataset(formats_dir() / "alpaca.jsonl", &*tok, llama3_options());
  EXPECT_EQ(a.report.format, DataFormat::alpaca);
  EXPECT_EQ(a.report.chat_format, "llama3");
  EXPECT_EQ(a.report.lines, 4);
  const LoadedData ref = load_messages(
      {json::array({msg("user", "Give the capital of France."), msg("assistant", "Paris.")}),
       json::array({msg("user", "Add the numbers.\n\n2 and 3"), msg("assistant", "5")}),
       json::array({msg("user", "Translate to German.\n\ngood morning"), msg("assistant", "Guten Morgen")}),
       json::array({msg("user", "Name a primary colour."), msg("assistant", "Red.")})},
      *tok, llama3_options(), tmp.path);
  EXPECT_EQ(samples_of(a), samples_of(ref));
  EXPECT_EQ(a.report.loss_tokens, ref.report.loss_tokens);
  EXPECT_LT(a.report.loss_tokens, a.report.tokens);
  EXPECT_NE(a.report.summary().find("alpaca (llama3 template), 4 samples from 4 records"),
            std::string::npos) << a.report.summary();

  // Without a chat template (GPT-2's tokenizer has none): prompt/completion, prompt + "\n\n".
  const Tokenizer gpt2 = Tokenizer::load(source_dir() / "tests/data/tokenizers/gpt2");
  DatasetOptions plain;
  plain.seq_len = 256;
  const LoadedData p = load_dataset(formats_dir() / "alpaca.jsonl", &gpt2, plain);
  write_file(tmp.path / "pc.jsonl",
             json{{"prompt", "Add the numbers.\n\n2 and 3\n\n"}, {"completion", "5"}}.dump() + "\n");
  const LoadedData pc = load_dataset(tmp.path / "pc.jsonl", &gpt2, plain);
  EXPECT_EQ(samples_of(p)[1], samples_of(pc)[0]);
  EXPECT_NE(p.report.summary().find("no chat template: as prompt/completion"), std::string::npos);
}

TEST(RecordFormats, ShareGptMapsFromToRoles) {
  auto tok = vector_tokenizer("llama");
  TempDir tmp("sf-sharegpt");
  const LoadedData s = load_dataset(formats_dir() / "sharegpt.jsonl", &*tok, llama3_options());
  EXPECT_EQ(s.report.format, DataFormat::sharegpt);
  const LoadedData ref = load_messages(
      {json::array({msg("system", "You are terse."), msg("user", "Capital of France?"),
                    msg("assistant", "Paris.")}),
       json::array({msg("user", "2 + 3?"), msg("assistant", "5"), msg("user", "And times 2?"),
                    msg("assistant", "10")}),
       json::array({msg("user", "Say hi."), msg("assistant", "Hi.")})},
      *tok, llama3_options(), tmp.path);
  EXPECT_EQ(samples_of(s), samples_of(ref));

  const fs::path bad = formats_dir() / "sharegpt_bad_from.jsonl";
  const std::string e = error_of([&] { load_dataset(bad, &*tok, llama3_options()); });
  EXPECT_NE(e.find(bad.string() + ":2: \"conversations[1].from\" is \"bot\""), std::string::npos) << e;
  EXPECT_NE(e.find("human or user, gpt or assistant"), std::string::npos) << e;
  write_file(tmp.path / "obs.jsonl", R"({"conversations": [{"from": "human", "value": "x"}, )"
                                     R"({"from": "observation", "value": "y"}, {"from": "gpt", "value": "z"}]})" "\n");
  const std::string t = error_of([&] { load_dataset(tmp.path / "obs.jsonl", &*tok, llama3_options()); });
  EXPECT_NE(t.find(":1: \"conversations[1].from\" is \"observation\", a tool turn, which the llama3 "
                   "chat template does not render"), std::string::npos) << t;
}

TEST(RecordFormats, TrlPromptCompletionTrainsOnTheCompletionOnly) {
  auto tok = vector_tokenizer("llama");
  TempDir tmp("sf-trl");
  const LoadedData c =
      load_dataset(formats_dir() / "chat_prompt_completion.jsonl", &*tok, llama3_options());
  EXPECT_EQ(c.report.format, DataFormat::chat_prompt_completion);
  const LoadedData ref = load_messages(
      {json::array({msg("user", "Capital of France?"), msg("assistant", "Paris.")}),
       json::array({msg("system", "You are terse."), msg("user", "2 + 3?"), msg("assistant", "5"),
                    msg("user", "And times 2?"), msg("assistant", "10")})},
      *tok, llama3_options(), tmp.path);
  const auto got = samples_of(c), want = samples_of(ref);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], want[0]);              // one assistant turn: the same as messages
  EXPECT_EQ(got[1].first, want[1].first);  // the same text and tokens ...
  // ... but the prompt's assistant turn ("5" and its <|eot_id|>) is not trained.
  const auto trained = [](const std::vector<int32_t>& l) {
    return std::count_if(l.begin(), l.end(), [](int32_t x) { return x != kIgnoreLabel; });
  };
  EXPECT_EQ(trained(want[1].second) - trained(got[1].second),
            int64_t(tok->encode("5").size()) + 1);
}

TEST(RecordFormats, ToolTurnsAreRefusedNamingTheTemplate) {
  auto tok = vector_tokenizer("llama");
  const fs::path f = formats_dir() / "tools.jsonl";
  const std::string e = error_of([&] { load_dataset(f, &*tok, llama3_options()); });
  EXPECT_NE(e.find(f.string() + ":1: \"messages[1].tool_calls\": the llama3 chat template does "
                   "not render tool calls"), std::string::npos) << e;
  TempDir tmp("sf-tool");
  write_file(tmp.path / "t.jsonl", json{{"messages", json::array({msg("user", "x"), msg("tool", "y"),
                                                                  msg("assistant", "z")})}}.dump() + "\n");
  const std::string t = error_of([&] { load_dataset(tmp.path / "t.jsonl", &*tok, llama3_options()); });
  EXPECT_NE(t.find(":1: \"messages[1].role\" is \"tool\", which the llama3 chat template does not "
                   "render"), std::string::npos) << t;
}

TEST(RecordFormats, JsonArrayReadsAsItsLines) {
  auto tok = vector_tokenizer("llama");
  const LoadedData arr = load_dataset(formats_dir() / "records.json", &*tok, llama3_options());
  const LoadedData lines = load_dataset(formats_dir() / "alpaca.jsonl", &*tok, llama3_options());
  EXPECT_EQ(arr.report.format, DataFormat::alpaca);
  EXPECT_EQ(samples_of(arr), samples_of(lines));
  EXPECT_EQ(arr.samples->fingerprint(), lines.samples->fingerprint());
  TempDir tmp("sf-array");
  write_file(tmp.path / "bad.json", R"([{"text": "fine"}, {"text": 3}])");
  const std::string e = error_of([&] { load_dataset(tmp.path / "bad.json", &*tok, llama3_options()); });
  EXPECT_NE(e.find("bad.json: record 2: \"text\" must be a string, got a number"), std::string::npos) << e;
  // A .json file of JSON Lines (as many datasets ship) reads as JSON Lines.
  fs::copy_file(formats_dir() / "alpaca.jsonl", tmp.path / "lines.json");
  EXPECT_EQ(samples_of(load_dataset(tmp.path / "lines.json", &*tok, llama3_options())), samples_of(lines));
}

TEST(RecordFormats, PlainTextIsSplitOnBlankLines) {
  const Tokenizer gpt2 = Tokenizer::load(source_dir() / "tests/data/tokenizers/gpt2");
  DatasetOptions o;
  o.seq_len = 256;
  const LoadedData t = load_dataset(formats_dir() / "plain.txt", &gpt2, o);
  EXPECT_EQ(t.report.format, DataFormat::plain_text);
  ASSERT_EQ(t.samples->size(), 3);
  TempDir tmp("sf-txt");
  std::string ref;
  for (const char* d : {"The first document has two lines:\nthis is the second one.",
                        "The second document follows two blank lines.",
                        "The third document, after a line of spaces and a tab."})
    ref += json{{"text", d}}.dump() + "\n";
  write_file(tmp.path / "ref.jsonl", ref);
  EXPECT_EQ(samples_of(t), samples_of(load_dataset(tmp.path / "ref.jsonl", &gpt2, o)));
  EXPECT_EQ(t.report.loss_tokens, t.report.tokens);
}

TEST(DataFileKind, NothingIsMisreadAsTokens) {
  TempDir tmp("sf-kind");
  const fs::path d = formats_dir();
  auto refusal = [](const fs::path& p, const std::string& format = "auto") {
    return error_of([&] { classify_data_file(p, format); });
  };
  EXPECT_EQ(classify_data_file(d / "alpaca.jsonl", "auto"), DataFileKind::dataset);
  EXPECT_EQ(classify_data_file(d / "plain.txt", "auto"), DataFileKind::dataset);
  const std::string pq = refusal(d / "alpaca.parquet");
  EXPECT_NE(pq.find("alpaca.parquet: not a format slideformer reads (it holds Parquet data); "
                    "convert it to JSON Lines, e.g. python3 -c \"import pandas; pandas.read_parquet("),
            std::string::npos) << pq;
  EXPECT_NE(pq.find("--data reads .jsonl / .json records"), std::string::npos) << pq;
  EXPECT_NE(refusal(d / "alpaca.csv").find("(it holds CSV text); convert it to JSON Lines"),
            std::string::npos);
  // Text named .bin, and a .txt forced to tokens: refused, saying what they hold.
  fs::copy_file(d / "plain.txt", tmp.path / "notes.bin");
  EXPECT_NE(refusal(tmp.path / "notes.bin").find("a .bin file is read as raw uint32 token ids, but "
                                                 "this is not token data (it holds text)"),
            std::string::npos) << refusal(tmp.path / "notes.bin");
  EXPECT_NE(refusal(d / "plain.txt", "tokens").find("--data-format tokens reads an llm.c token file"),
            std::string::npos);
  fs::copy_file(d / "alpaca.jsonl", tmp.path / "data");
  EXPECT_NE(refusal(tmp.path / "data").find("(it holds JSON Lines text); name it .jsonl"),
            std::string::npos) << refusal(tmp.path / "data");
  // Token files: the llm.c header under any name; raw uint32 only under a token extension.
  make_tokens(tmp.path / "ids.dat", 100);
  EXPECT_EQ(classify_data_file(tmp.path / "ids.dat", "auto"), DataFileKind::tokens);
  std::vector<uint32_t> raw = {1, 2, 3, 4, 5, 6, 7, 8};
  write_file(tmp.path / "raw.u32", std::string(reinterpret_cast<const char*>(raw.data()), raw.size() * 4));
  EXPECT_EQ(classify_data_file(tmp.path / "raw.u32", "auto"), DataFileKind::tokens);
  fs::copy_file(tmp.path / "raw.u32", tmp.path / "raw.dat");
  EXPECT_NE(refusal(tmp.path / "raw.dat").find("(it holds binary data)"), std::string::npos);
}

}  // namespace
}  // namespace sf::test
