#include "export/gguf_vocab.h"

#include <unordered_map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "export/generation_config.h"
#include "io/atomic_file.h"
#include "text/tokenizer.h"
#include "text/tokenizer_regex.h"

namespace sf {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Vocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;
  std::vector<std::string> merges;  // "a b", rank order
};

json read_json_file(const fs::path& p) {
  try {
    return json::parse(read_file(p));
  } catch (const json::exception& e) {
    SF_FAIL(input, p.string(), ": malformed JSON (", e.what(), ")");
  }
}

// The pre-tokenizer steps of tokenizer.json, flattened out of a Sequence.
std::vector<json> pre_steps(const json& tj) {
  const json pre = tj.value("pre_tokenizer", json());
  if (!pre.is_object()) return {};
  if (pre.value("type", "") == "Sequence") return pre.value("pretokenizers", std::vector<json>{});
  return {pre};
}

// llama.cpp's name for the pre-tokenizer (see gguf_vocab.h); "" when not recognised.
std::string pre_tokenizer_name(const json& tj) {
  const std::vector<json> s = pre_steps(tj);
  auto type = [&](size_t i) { return s[i].value("type", std::string()); };
  if (s.size() == 1 && type(0) == "ByteLevel" && s[0].value("use_regex", true)) return "gpt-2";
  if (s.size() == 2 && type(0) == "Digits" && s[0].value("individual_digits", false) &&
      type(1) == "ByteLevel" && s[1].value("use_regex", true))
    return "smollm";
  if (s.size() == 2 && type(0) == "Split" && type(1) == "ByteLevel") {
    const json pat = s[0].value("pattern", json());
    const std::string re = pat.is_object() ? pat.value("Regex", std::string()) : "";
    if (auto r = tok::recognize_split_regex(re); r && r->kind == tok::SplitRegex::Kind::llama3)
      return r->max_digits == 3 ? "llama-bpe" : "qwen2";
  }
  return "";
}

bool byte_fallback(const json& model) { return model.value("byte_fallback", false); }

std::string merge_text(const json& m, const std::string& src) {
  if (m.is_string()) return m.get<std::string>();
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
    return m[0].get<std::string>() + " " + m[1].get<std::string>();
  SF_FAIL(input, src, ": model.merges holds ", m.dump(), "; expected \"a b\" or [\"a\", \"b\"]");
}

bool is_byte_token(const std::string& t) {
  return t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>';
}

Vocab read_vocab(const json& tj, int64_t vocab_size, const std::string& src) {
  const json& model = tj.at("model");
  Vocab v;
  v.tokens.resize(size_t(vocab_size));
  v.types.assign(size_t(vocab_size), gguf_token_type::unused);
  std::vector<bool> seen(size_t(vocab_size), false);
  auto place = [&](int64_t id, const std::string& text, int32_t type) {
    SF_REQUIRE(id >= 0 && id < vocab_size, src, ": token \"", text, "\" has id ", id,
               " but the model has vocab_size ", vocab_size,
               " (config.json); the tokenizer belongs to another model");
    v.tokens[size_t(id)] = text;
    v.types[size_t(id)] = type;
    seen[size_t(id)] = true;
  };
  const bool bytes = byte_fallback(model);
  for (auto& [text, id] : model.at("vocab").items())
    place(id.get<int64_t>(), text, bytes && is_byte_token(text) ? gguf_token_type::byte
                                                                 : gguf_token_type::normal);
  const std::string unk = model.value("unk_token", json()).is_string()
                              ? model.at("unk_token").get<std::string>() : "";
  for (auto& a : tj.value("added_tokens", json::array())) {
    const std::string text = a.at("content").get<std::string>();
    const bool special = a.value("special", false);
    place(a.at("id").get<int64_t>(), text,
          text == unk ? gguf_token_type::unknown
                      : special ? gguf_token_type::control : gguf_token_type::user_defined);
  }
  for (int64_t i = 0; i < vocab_size; ++i)
    if (!seen[size_t(i)]) v.tokens[size_t(i)] = cat("[PAD", i, "]");
  for (auto& m : model.value("merges", json::array())) v.merges.push_back(merge_text(m, src));
  return v;
}

// Scores for a "llama" vocabulary (see gguf_vocab.h).
std::vector<float> merge_scores(const Vocab& v) {
  std::unordered_map<std::string, size_t> id_of;
  for (size_t i = 0; i < v.tokens.size(); ++i) id_of.emplace(v.tokens[i], i);
  std::vector<float> scores(v.tokens.size(), -1e9f);
  for (size_t r = 0; r < v.merges.size(); ++r) {
    const std::string& m = v.merges[r];
    const size_t sp = m.find(' ');
    auto it = id_of.find(m.substr(0, sp) + m.substr(sp + 1));
    if (sp != std::string::npos && it != id_of.end() && scores[it->second] == -1e9f)
      scores[it->second] = -float(r);
  }
  return scores;
}

// tokenizer.ggml.add_space_prefix of a "llama" vocabulary: SentencePiece's dummy prefix, which
// tokenizer.json spells as a Metaspace pre-tokenizer or a Prepend("▁") normalizer.
bool adds_space_prefix(const json& tj) {
  for (auto& s : pre_steps(tj))
    if (s.value("type", "") == "Metaspace")
      return s.value("prepend_scheme", std::string("always")) != "never" &&
             s.value("add_prefix_space", true);
  const json n = tj.value("normalizer", json());
  std::vector<json> ns = n.is_object() && n.value("type", "") == "Sequence"
                             ? n.value("normalizers", std::vector<json>{})
                             : std::vector<json>{n};
  for (auto& x : ns)
    if (x.is_object() && x.value("type", "") == "Prepend") return true;
  return false;
}

void add_special_ids(GgufWriter& w, const Tokenizer& tok, const json& model) {
  if (auto id = tok.bos_id()) w.add_u32("tokenizer.ggml.bos_token_id", uint32_t(*id));
  if (auto id = tok.eos_id()) w.add_u32("tokenizer.ggml.eos_token_id", uint32_t(*id));
  if (auto id = tok.pad_id()) w.add_u32("tokenizer.ggml.padding_token_id", uint32_t(*id));
  if (model.value("unk_token", json()).is_string())
    if (int32_t id = tok.token_to_id(model.at("unk_token").get<std::string>()); id >= 0)
      w.add_u32("tokenizer.ggml.unknown_token_id", uint32_t(id));
  const std::string eos_text = tok.eos_id() ? tok.id_to_token(*tok.eos_id()) : "";
  if (auto eot = end_of_turn_token(tok.chat_template(), eos_text))
    if (int32_t id = tok.token_to_id(*eot); id >= 0)
      w.add_u32("tokenizer.ggml.eot_token_id", uint32_t(id));
  w.add_bool("tokenizer.ggml.add_bos_token", tok.add_bos());
  w.add_bool("tokenizer.ggml.add_eos_token", false);
  if (!tok.chat_template().empty()) w.add_string("tokenizer.chat_template", tok.chat_template());
}

}  // namespace

GgufVocabInfo add_gguf_vocab(GgufWriter& w, const fs::path& dir, int64_t vocab_size) {
  const fs::path tj_path = dir / "tokenizer.json";
  SF_REQUIRE(fs::exists(tj_path), dir.string(),
             ": no tokenizer.json; a GGUF file carries its tokenizer, so export needs the "
             "model's tokenizer files (a model made by `slideformer init` gets them with "
             "--tokenizer DIR)");
  const std::string src = tj_path.string();
  const json tj = read_json_file(tj_path);
  const json model = tj.value("model", json());
  SF_REQUIRE(model.is_object() && model.value("type", "") == "BPE", src, ": model.type is ",
             model.is_object() ? model.value("type", json("missing")).dump() : "missing",
             "; only BPE tokenizers (GPT-2, Llama, Mistral, Qwen, SmolLM) can be exported");
  const Tokenizer tok = Tokenizer::load(dir);  // validates the file as encoding will use it
  const Vocab v = read_vocab(tj, vocab_size, src);
  GgufVocabInfo info;
  info.model = byte_fallback(model) ? "llama" : "gpt2";
  w.add_string("tokenizer.ggml.model", info.model);
  if (info.model == "gpt2") {
    info.pre = pre_tokenizer_name(tj);
    if (info.pre.empty()) {
      info.pre = "default";
      info.notes.push_back(cat(src, ": the pre_tokenizer is none llama.cpp is known to name "
                                    "(gpt-2, smollm, llama-bpe, qwen2); wrote \"default\", "
                                    "so llama.cpp may split text differently"));
    }
    w.add_string("tokenizer.ggml.pre", info.pre);
  }
  w.add_strings("tokenizer.ggml.tokens", v.tokens);
  w.add_i32s("tokenizer.ggml.token_type", v.types);
  if (info.model == "gpt2") {
    w.add_strings("tokenizer.ggml.merges", v.merges);
  } else {
    w.add_f32s("tokenizer.ggml.scores", merge_scores(v));
    w.add_bool("tokenizer.ggml.add_space_prefix", adds_space_prefix(tj));
  }
  add_special_ids(w, tok, model);
  return info;
}

}  // namespace sf
