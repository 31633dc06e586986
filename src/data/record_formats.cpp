#include "data/record_formats.h"

#include "core/error.h"

namespace sf {

using json = nlohmann::json;

namespace {

std::string type_name(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "a number";
  }
}

const std::string& string_field(const json& o, const char* key, const std::string& where) {
  auto it = o.find(key);
  SF_REQUIRE(it != o.end(), "missing field \"", where, key, "\"");
  SF_REQUIRE(it->is_string(), "\"", where, key, "\" must be a string, got ", type_name(*it));
  return it->get_ref<const std::string&>();
}

// The roles slideformer's chat templates render (text/chat_template.h); a "tool" turn or an
// assistant's tool_calls are refused naming the template, rather than dropped.
void check_renderable(const json& e, const std::string& role, const std::string& where,
                      const ChatFormat* chat) {
  const std::string tmpl = chat ? "the " + chat->name + " chat template" : "the chat template";
  SF_REQUIRE(role == "system" || role == "user" || role == "assistant", "\"", where,
             "role\" is \"", role, "\", which ", tmpl,
             " does not render here (slideformer renders system, user and assistant turns); "
             "drop these turns or map them to one of those roles");
  auto calls = e.find("tool_calls");
  SF_REQUIRE(calls == e.end() || calls->is_null() || (calls->is_array() && calls->empty()), "\"",
             where, "tool_calls\": ", tmpl,
             " does not render tool calls here (slideformer renders plain system, user and "
             "assistant turns); drop the tool-call turns");
}

// An array of {"role", "content"} messages (field `field`, e.g. "messages" or "prompt").
std::vector<ChatMessage> parse_message_list(const json& arr, const std::string& field,
                                            const ChatFormat* chat) {
  SF_REQUIRE(arr.is_array(), "\"", field, "\" must be an array of {\"role\", \"content\"}, got ",
             type_name(arr));
  SF_REQUIRE(!arr.empty(), "\"", field, "\" is empty");
  std::vector<ChatMessage> m;
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& e = arr[i];
    const std::string where = cat(field, "[", i, "].");
    SF_REQUIRE(e.is_object(), "\"", field, "[", i, "]\" must be an object, got ", type_name(e));
    const std::string& role = string_field(e, "role", where);
    check_renderable(e, role, where, chat);
    ChatMessage c{role, string_field(e, "content", where), std::nullopt};
    if (auto r = e.find("reasoning_content"); r != e.end() && !r->is_null()) {
      SF_REQUIRE(r->is_string(), "\"", where, "reasoning_content\" must be a string, got ",
                 type_name(*r));
      c.reasoning_content = r->get<std::string>();
    }
    m.push_back(std::move(c));
  }
  return m;
}

bool has_assistant(const std::vector<ChatMessage>& m) {
  for (auto& c : m)
    if (c.role == "assistant") return true;
  return false;
}

std::vector<ChatMessage> parse_sharegpt(const json& o, const ChatFormat* chat) {
  auto it = o.find("conversations");
  SF_REQUIRE(it->is_array(), "\"conversations\" must be an array of {\"from\", \"value\"}, got ",
             type_name(*it));
  SF_REQUIRE(!it->empty(), "\"conversations\" is empty");
  std::vector<ChatMessage> m;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    const std::string where = cat("conversations[", i, "].");
    SF_REQUIRE(e.is_object(), "\"conversations[", i, "]\" must be an object, got ", type_name(e));
    const std::string& from = string_field(e, "from", where);
    const std::string role = sharegpt_role(from);
    SF_REQUIRE(!role.empty(), "\"", where, "from\" is \"", from,
               "\"; expected human or user, gpt or assistant, system, or tool, function or "
               "observation (a tool result)");
    SF_REQUIRE(role != "tool", "\"", where, "from\" is \"", from, "\", a tool turn, which ",
               chat ? "the " + chat->name + " chat template" : std::string("the chat template"),
               " does not render here (slideformer renders system, user and assistant turns); "
               "drop the tool turns");
    m.push_back({role, string_field(e, "value", where), std::nullopt});
  }
  SF_REQUIRE(has_assistant(m), "\"conversations\" has no gpt/assistant turn: nothing to learn from");
  return m;
}

// Alpaca's instruction (+ "\n\n" + input when non-empty): the user turn.
std::string alpaca_prompt(const json& o) {
  std::string p = string_field(o, "instruction", "");
  if (auto in = o.find("input"); in != o.end() && !in->is_null()) {
    SF_REQUIRE(in->is_string(), "\"input\" must be a string, got ", type_name(*in));
    if (!in->get_ref<const std::string&>().empty()) p += "\n\n" + in->get<std::string>();
  }
  return p;
}

// A chat whose loss covers only the assistant turns from message `first_trained` on.
TokenizedDoc tokenize_chat_from(const RecordContext& c, const std::vector<ChatMessage>& m,
                                size_t first_trained) {
  const RenderedChat r = render_chat(*c.chat, m, c.render);
  size_t skip = 0, total = 0;
  for (size_t i = 0; i < m.size(); ++i) {
    total += m[i].role == "assistant";
    skip += m[i].role == "assistant" && i < first_trained;
  }
  SF_CHECK(r.assistant_spans.size() == total, "the ", c.chat->name, " template rendered ",
           r.assistant_spans.size(), " assistant spans for ", total, " assistant messages");
  std::vector<std::pair<size_t, size_t>> spans(r.assistant_spans.begin() + long(skip),
                                               r.assistant_spans.end());
  SF_REQUIRE(!spans.empty(), "the ", c.chat->name,
             " chat template rendered no assistant turn to learn from");
  TokenizedDoc d = encode_with_spans(*c.tok, r.text, spans);
  return d;
}

TokenizedDoc tokenize_alpaca(const json& o, const RecordContext& c) {
  const std::string prompt = alpaca_prompt(o);
  const std::string& output = string_field(o, "output", "");
  SF_REQUIRE(!output.empty(), "\"output\" is empty");
  if (!c.chat) return tokenize_prompt_completion(*c.tok, prompt + "\n\n", output);
  return tokenize_chat(*c.tok, *c.chat,
                       std::vector<ChatMessage>{{"user", prompt, std::nullopt},
                                                {"assistant", output, std::nullopt}},
                       c.render);
}

TokenizedDoc tokenize_trl_prompt_completion(const json& o, const RecordContext& c) {
  std::vector<ChatMessage> m = parse_message_list(o.at("prompt"), "prompt", c.chat);
  const std::vector<ChatMessage> done = parse_message_list(o.at("completion"), "completion", c.chat);
  SF_REQUIRE(has_assistant(done), "\"completion\" has no assistant message: nothing to learn from");
  const size_t first = m.size();
  m.insert(m.end(), done.begin(), done.end());
  return tokenize_chat_from(c, m, first);
}

}  // namespace

std::string sharegpt_role(const std::string& from) {
  if (from == "human" || from == "user") return "user";
  if (from == "gpt" || from == "assistant") return "assistant";
  if (from == "system") return "system";
  if (from == "tool" || from == "function" || from == "observation") return "tool";
  return "";
}

DataFormat format_of_record(const json& o, const std::string& where) {
  if (o.contains("messages")) return DataFormat::messages;
  if (o.contains("conversations")) return DataFormat::sharegpt;
  if (o.contains("prompt") && o.contains("completion"))
    return o["prompt"].is_array() || o["completion"].is_array()
               ? DataFormat::chat_prompt_completion
               : DataFormat::prompt_completion;
  if (o.contains("instruction") && o.contains("output")) return DataFormat::alpaca;
  if (o.contains("text")) return DataFormat::text;
  std::string keys;
  for (auto it = o.begin(); it != o.end(); ++it) keys += (keys.empty() ? "" : ", ") + it.key();
  SF_FAIL(input, where, ": cannot tell the dataset format: expected the fields of one of "
          "{\"text\"}, {\"prompt\", \"completion\"}, {\"messages\"}, {\"conversations\"} "
          "(ShareGPT) or {\"instruction\", \"input\", \"output\"} (Alpaca), found {", keys,
          "}; rename the fields or pass --data-format");
}

bool format_renders_chat(DataFormat f) {
  return f == DataFormat::messages || f == DataFormat::sharegpt ||
         f == DataFormat::chat_prompt_completion || f == DataFormat::alpaca;
}

TokenizedDoc tokenize_record(const json& o, const RecordContext& c) {
  SF_REQUIRE(o.is_object(), "expected a JSON object, got ", type_name(o));
  switch (c.format) {
    case DataFormat::text: {
      const std::string& t = string_field(o, "text", "");
      SF_REQUIRE(!t.empty(), "\"text\" is empty");
      return tokenize_text(*c.tok, t);
    }
    case DataFormat::prompt_completion: {
      const std::string& p = string_field(o, "prompt", "");
      const std::string& q = string_field(o, "completion", "");
      SF_REQUIRE(!q.empty(), "\"completion\" is empty");
      return tokenize_prompt_completion(*c.tok, p, q);
    }
    case DataFormat::messages: {
      SF_REQUIRE(o.contains("messages"), "missing field \"messages\"");
      const auto m = parse_message_list(o.at("messages"), "messages", c.chat);
      SF_REQUIRE(has_assistant(m), "\"messages\" has no assistant message: nothing to learn from");
      return tokenize_chat(*c.tok, *c.chat, m, c.render);
    }
    case DataFormat::sharegpt:
      SF_REQUIRE(o.contains("conversations"), "missing field \"conversations\"");
      return tokenize_chat(*c.tok, *c.chat, parse_sharegpt(o, c.chat), c.render);
    case DataFormat::chat_prompt_completion:
      SF_REQUIRE(o.contains("prompt"), "missing field \"prompt\"");
      SF_REQUIRE(o.contains("completion"), "missing field \"completion\"");
      return tokenize_trl_prompt_completion(o, c);
    case DataFormat::alpaca: return tokenize_alpaca(o, c);
    case DataFormat::plain_text:
    case DataFormat::tokens: break;
  }
  SF_CHECK(false, "tokenize_record on a ", data_format_name(c.format), " file");
  return {};
}

TokenizedDoc tokenize_document(const std::string& text, const RecordContext& c) {
  return tokenize_text(*c.tok, text);
}

}  // namespace sf
