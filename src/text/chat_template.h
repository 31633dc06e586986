// Chat templates without a Jinja interpreter: a tokenizer_config.json chat_template is
// recognised by distinctive substrings as one of a few families, and conversations of plain
// role/content messages are rendered natively, byte for byte as transformers'
// apply_chat_template(messages, tokenize=False) renders them (add_generation_prompt=False,
// no tools). Owns: detection, rendering, and the byte spans that the assistant produces.
//
// Families (verified against transformers on the templates under tests/data/datasets/templates):
//   chatml   <|im_start|>role\ncontent<|im_end|>\n; optional default system prompt taken from the
//            template (Qwen2: "You are a helpful assistant.", Qwen2.5: "You are Qwen, ..."); the
//            Qwen3 <think> rules (reasoning kept only after the last user turn; the final
//            assistant turn always gets a <think>...</think> block).
//   llama3   [bos]<|start_header_id|>role<|end_header_id|>\n\n content|trim <|eot_id|>; Llama 3.1+
//            first emits a system header with "Cutting Knowledge Date: December 2023" and
//            "Today Date: <date>" (3.1: the template's fixed date; 3.2+: strftime_now, i.e. today
//            unless ChatRenderOptions::date_string says otherwise).
//   mistral  [bos] [INST] user [/INST] assistant</s> with the variant's spacing: v1 " [INST] ",
//            legacy v1 "[INST] ... [/INST]", v3 "[INST] ...[/INST] answer</s>", tekken
//            "[INST]...[/INST]answer</s>"; the system prompt goes into the first or the last user
//            turn as the template says (v3/tekken put it into the final user turn only, so a
//            conversation ending with the assistant loses it, exactly as transformers renders it).
// Anything else is refused with an error naming the source and suggesting --chat-format.
//
// Assistant spans: for each assistant message, what the model generates after its header: the
// content (plus the Qwen3 think block, the Mistral leading space) through the end-of-turn token
// (<|im_end|>, <|eot_id|>, </s>); not the header, not the newline after <|im_end|>.
#pragma once
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace sf {

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
  std::optional<std::string> reasoning_content;  // Qwen3 only: the thinking of an assistant turn
};

enum class ChatFamily { chatml, llama3, mistral };

struct ChatFormat {
  std::string name;  // e.g. "qwen3", "llama3.1", "mistral-v3": what was recognised or forced
  ChatFamily family = ChatFamily::chatml;
  std::string bos_token, eos_token;  // token strings the template inserts (set by the caller)

  // chatml
  std::string default_system;  // emitted when the first message is not a system one ("" none)
  bool qwen3_think = false;
  bool chatml_bos = false;      // template starts with bos_token
  // llama3
  bool llama3_bos = true;          // template starts with bos_token
  bool llama31_system = false;     // 3.1+ system header with the knowledge cutoff
  std::string date_string;         // 3.1: fixed date of the template
  bool date_from_clock = false;    // 3.2+: strftime_now("%d %b %Y")
  // mistral
  bool mistral_bos = true;
  std::string inst_open = " [INST] ", inst_close = " [/INST]";
  std::string assistant_prefix = " ";
  bool assistant_trim = false;
  enum class System { unsupported, first_user, last_if_last, last_user } system = System::first_user;
  bool alternate = true;  // roles must alternate user/assistant (the template raises otherwise)
};

struct ChatRenderOptions {
  std::string date_string;  // Llama 3.2+ "Today Date"; empty: today (as transformers renders)
};

struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> assistant_spans;  // byte ranges [begin, end) of text
};

// Recognises `jinja` (a tokenizer_config.json chat_template); `source` names where it came from
// for the error message. bos/eos token strings are left empty for the caller to set.
ChatFormat detect_chat_format(const std::string& jinja, const std::string& source);

// A forced format: chatml | qwen2.5 | qwen3 | llama3 | llama3.1 | mistral (= mistral-v1) |
// mistral-legacy | mistral-v3 | mistral-tekken.
ChatFormat named_chat_format(const std::string& name);
// The names named_chat_format accepts, for help text.
const std::vector<std::string>& chat_format_names();

// Renders `messages`. A conversation the template would reject (non-alternating roles for
// Mistral, an unknown role, a system message where the template has none) throws
// sf::Error(input) with a message saying what is wrong (the caller adds FILE:LINE).
RenderedChat render_chat(const ChatFormat& fmt, std::span<const ChatMessage> messages,
                         const ChatRenderOptions& opt = {});

// Today's date as Llama 3.2's template writes it (strftime_now("%d %b %Y"), local time).
std::string today_date_string();

// Python's str.strip() / lstrip() / rstrip() with no argument (Unicode whitespace, as Jinja's
// trim filter uses), on UTF-8.
std::string py_strip(std::string_view s);

}  // namespace sf
