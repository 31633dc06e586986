#include "text/chat_template.h"

#include <ctime>
#include <regex>

#include "core/error.h"

namespace sf {

namespace {

// ---- Python string semantics on UTF-8 ----------------------------------------------------

// Code point at s[i] (UTF-8 assumed valid; a stray byte counts as itself) and its length.
char32_t cp_at(std::string_view s, size_t i, int* len) {
  const auto b = uint8_t(s[i]);
  int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 1;
  if (i + size_t(n) > s.size()) n = 1;
  char32_t c = n == 1 ? b : n == 2 ? (b & 0x1f) : n == 3 ? (b & 0x0f) : (b & 0x07);
  for (int k = 1; k < n; ++k) c = (c << 6) | (uint8_t(s[i + size_t(k)]) & 0x3f);
  *len = n;
  return c;
}

// str.isspace() of CPython (Unicode White_Space plus the ASCII separators 0x1c-0x1f).
bool py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
         c == 0x202f || c == 0x205f || c == 0x3000;
}

size_t lead_space(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    int n;
    if (!py_space(cp_at(s, i, &n))) break;
    i += size_t(n);
  }
  return i;
}

// Byte length of s without its trailing Python whitespace.
size_t trail_keep(std::string_view s) {
  size_t keep = 0, i = 0;
  while (i < s.size()) {
    int n;
    const bool sp = py_space(cp_at(s, i, &n));
    i += size_t(n);
    if (!sp) keep = i;
  }
  return keep;
}

std::string strip_chars(std::string_view s, char c, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && s[b] == c) ++b;
  if (right)
    while (e > b && s[e - 1] == c) --e;
  return std::string(s.substr(b, e - b));
}

// ---- detection helpers ---------------------------------------------------------------------

bool has(const std::string& s, std::string_view needle) {
  return s.find(needle) != std::string::npos;
}

// Decodes the escapes of a Jinja (Python) string literal body.
std::string unescape_literal(std::string_view s) {
  std::string r;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      r += s[i];
      continue;
    }
    const char c = s[++i];
    r += c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c;
  }
  return r;
}

// A literal default system prompt: '<|im_start|>system\n TEXT <|im_end|>' inside one string
// literal (TEXT holds no quote, so it is not an expression like ' + messages[0].content + ').
std::string chatml_default_system(const std::string& t) {
  const std::string open = "<|im_start|>system";
  for (size_t p = t.find(open); p != std::string::npos; p = t.find(open, p + 1)) {
    size_t q = p + open.size();
    if (t.compare(q, 2, "\\n") == 0) q += 2;
    else if (q < t.size() && t[q] == '\n') q += 1;
    else continue;
    const size_t e = t.find("<|im_end|>", q);
    if (e == std::string::npos) break;
    const std::string body = t.substr(q, e - q);
    if (body.empty() || body.find_first_of("'\"") != std::string::npos) continue;
    return unescape_literal(body);
  }
  return {};
}

bool has_regex(const std::string& s, const char* re) {
  return std::regex_search(s, std::regex(re));
}

}  // namespace

std::string today_date_string() {
  static const char* months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                 "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02d %s %d", tm.tm_mday, months[tm.tm_mon], tm.tm_year + 1900);
  return buf;
}

namespace {

// ---- rendering ----------------------------------------------------------------------------

struct Out {
  RenderedChat r;
  void add(std::string_view s) { r.text += s; }
  size_t mark() const { return r.text.size(); }
  void span(size_t b) { r.assistant_spans.emplace_back(b, r.text.size()); }
};

void check_roles(std::span<const ChatMessage> m) {
  SF_REQUIRE(!m.empty(), "\"messages\" is empty");
  for (size_t i = 0; i < m.size(); ++i)
    SF_REQUIRE(m[i].role == "system" || m[i].role == "user" || m[i].role == "assistant",
               "messages[", i, "].role is \"", m[i].role,
               "\"; expected \"system\", \"user\" or \"assistant\"");
}

void render_chatml(const ChatFormat& f, std::span<const ChatMessage> m, Out& o) {
  const bool sys0 = m[0].role == "system";
  if (f.chatml_bos) o.add(f.bos_token);
  if (sys0) {
    o.add("<|im_start|>system\n");
    o.add(m[0].content);
    o.add("<|im_end|>\n");
  } else if (!f.default_system.empty()) {
    o.add("<|im_start|>system\n");
    o.add(f.default_system);
    o.add("<|im_end|>\n");
  }
  // Qwen3: the last user turn that is not a wrapped tool response (else the last message).
  size_t last_query = m.size() - 1;
  for (size_t k = m.size(); k-- > 0;) {
    const std::string& c = m[k].content;
    if (m[k].role == "user" &&
        !(c.starts_with("<tool_response>") && c.ends_with("</tool_response>"))) {
      last_query = k;
      break;
    }
  }
  for (size_t i = sys0 ? 1 : 0; i < m.size(); ++i) {
    const ChatMessage& msg = m[i];
    if (msg.role != "assistant") {
      o.add("<|im_start|>");
      o.add(msg.role);
      o.add("\n");
      o.add(msg.content);
      o.add("<|im_end|>\n");
      continue;
    }
    o.add("<|im_start|>assistant\n");
    const size_t b = o.mark();
    if (!f.qwen3_think) {
      o.add(msg.content);
    } else {
      std::string content = msg.content, reasoning;
      if (msg.reasoning_content) {
        reasoning = *msg.reasoning_content;
      } else if (const size_t close = content.find("</think>"); close != std::string::npos) {
        // content.split('</think>')[-1].lstrip('\n'), and the part before the first
        // </think>, right-stripped of newlines, after its last <think>, left-stripped.
        const size_t last_close = content.rfind("</think>");
        std::string before = strip_chars(std::string_view(content).substr(0, close), '\n', false, true);
        if (const size_t open = before.rfind("<think>"); open != std::string::npos)
          before = before.substr(open + 7);
        reasoning = strip_chars(before, '\n', true, false);
        content = strip_chars(std::string_view(content).substr(last_close + 8), '\n', true, false);
      }
      const bool last = i + 1 == m.size();
      if (i > last_query && (last || !reasoning.empty())) {
        o.add("<think>\n");
        o.add(strip_chars(reasoning, '\n', true, true));
        o.add("\n</think>\n\n");
        o.add(strip_chars(content, '\n', true, false));
      } else {
        o.add(content);
      }
    }
    o.add("<|im_end|>");
    o.span(b);
    o.add("\n");
  }
}

void render_llama3(const ChatFormat& f, const ChatRenderOptions& opt,
                   std::span<const ChatMessage> m, Out& o) {
  size_t first = 0;
  if (f.llama31_system) {
    if (f.llama3_bos) o.add(f.bos_token);
    std::string sys;
    if (m[0].role == "system") {
      sys = py_strip(m[0].content);
      first = 1;
    }
    const std::string date = !opt.date_string.empty() ? opt.date_string
                             : f.date_from_clock      ? today_date_string()
                                                      : f.date_string;
    o.add("<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: ");
    o.add(date);
    o.add("\n\n");
    o.add(sys);
    o.add("<|eot_id|>");
  }
  for (size_t i = first; i < m.size(); ++i) {
    if (i == 0 && f.llama3_bos && !f.llama31_system) o.add(f.bos_token);
    o.add("<|start_header_id|>");
    o.add(m[i].role);
    o.add("<|end_header_id|>\n\n");
    const size_t b = o.mark();
    o.add(py_strip(m[i].content));
    o.add("<|eot_id|>");
    if (m[i].role == "assistant") o.span(b);
  }
}

void render_mistral(const ChatFormat& f, std::span<const ChatMessage> m, Out& o) {
  const std::string only = f.system == ChatFormat::System::unsupported
                               ? "Only user and assistant roles are supported!"
                               : "Only user and assistant roles are supported, with the exception "
                                 "of an initial optional system message!";
  std::optional<std::string> sys;
  if (m[0].role == "system" && f.system != ChatFormat::System::unsupported) {
    sys = m[0].content;
    m = m.subspan(1);
  }
  if (f.alternate)
    for (size_t i = 0; i < m.size(); ++i)
      SF_REQUIRE((m[i].role == "user") == (i % 2 == 0),
                 "the ", f.name, " chat template needs roles alternating user/assistant/user/... "
                 "(after an optional first system message); message ", i + (sys ? 1 : 0), " is \"",
                 m[i].role, "\"");
  const ChatMessage* last_user = nullptr;
  for (const auto& msg : m)
    if (msg.role == "user") last_user = &msg;
  if (f.mistral_bos) o.add(f.bos_token);
  for (size_t i = 0; i < m.size(); ++i) {
    const ChatMessage& msg = m[i];
    if (msg.role == "user") {
      bool put = false;
      if (sys) {
        switch (f.system) {
          case ChatFormat::System::first_user: put = i == 0; break;
          case ChatFormat::System::last_if_last: put = i + 1 == m.size(); break;
          // The template compares message dicts: an identical earlier user turn matches too.
          case ChatFormat::System::last_user: put = msg.content == last_user->content; break;
          case ChatFormat::System::unsupported: break;
        }
      }
      o.add(f.inst_open);
      if (put) {
        o.add(*sys);
        o.add("\n\n");
      }
      o.add(msg.content);
      o.add(f.inst_close);
    } else if (msg.role == "assistant") {
      const size_t b = o.mark();
      o.add(f.assistant_prefix);
      o.add(f.assistant_trim ? py_strip(msg.content) : msg.content);
      o.add(f.eos_token);
      o.span(b);
    } else {
      SF_FAIL(input, "the ", f.name, " chat template refuses a \"", msg.role, "\" message here: ",
              only);
    }
  }
}

}  // namespace

std::string py_strip(std::string_view s) {
  const size_t b = lead_space(s);
  s = s.substr(b);
  return std::string(s.substr(0, trail_keep(s)));
}

const std::vector<std::string>& chat_format_names() {
  static const std::vector<std::string> n = {
      "chatml",  "qwen2.5", "qwen3",          "llama3",     "llama3.1",      "llama3.2",
      "mistral", "mistral-legacy", "mistral-v3", "mistral-tekken"};
  return n;
}

ChatFormat named_chat_format(const std::string& name) {
  ChatFormat f;
  f.name = name;
  if (name == "chatml" || name == "qwen2.5" || name == "qwen3") {
    f.family = ChatFamily::chatml;
    if (name == "qwen2.5") f.default_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
    f.qwen3_think = name == "qwen3";
  } else if (name == "llama3" || name == "llama3.1" || name == "llama3.2") {
    f.family = ChatFamily::llama3;
    f.llama31_system = name != "llama3";
    f.date_string = "26 Jul 2024";
    f.date_from_clock = name == "llama3.2";
  } else if (name == "mistral" || name == "mistral-v1" || name == "mistral-legacy" ||
             name == "mistral-v3" || name == "mistral-tekken") {
    f.family = ChatFamily::mistral;
    if (name == "mistral-v1") f.name = "mistral";
    if (name == "mistral-legacy") {
      f.inst_open = "[INST] ";
      f.assistant_prefix = "";
      f.system = ChatFormat::System::unsupported;
    } else if (name == "mistral-v3") {
      f.inst_open = "[INST] ";
      f.inst_close = "[/INST]";
      f.assistant_trim = true;
      f.system = ChatFormat::System::last_if_last;
    } else if (name == "mistral-tekken") {
      f.inst_open = "[INST]";
      f.inst_close = "[/INST]";
      f.assistant_prefix = "";
      f.system = ChatFormat::System::last_if_last;
    }
  } else {
    std::string all;
    for (const auto& n : chat_format_names()) all += (all.empty() ? "" : ", ") + n;
    SF_FAIL(input, "--chat-format ", name, " is not known; use one of: ", all);
  }
  return f;
}

ChatFormat detect_chat_format(const std::string& t, const std::string& source) {
  SF_REQUIRE(!t.empty(), source, " has no chat_template (a base model?); pass --chat-format "
             "chatml|llama3|mistral (or another of --chat-format's names) to choose one");
  ChatFormat f;
  if (has(t, "<|im_start|>") && has(t, "<|im_end|>")) {
    f.family = ChatFamily::chatml;
    f.qwen3_think = has(t, "<think>") && has(t, "reasoning_content");
    f.default_system = f.qwen3_think ? "" : chatml_default_system(t);
    f.name = f.qwen3_think ? "qwen3" : f.default_system.starts_with("You are Qwen") ? "qwen2.5" : "chatml";
    f.chatml_bos = has_regex(t, R"(^\s*\{\{-?\s*bos_token\s*-?\}\})");
    return f;
  }
  if (has(t, "<|start_header_id|>") && has(t, "<|end_header_id|>") && has(t, "<|eot_id|>")) {
    f.family = ChatFamily::llama3;
    f.llama3_bos = has(t, "bos_token");
    f.llama31_system = has(t, "Cutting Knowledge Date");
    f.name = f.llama31_system ? "llama3.1" : "llama3";
    if (f.llama31_system) {
      std::smatch mm;
      static const std::regex date_re(R"(set\s+date_string\s*=\s*["']([^"']+)["'])");
      if (std::regex_search(t, mm, date_re)) f.date_string = mm[1];
      f.date_from_clock = has(t, "strftime_now");
      if (f.date_from_clock) f.name = "llama3.2";
      SF_REQUIRE(!f.date_string.empty() || f.date_from_clock, source,
                 ": a Llama 3.1-style chat_template without a date_string; pass --chat-format llama3.1");
    }
    return f;
  }
  if (has(t, "[INST]") && has(t, "[/INST]")) {
    f.family = ChatFamily::mistral;
    f.mistral_bos = has(t, "bos_token");
    if (has_regex(t, R"(['"] \[INST\] ['"])")) f.inst_open = " [INST] ";
    else if (has_regex(t, R"(['"]\[INST\] ['"])")) f.inst_open = "[INST] ";
    else f.inst_open = "[INST]";
    f.inst_close = has_regex(t, R"(['"] \[/INST\]['"])") ? " [/INST]" : "[/INST]";
    const char* content = R"(message(\[['"]content['"]\]|\.content))";
    f.assistant_prefix =
        has_regex(t, (std::string(R"(['"] ['"]\s*\+\s*)") + content).c_str()) ? " " : "";
    f.assistant_trim =
        has_regex(t, (std::string(content) + R"(\s*\|\s*trim\s*\+\s*eos_token)").c_str());
    f.alternate = has(t, "alternate");
    if (has(t, "loop.last and system_message")) f.system = ChatFormat::System::last_if_last;
    else if (has(t, "loop.first and system_message")) f.system = ChatFormat::System::first_user;
    else if (has_regex(t, R"(user_messages\[-1\]\)?\s+and\s+system_message)"))
      f.system = ChatFormat::System::last_user;
    else if (!has(t, "system_message")) f.system = ChatFormat::System::unsupported;
    else
      SF_FAIL(input, source, ": a Mistral [INST] chat_template whose system-prompt placement is "
              "not recognised; pass --chat-format mistral|mistral-v3|mistral-tekken to force one");
    f.name = f.inst_open == " [INST] "                                     ? "mistral"
             : f.inst_open == "[INST]"                                     ? "mistral-tekken"
             : f.system == ChatFormat::System::unsupported                 ? "mistral-legacy"
                                                                           : "mistral-v3";
    return f;
  }
  SF_FAIL(input, source, ": the chat_template is not one this trainer renders natively (it knows "
          "ChatML/Qwen, Llama 3 and Mistral [INST] templates); pass --chat-format chatml|llama3|"
          "mistral (or qwen3, llama3.1, mistral-v3, ...) to force one");
}

RenderedChat render_chat(const ChatFormat& f, std::span<const ChatMessage> messages,
                         const ChatRenderOptions& opt) {
  check_roles(messages);
  Out o;
  switch (f.family) {
    case ChatFamily::chatml: render_chatml(f, messages, o); break;
    case ChatFamily::llama3: render_llama3(f, opt, messages, o); break;
    case ChatFamily::mistral: render_mistral(f, messages, o); break;
  }
  return std::move(o.r);
}

}  // namespace sf
