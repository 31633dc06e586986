// Generation: the decode loop over a Decoder and a Sampler, the stop tokens of a model
// directory, and the text of a reply streamed as its tokens arrive.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "generate/decoder.h"
#include "generate/sampler.h"
#include "io/model_config.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace sf {

// The tokens generation stops at: generation_config.json's eos_token_id (a number or a list)
// when the directory has one, else config.json's; the tokenizer's eos token; and, when `chat`
// is given, the end-of-turn token of its template (<|im_end|>, <|eot_id|>, </s>) where the
// vocabulary has it. Sorted, without duplicates.
std::vector<int32_t> stop_token_ids(const std::filesystem::path& model_dir, const ModelConfig& cfg,
                                    const Tokenizer& tok, const ChatFormat* chat = nullptr);

enum class StopReason { stop_token, max_new_tokens, context_full };
const char* stop_reason_name(StopReason r);

struct GenerateLimits {
  int64_t max_new_tokens = 128;
  std::vector<int32_t> stop_tokens;  // sorted (stop_token_ids)
};

struct GenerationResult {
  std::vector<int32_t> new_tokens;  // sampled, the stop token included when one ended it
  StopReason reason = StopReason::max_new_tokens;
  int64_t prompt_tokens = 0;        // tokens appended before the first sample (not cached)
  double prefill_seconds = 0, decode_seconds = 0;
};

// Appends context[d.cached() ..] (at least one token must be uncached), then samples up to
// max_new_tokens tokens, each appended to `context` and handed to on_token as it is chosen.
// A token is run through the decoder only when another one will be sampled after it, so on
// return the decoder caches every token of `context` except the last one sampled.
GenerationResult generate(Decoder& d, Sampler& s, std::vector<int32_t>& context,
                          const GenerateLimits& limits,
                          const std::function<void(int32_t)>& on_token);

// The text of a growing list of tokens, handed out piece by piece: push() returns what the
// new token adds (special tokens skipped), holding back a multi-byte character until its
// last byte has arrived.
class TextStream {
 public:
  explicit TextStream(const Tokenizer& tok) : tok_(tok) {}
  std::string push(int32_t id);
  const std::string& text() const { return shown_; }

 private:
  const Tokenizer& tok_;
  std::vector<int32_t> ids_;
  std::string shown_;
};

}  // namespace sf
