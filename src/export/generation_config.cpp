#include "export/generation_config.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "io/atomic_file.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"

namespace sf {

namespace fs = std::filesystem;
using nlohmann::json;

std::optional<std::string> end_of_turn_token(const std::string& chat_template,
                                             const std::string& eos_token) {
  if (chat_template.empty()) return std::nullopt;
  try {
    switch (detect_chat_format(chat_template, "chat_template").family) {
      case ChatFamily::chatml: return "<|im_end|>";
      case ChatFamily::llama3: return "<|eot_id|>";
      case ChatFamily::mistral: return eos_token;
    }
  } catch (const Error&) {
    // Unrecognised: no end-of-turn token is known, the tokenizer's eos stays the only one.
  }
  return std::nullopt;
}

namespace {

// The source's generation_config.json, or {} when there is none. A damaged one is an
// error: silently dropping its settings would change how the saved model generates.
json source_generation_config(const fs::path& dir) {
  const fs::path p = dir / "generation_config.json";
  if (dir.empty() || !fs::exists(p)) return json::object();
  try {
    json j = json::parse(read_file(p));
    if (j.is_object()) return j;
  } catch (const json::exception&) {
  }
  SF_FAIL(input, p.string(), ": not a JSON object; fix or delete it (it is copied with the model)");
}

void add_ids(std::vector<int64_t>& ids, const json& v) {
  if (v.is_number_integer()) ids.push_back(v.get<int64_t>());
  if (v.is_array())
    for (auto& x : v)
      if (x.is_number_integer()) ids.push_back(x.get<int64_t>());
}

}  // namespace

json generation_config_json(const ModelConfig& c, const fs::path& tokenizer_dir) {
  json g = source_generation_config(tokenizer_dir);
  std::vector<int64_t> eos;
  std::optional<int64_t> bos = c.bos_token_id >= 0 ? std::optional<int64_t>(c.bos_token_id)
                                                   : std::nullopt;
  std::optional<int64_t> pad;
  std::vector<int64_t> tail;  // after the tokenizer's and the config's own
  add_ids(tail, g.value("eos_token_id", json()));
  if (!tokenizer_dir.empty() && fs::exists(tokenizer_dir / "tokenizer.json")) {
    const Tokenizer tok = Tokenizer::load(tokenizer_dir);
    if (tok.bos_id()) bos = *tok.bos_id();
    if (tok.eos_id()) eos.push_back(*tok.eos_id());
    if (tok.pad_id()) pad = *tok.pad_id();
    const std::string eos_text = tok.eos_id() ? tok.id_to_token(*tok.eos_id()) : "";
    if (auto eot = end_of_turn_token(tok.chat_template(), eos_text))
      if (int32_t id = tok.token_to_id(*eot); id >= 0) tail.push_back(id);
  }
  eos.insert(eos.end(), c.eos_token_ids.begin(), c.eos_token_ids.end());
  eos.insert(eos.end(), tail.begin(), tail.end());
  std::vector<int64_t> unique;
  for (int64_t id : eos)
    if (std::find(unique.begin(), unique.end(), id) == unique.end()) unique.push_back(id);
  if (bos) g["bos_token_id"] = *bos;
  if (unique.size() == 1) g["eos_token_id"] = unique[0];
  if (unique.size() > 1) g["eos_token_id"] = unique;
  if (pad) g["pad_token_id"] = *pad;
  g["max_length"] = c.max_position_embeddings;
  return g;
}

}  // namespace sf
