#include "generate/generation.h"

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/stopwatch.h"

namespace sf {

namespace fs = std::filesystem;

namespace {

// eos_token_id of generation_config.json: a number, a list of numbers, null or absent.
std::vector<int64_t> generation_config_eos(const fs::path& file) {
  std::ifstream f(file);
  SF_REQUIRE(f.good(), file.string(), ": cannot be read");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {
    SF_FAIL(input, file.string(), ": not valid JSON (", e.what(), "); fix or remove the file");
  }
  std::vector<int64_t> ids;
  const auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return ids;
  const auto bad = [&] {
    SF_FAIL(input, file.string(), ": \"eos_token_id\" must be a token id or a list of token "
            "ids, got ", it->dump());
  };
  if (it->is_number_integer()) ids.push_back(it->get<int64_t>());
  else if (!it->is_array()) bad();
  else
    for (const auto& x : *it) x.is_number_integer() ? ids.push_back(x.get<int64_t>()) : bad();
  return ids;
}

const char* end_of_turn_token(const ChatFormat& f) {
  switch (f.family) {
    case ChatFamily::chatml: return "<|im_end|>";
    case ChatFamily::llama3: return "<|eot_id|>";
    case ChatFamily::mistral: return f.eos_token.c_str();
  }
  return "";
}

}  // namespace

std::vector<int32_t> stop_token_ids(const fs::path& model_dir, const ModelConfig& cfg,
                                    const Tokenizer& tok, const ChatFormat* chat) {
  const fs::path gen = model_dir / "generation_config.json";
  std::vector<int64_t> eos = fs::exists(gen) ? generation_config_eos(gen) : cfg.eos_token_ids;
  if (fs::exists(gen) && eos.empty()) eos = cfg.eos_token_ids;
  std::vector<int32_t> ids;
  for (int64_t e : eos)
    if (e >= 0 && e < cfg.vocab_size) ids.push_back(int32_t(e));
  if (tok.eos_id()) ids.push_back(*tok.eos_id());
  if (chat)
    if (int32_t t = tok.token_to_id(end_of_turn_token(*chat)); t >= 0) ids.push_back(t);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::stop_token: return "stop token";
    case StopReason::max_new_tokens: return "max new tokens";
    case StopReason::context_full: return "context full";
  }
  return "?";
}

GenerationResult generate(Decoder& d, Sampler& s, std::vector<int32_t>& context,
                          const GenerateLimits& limits,
                          const std::function<void(int32_t)>& on_token) {
  SF_CHECK(d.cached() < int64_t(context.size()), "generate: every context token is cached");
  GenerationResult r;
  r.prompt_tokens = int64_t(context.size()) - d.cached();
  const auto t0 = std::chrono::steady_clock::now();
  std::span<const float> logits =
      d.append(std::span<const int32_t>(context).subspan(size_t(d.cached())));
  r.prefill_seconds = seconds_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  while (int64_t(r.new_tokens.size()) < limits.max_new_tokens) {
    const int32_t t = s.next(logits, context);
    context.push_back(t);
    r.new_tokens.push_back(t);
    if (on_token) on_token(t);
    if (std::binary_search(limits.stop_tokens.begin(), limits.stop_tokens.end(), t)) {
      r.reason = StopReason::stop_token;
      break;
    }
    if (int64_t(r.new_tokens.size()) == limits.max_new_tokens) break;
    if (d.cached() + 1 > d.options().max_context) {
      r.reason = StopReason::context_full;
      break;
    }
    logits = d.append(std::span<const int32_t>(&context.back(), 1));
  }
  r.decode_seconds = seconds_since(t1);
  return r;
}

std::string TextStream::push(int32_t id) {
  ids_.push_back(id);
  const std::string text = tok_.decode(ids_, true);
  // U+FFFD at the end: the last character's bytes have not all arrived yet.
  static const std::string kReplacement = "\xEF\xBF\xBD";
  if (text.size() >= 3 && text.compare(text.size() - 3, 3, kReplacement) == 0) return "";
  if (text.size() <= shown_.size() || text.compare(0, shown_.size(), shown_) != 0) return "";
  std::string piece = text.substr(shown_.size());
  shown_ = text;
  return piece;
}

}  // namespace sf
