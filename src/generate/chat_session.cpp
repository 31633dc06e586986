#include "generate/chat_session.h"

#include <algorithm>

#include "core/error.h"

namespace sf {

std::string render_with_generation_prompt(const ChatFormat& fmt,
                                          const std::vector<ChatMessage>& messages) {
  // The templates' own generation prompt is the header of an assistant turn: render one with
  // empty content and cut at the start of its span.
  std::vector<ChatMessage> with_reply = messages;
  with_reply.push_back({"assistant", "", std::nullopt});
  const RenderedChat r = render_chat(fmt, with_reply);
  SF_CHECK(!r.assistant_spans.empty(), "the ", fmt.name, " template rendered no assistant turn");
  return r.text.substr(0, r.assistant_spans.back().first);
}

ChatSession::ChatSession(Decoder& d, Sampler& s, const Tokenizer& tok, ChatFormat fmt,
                         GenerateLimits limits, const std::string& system)
    : d_(d), s_(s), tok_(tok), fmt_(std::move(fmt)), limits_(std::move(limits)) {
  if (!system.empty()) messages_.push_back({"system", system, std::nullopt});
  d_.truncate(0);
}

GenerationResult ChatSession::reply(const std::string& user,
                                    const std::function<void(const std::string&)>& on_text) {
  messages_.push_back({"user", user, std::nullopt});
  // The template writes any BOS itself (as transformers' apply_chat_template tokenizes).
  std::vector<int32_t> ids = tok_.encode(render_with_generation_prompt(fmt_, messages_));
  // The longest prefix of the new tokens that the cache holds; at least one token must run.
  const size_t cached = std::min(size_t(d_.cached()), context_.size());
  const size_t same = size_t(std::mismatch(ids.begin(), ids.begin() + std::min(cached, ids.size()),
                                           context_.begin()).first - ids.begin());
  reused_ = int64_t(std::min(same, ids.size() - 1));
  d_.truncate(reused_);
  context_ = std::move(ids);
  TextStream text(tok_);
  GenerationResult r = generate(d_, s_, context_, limits_, [&](int32_t t) {
    const std::string piece = text.push(t);
    if (!piece.empty() && on_text) on_text(piece);
  });
  messages_.push_back({"assistant", text.text(), std::nullopt});
  return r;
}

}  // namespace sf
