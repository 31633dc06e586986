// ChatSession: a conversation with a model, turn by turn. Each user turn is added to the
// messages, the whole conversation is rendered by the model's chat template with the
// generation prompt (what transformers' apply_chat_template(..., add_generation_prompt=True)
// renders) and tokenized; the decoder keeps the longest cached prefix of those tokens and
// runs only the rest (a template that renders earlier turns differently, e.g. Qwen3 dropping
// old reasoning, re-runs from the first changed token). The reply is streamed as text and
// kept as the assistant's message.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "generate/generation.h"

namespace sf {

class ChatSession {
 public:
  // `system`: the system prompt ("" for none: the template's default, if it has one).
  ChatSession(Decoder& d, Sampler& s, const Tokenizer& tok, ChatFormat fmt,
              GenerateLimits limits, const std::string& system);

  // One turn: the reply to `user`, handed to on_text piece by piece as it is decoded.
  GenerationResult reply(const std::string& user,
                         const std::function<void(const std::string&)>& on_text);
  // Tokens of the last turn's prompt that came from the cache instead of being run again.
  int64_t reused_tokens() const { return reused_; }
  const std::vector<ChatMessage>& messages() const { return messages_; }

 private:
  Decoder& d_;
  Sampler& s_;
  const Tokenizer& tok_;
  ChatFormat fmt_;
  GenerateLimits limits_;
  std::vector<ChatMessage> messages_;
  std::vector<int32_t> context_;  // the tokens of the conversation so far
  int64_t reused_ = 0;
};

// The conversation rendered with the generation prompt: the text up to where the template
// puts the content of a next assistant message.
std::string render_with_generation_prompt(const ChatFormat& fmt,
                                          const std::vector<ChatMessage>& messages);

}  // namespace sf
