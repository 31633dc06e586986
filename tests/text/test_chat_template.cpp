// Native chat-template rendering vs transformers' apply_chat_template: the rendered text must be
// identical byte for byte (tests/data/datasets/vectors.json, from scripts/gen_dataset_vectors.py,
// over the official templates in tests/data/datasets/templates and Qwen3's real
// tokenizer_config.json in ../shared/data/tokenizers/qwen3, skipped when absent).
#include <gtest/gtest.h>

#include <ctime>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/chat_template.h"
#include "test_util.h"

namespace sf {
namespace {

using json = nlohmann::json;

json read_json(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

const json& vectors() {
  static const json v = read_json(test::source_dir() / "tests/data/datasets/vectors.json");
  return v;
}

std::filesystem::path template_config(const std::string& name) {
  if (name.starts_with("shared:"))
    return test::source_dir() / ".." / "shared" / "data" / "tokenizers" / name.substr(7) /
           "tokenizer_config.json";
  return test::source_dir() / "tests/data/datasets/templates" / name / "tokenizer_config.json";
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

const json& conversation(const std::string& c) {
  for (const auto& e : vectors()["conversations"])
    if (e["case"] == c) return e["messages"];
  throw std::runtime_error("no conversation " + c);
}

// A config's format with its bos/eos token strings, as the dataset loader sets them.
ChatFormat format_of(const std::filesystem::path& cfg_path) {
  const json cfg = read_json(cfg_path);
  ChatFormat f = detect_chat_format(cfg["chat_template"], cfg_path.string());
  if (cfg["bos_token"].is_string()) f.bos_token = cfg["bos_token"];
  if (cfg["eos_token"].is_string()) f.eos_token = cfg["eos_token"];
  return f;
}

TEST(ChatTemplate, RendersAsTransformersDoes) {
  int checked = 0, refused = 0, skipped = 0;
  for (const auto& e : vectors()["chat"]) {
    const std::string name = e["template"], cs = e["case"];
    const auto path = template_config(name);
    if (!std::filesystem::exists(path)) {
      ++skipped;
      continue;
    }
    SCOPED_TRACE(name + " / " + cs);
    const ChatFormat f = format_of(path);
    const auto msgs = messages_of(conversation(cs));
    ChatRenderOptions opt;
    if (e.contains("date_string")) opt.date_string = e["date_string"];
    if (e.contains("error")) {
      EXPECT_THROW(render_chat(f, msgs, opt), Error) << "transformers: " << e["error"];
      ++refused;
      continue;
    }
    const RenderedChat r = render_chat(f, msgs, opt);
    EXPECT_EQ(r.text, e["text"].get<std::string>());
    // Every span ends with the end-of-turn text and there is one per assistant message.
    size_t n_assistant = 0;
    for (const auto& m : msgs) n_assistant += m.role == "assistant";
    EXPECT_EQ(r.assistant_spans.size(), n_assistant);
    const std::string eot = f.family == ChatFamily::chatml   ? "<|im_end|>"
                            : f.family == ChatFamily::llama3 ? "<|eot_id|>"
                                                             : f.eos_token;
    for (auto [b, en] : r.assistant_spans) {
      ASSERT_LE(b, en);
      ASSERT_LE(en, r.text.size());
      EXPECT_TRUE(r.text.substr(b, en - b).ends_with(eot)) << r.text.substr(b, en - b);
    }
    ++checked;
  }
  EXPECT_GE(checked, 80);  // 9 committed templates x 12 conversations, minus refusals
  EXPECT_GE(refused, 15);
  if (skipped) std::cerr << "skipped " << skipped << " cases: ../shared/data/tokenizers/qwen3 absent\n";
}

TEST(ChatTemplate, RecognisesFamiliesAndVariants) {
  const std::pair<const char*, const char*> expect[] = {
      {"qwen2", "chatml"},          {"qwen2.5", "qwen2.5"},        {"llama3", "llama3"},
      {"llama3.1", "llama3.1"},     {"llama3.2", "llama3.2"},      {"mistral-v1", "mistral"},
      {"mistral-legacy", "mistral-legacy"}, {"mistral-v3", "mistral-v3"},
      {"mistral-nemo", "mistral-tekken"}};
  for (auto [dir, name] : expect) {
    const ChatFormat f = format_of(template_config(dir));
    EXPECT_EQ(f.name, name) << dir;
  }
  EXPECT_EQ(format_of(template_config("qwen2")).default_system, "You are a helpful assistant.");
  EXPECT_EQ(format_of(template_config("llama3.1")).date_string, "26 Jul 2024");
  if (std::filesystem::exists(template_config("shared:qwen3"))) {
    const ChatFormat f = format_of(template_config("shared:qwen3"));
    EXPECT_EQ(f.name, "qwen3");
    EXPECT_TRUE(f.qwen3_think);
    EXPECT_EQ(f.default_system, "");
  }
}

// --chat-format NAME must render exactly what the recognised template renders.
TEST(ChatTemplate, ForcedFormatsEqualRecognisedOnes) {
  const std::pair<const char*, const char*> pairs[] = {
      {"qwen2.5", "qwen2.5"}, {"llama3", "llama3"}, {"llama3.1", "llama3.1"},
      {"mistral-v1", "mistral"}, {"mistral-legacy", "mistral-legacy"},
      {"mistral-v3", "mistral-v3"}, {"mistral-nemo", "mistral-tekken"}};
  for (auto [dir, name] : pairs) {
    const ChatFormat detected = format_of(template_config(dir));
    ChatFormat forced = named_chat_format(name);
    forced.bos_token = detected.bos_token;
    forced.eos_token = detected.eos_token;
    for (const auto& c : vectors()["conversations"]) {
      const auto msgs = messages_of(c["messages"]);
      std::string a, b;
      try { a = render_chat(detected, msgs).text; } catch (const Error&) { a = "<refused>"; }
      try { b = render_chat(forced, msgs).text; } catch (const Error&) { b = "<refused>"; }
      EXPECT_EQ(a, b) << dir << " / " << c["case"];
    }
  }
  EXPECT_THROW(named_chat_format("gemma"), Error);
}

TEST(ChatTemplate, UnknownTemplateNamesFileAndSuggestsChatFormat) {
  const std::string gemma =
      "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\n' + "
      "message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}";
  try {
    detect_chat_format(gemma, "/models/gemma/tokenizer_config.json");
    FAIL() << "accepted an unknown template";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("/models/gemma/tokenizer_config.json"), std::string::npos) << m;
    EXPECT_NE(m.find("--chat-format chatml|llama3|mistral"), std::string::npos) << m;
  }
  try {
    detect_chat_format("", "/models/base/tokenizer_config.json");
    FAIL() << "accepted an empty template";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--chat-format"), std::string::npos);
  }
}

TEST(ChatTemplate, Llama32DateDefaultsToToday) {
  const ChatFormat f = format_of(template_config("llama3.2"));
  EXPECT_TRUE(f.date_from_clock);
  std::vector<ChatMessage> m = {{"user", "hi", {}}, {"assistant", "yo", {}}};
  static const char* months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                 "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char want[64];
  std::snprintf(want, sizeof want, "Today Date: %02d %s %d\n", tm.tm_mday, months[tm.tm_mon],
                tm.tm_year + 1900);
  const std::string text = render_chat(f, m).text;
  EXPECT_NE(text.find(want), std::string::npos) << text;  // (fails only across midnight)
}

TEST(ChatTemplate, SpansCoverAssistantOutputOnly) {
  ChatFormat f = named_chat_format("llama3.1");
  f.bos_token = "<|begin_of_text|>";
  std::vector<ChatMessage> m = {
      {"system", "S", {}}, {"user", "U1", {}}, {"assistant", " A1 ", {}}, {"user", "U2", {}},
      {"assistant", "A2", {}}};
  const RenderedChat r = render_chat(f, m);
  ASSERT_EQ(r.assistant_spans.size(), 2u);
  auto span = [&](int i) {
    auto [b, e] = r.assistant_spans[size_t(i)];
    return r.text.substr(b, e - b);
  };
  EXPECT_EQ(span(0), "A1<|eot_id|>");
  EXPECT_EQ(span(1), "A2<|eot_id|>");

  ChatFormat q = named_chat_format("qwen3");
  const RenderedChat rq = render_chat(q, std::vector<ChatMessage>{{"user", "Q", {}}, {"assistant", "A", {}}});
  ASSERT_EQ(rq.assistant_spans.size(), 1u);
  EXPECT_EQ(rq.text.substr(rq.assistant_spans[0].first,
                           rq.assistant_spans[0].second - rq.assistant_spans[0].first),
            "<think>\n\n</think>\n\nA<|im_end|>");
  EXPECT_TRUE(rq.text.ends_with("<|im_end|>\n"));

  ChatFormat mi = named_chat_format("mistral");
  mi.bos_token = "<s>";
  mi.eos_token = "</s>";
  const RenderedChat rm = render_chat(mi, std::vector<ChatMessage>{{"user", "Q", {}}, {"assistant", "A", {}}});
  ASSERT_EQ(rm.assistant_spans.size(), 1u);
  EXPECT_EQ(rm.text.substr(rm.assistant_spans[0].first), " A</s>");
}

TEST(ChatTemplate, RefusesUnknownRolesAndEmptyConversations) {
  ChatFormat f = named_chat_format("chatml");
  EXPECT_THROW(render_chat(f, std::vector<ChatMessage>{}), Error);
  try {
    render_chat(f, std::vector<ChatMessage>{{"user", "a", {}}, {"tool", "b", {}}});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("messages[1].role"), std::string::npos) << e.what();
  }
}

TEST(ChatTemplate, PythonStripSemantics) {
  EXPECT_EQ(py_strip("  a b \n\t"), "a b");
  EXPECT_EQ(py_strip("\x1c" "x" "\x1f"), "x");              // CPython counts 0x1c-0x1f as space
  EXPECT_EQ(py_strip("\xc2\xa0" "x" "\xe3\x80\x80"), "x");  // U+00A0, U+3000
  EXPECT_EQ(py_strip("\xe2\x80\x8b" "x"), "\xe2\x80\x8b" "x");  // U+200B is not whitespace
  EXPECT_EQ(py_strip("   "), "");
  EXPECT_EQ(py_strip("猫 "), "猫");
}

}  // namespace
}  // namespace sf
