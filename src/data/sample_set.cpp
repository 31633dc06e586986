#include "data/sample_set.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/jsonl.h"

namespace sf {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

uint64_t mix64(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
uint64_t hash_step(uint64_t h, uint64_t v) { return mix64(h ^ mix64(v)); }

// ---- token byte ranges ---------------------------------------------------------------------

// Inverse of GPT-2's bytes_to_unicode: code point -> byte, -1 if not in the alphabet.
const std::array<int16_t, 0x180>& byte_level_inverse() {
  static const std::array<int16_t, 0x180> inv = [] {
    std::array<int16_t, 0x180> a;
    a.fill(-1);
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
      a[size_t(printable ? b : 256 + n++)] = int16_t(b);
    }
    return a;
  }();
  return inv;
}

// The bytes a token stands for in the (normalized) text.
std::string token_bytes(const std::string& t, bool byte_level) {
  if (byte_level) {
    const auto& inv = byte_level_inverse();
    std::string out;
    for (size_t i = 0; i < t.size();) {
      const auto b = uint8_t(t[i]);
      int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : 4;
      if (i + size_t(n) > t.size()) return t;
      char32_t c = n == 1 ? b : n == 2 ? (b & 0x1f) : n == 3 ? (b & 0x0f) : (b & 0x07);
      for (int k = 1; k < n; ++k) c = (c << 6) | (uint8_t(t[i + size_t(k)]) & 0x3f);
      if (c >= inv.size() || inv[c] < 0) return t;  // an added token's raw text
      out.push_back(char(inv[c]));
      i += size_t(n);
    }
    return out;
  }
  // SentencePiece style: <0xNN> byte fallback, U+2581 for a space.
  if (t.size() == 6 && t.starts_with("<0x") && t.back() == '>') {
    const int v = std::stoi(t.substr(3, 2), nullptr, 16);
    return std::string(1, char(v));
  }
  std::string out;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t.compare(i, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      i += 2;
    } else {
      out += t[i];
    }
  }
  return out;
}

bool ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Piecewise tokenization: each [cut_k, cut_k+1) encoded alone; target flags per piece.
TokenizedDoc encode_pieces(const Tokenizer& tok, std::string_view text,
                           const std::vector<std::pair<size_t, size_t>>& spans) {
  TokenizedDoc d;
  d.mask_fallback = true;
  size_t p = 0;
  auto piece = [&](size_t e, uint8_t target) {
    if (e <= p) return;
    for (int32_t id : tok.encode(text.substr(p, e - p))) {
      d.tokens.push_back(id);
      d.target.push_back(target);
    }
    p = e;
  };
  for (auto [b, e] : spans) {
    piece(b, 0);
    piece(e, 1);
  }
  piece(text.size(), 0);
  return d;
}

// Whole-text tokenization with targets = tokens overlapping `spans` (sorted, disjoint).
TokenizedDoc encode_with_spans(const Tokenizer& tok, std::string_view text,
                               const std::vector<std::pair<size_t, size_t>>& spans) {
  TokenizedDoc d;
  d.tokens = tok.encode(text);
  const auto ranges = token_byte_ranges(tok, text, d.tokens);
  if (ranges.empty() && !d.tokens.empty()) return encode_pieces(tok, text, spans);
  d.target.assign(d.tokens.size(), 0);
  // Token ranges start in order: the first span ending after a token's start is the only one
  // it can overlap (the next ones start later still).
  size_t s = 0;
  for (size_t k = 0; k < d.tokens.size(); ++k) {
    const auto [rs, re] = ranges[k];
    while (s < spans.size() && spans[s].second <= rs) ++s;
    if (s == spans.size()) break;
    const size_t b = spans[s].first;
    d.target[k] = rs < re ? b < re : b <= rs;  // an empty range: the inserted-space token
  }
  return d;
}

// ---- JSONL lines ---------------------------------------------------------------------------

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

std::string json_error(const json::exception& e) {
  std::string m = e.what();
  if (m.starts_with("[json.exception.")) m = m.substr(m.find(']') + 2);
  return "invalid JSON: " + m;
}

const std::string& string_field(const json& o, const char* key, const std::string& where) {
  auto it = o.find(key);
  SF_REQUIRE(it != o.end(), "missing field \"", where, key, "\"");
  SF_REQUIRE(it->is_string(), "\"", where, key, "\" must be a string, got ", type_name(*it));
  return it->get_ref<const std::string&>();
}

std::vector<ChatMessage> parse_messages(const json& o) {
  auto it = o.find("messages");
  SF_REQUIRE(it != o.end(), "missing field \"messages\"");
  SF_REQUIRE(it->is_array(), "\"messages\" must be an array of {\"role\", \"content\"}, got ",
             type_name(*it));
  SF_REQUIRE(!it->empty(), "\"messages\" is empty");
  std::vector<ChatMessage> m;
  bool assistant = false;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    const std::string where = "messages[" + std::to_string(i) + "].";
    SF_REQUIRE(e.is_object(), "\"messages[", i, "]\" must be an object, got ", type_name(e));
    ChatMessage c{string_field(e, "role", where), string_field(e, "content", where), std::nullopt};
    if (auto r = e.find("reasoning_content"); r != e.end() && !r->is_null()) {
      SF_REQUIRE(r->is_string(), "\"", where, "reasoning_content\" must be a string, got ",
                 type_name(*r));
      c.reasoning_content = r->get<std::string>();
    }
    assistant |= c.role == "assistant";
    m.push_back(std::move(c));
  }
  SF_REQUIRE(assistant, "\"messages\" has no assistant message: nothing to learn from");
  return m;
}

struct LineContext {
  DataFormat format;
  const Tokenizer* tok;
  const ChatFormat* chat;
  ChatRenderOptions render;
};

TokenizedDoc process_line(std::string_view line, const LineContext& c) {
  json o;
  try {
    o = json::parse(line);
  } catch (const json::exception& e) {
    SF_FAIL(input, json_error(e));
  }
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
    case DataFormat::messages: return tokenize_chat(*c.tok, *c.chat, parse_messages(o), c.render);
    case DataFormat::tokens: break;
  }
  SF_CHECK(false, "process_line on a token file");
  return {};
}

DataFormat format_from_keys(const json& o, const std::string& where) {
  if (o.contains("messages")) return DataFormat::messages;
  if (o.contains("prompt") && o.contains("completion")) return DataFormat::prompt_completion;
  if (o.contains("text")) return DataFormat::text;
  std::string keys;
  for (auto it = o.begin(); it != o.end(); ++it) keys += (keys.empty() ? "" : ", ") + it.key();
  SF_FAIL(input, where, ": cannot tell the dataset format: expected a \"text\", \"prompt\"+\"completion\" "
          "or \"messages\" field, found {", keys, "}; rename the fields or pass --data-format");
}

DataFormat detect_format(const fs::path& path, const std::string& forced, bool skip_bad) {
  const std::string ext = path.extension().string();
  if (forced == "tokens" || (forced == "auto" && (ext == ".bin" || ext == ".tokens")))
    return DataFormat::tokens;
  if (forced == "text") return DataFormat::text;
  if (forced == "prompt_completion" || forced == "prompt-completion") return DataFormat::prompt_completion;
  if (forced == "messages" || forced == "chat") return DataFormat::messages;
  SF_REQUIRE(forced == "auto", "--data-format ", forced,
             " is not known; use auto, text, prompt_completion, messages or tokens");
  JsonlReader r(path);
  std::vector<std::string_view> lines;
  int64_t first = 0;
  while (r.next_block(lines, first, size_t(1) << 20)) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (blank_line(lines[i])) continue;
      const std::string where = path.string() + ":" + std::to_string(first + int64_t(i));
      json o;
      try {
        o = json::parse(lines[i]);
      } catch (const json::exception& e) {
        if (skip_bad) continue;
        SF_FAIL(input, where, ": ", json_error(e));
      }
      if (!o.is_object()) {
        if (skip_bad) continue;
        SF_FAIL(input, where, ": expected a JSON object, got ", type_name(o));
      }
      return format_from_keys(o, where);
    }
  }
  SF_FAIL(input, path.string(), ": no dataset line found (the file is empty or every line is bad)");
}

}  // namespace

// ---- public helpers -------------------------------------------------------------------------

const char* data_format_name(DataFormat f) {
  switch (f) {
    case DataFormat::text: return "text";
    case DataFormat::prompt_completion: return "prompt_completion";
    case DataFormat::messages: return "messages";
    case DataFormat::tokens: return "tokens";
  }
  return "?";
}

std::vector<std::pair<size_t, size_t>> token_byte_ranges(const Tokenizer& tok,
                                                         std::string_view text,
                                                         std::span<const int32_t> ids) {
  // Byte-level vocabularies hold 'Ġ' (the space byte) and never the raw U+2581.
  const bool byte_level = tok.token_to_id("\xC4\xA0") >= 0 && tok.token_to_id("\xE2\x96\x81") < 0;
  std::vector<std::pair<size_t, size_t>> out(ids.size());
  size_t j = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    const std::string piece = token_bytes(tok.id_to_token(ids[k]), byte_level);
    const size_t rs = j;
    for (char c : piece) {
      for (;;) {
        if (j < text.size() && text[j] == c) {
          ++j;
          break;
        }
        if (c == ' ') break;  // a space the normalizer inserted (SentencePiece prefix)
        if (j < text.size() && ascii_space(text[j])) {  // whitespace a token stripped
          ++j;
          continue;
        }
        return {};
      }
    }
    out[k] = {rs, j};
  }
  while (j < text.size() && ascii_space(text[j])) ++j;
  if (j != text.size()) return {};
  if (!out.empty()) out.back().second = j;
  return out;
}

TokenizedDoc tokenize_text(const Tokenizer& tok, const std::string& text) {
  TokenizedDoc d;
  if (tok.add_bos() && tok.bos_id()) {
    d.tokens.push_back(*tok.bos_id());
    d.target.push_back(0);
  }
  for (int32_t id : tok.encode(text)) {
    d.tokens.push_back(id);
    d.target.push_back(1);
  }
  if (tok.eos_id()) {
    d.tokens.push_back(*tok.eos_id());
    d.target.push_back(1);
  }
  return d;
}

TokenizedDoc tokenize_prompt_completion(const Tokenizer& tok, const std::string& prompt,
                                        const std::string& completion) {
  const std::string full = prompt + completion;
  TokenizedDoc body = encode_with_spans(tok, full, {{prompt.size(), full.size()}});
  TokenizedDoc d;
  d.mask_fallback = body.mask_fallback;
  if (tok.add_bos() && tok.bos_id()) {
    d.tokens.push_back(*tok.bos_id());
    d.target.push_back(0);
  }
  d.tokens.insert(d.tokens.end(), body.tokens.begin(), body.tokens.end());
  d.target.insert(d.target.end(), body.target.begin(), body.target.end());
  if (tok.eos_id()) {
    d.tokens.push_back(*tok.eos_id());
    d.target.push_back(1);
  }
  return d;
}

TokenizedDoc tokenize_chat(const Tokenizer& tok, const ChatFormat& fmt,
                           std::span<const ChatMessage> messages, const ChatRenderOptions& opt) {
  const RenderedChat r = render_chat(fmt, messages, opt);
  SF_REQUIRE(!r.assistant_spans.empty(), "the ", fmt.name,
             " chat template rendered no assistant turn: nothing to learn from");
  return encode_with_spans(tok, r.text, r.assistant_spans);
}

ChatFormat resolve_chat_format(const Tokenizer& tok, const std::string& chat_format,
                               const std::string& source) {
  ChatFormat f = chat_format.empty() || chat_format == "auto"
                     ? detect_chat_format(tok.chat_template(), source)
                     : named_chat_format(chat_format);
  if (tok.bos_id()) f.bos_token = tok.id_to_token(*tok.bos_id());
  if (tok.eos_id()) f.eos_token = tok.id_to_token(*tok.eos_id());
  if (f.family == ChatFamily::mistral)
    SF_REQUIRE(!f.eos_token.empty(), source, ": the ", f.name,
               " chat template ends assistant turns with eos_token, but the tokenizer has none");
  return f;
}

// ---- SampleSet ------------------------------------------------------------------------------

std::shared_ptr<SampleSet> SampleSet::from_token_file(const fs::path& p, int seq_len) {
  SF_REQUIRE(seq_len > 0, "--seq-len must be positive");
  auto s = std::make_shared<SampleSet>();
  s->token_file_ = std::make_shared<TokenFile>(p);
  s->seq_len_ = seq_len;
  const int64_t n = s->token_file_->size();
  SF_REQUIRE(n >= 2, p.string(), ": ", n, " tokens are too few to train on");
  s->n_windows_ = (n - 1 + seq_len - 1) / seq_len;
  uint64_t h = hash_step(hash_step(0x70ce45, uint64_t(n)), uint64_t(seq_len));
  const int64_t stride = std::max<int64_t>(1, n / 4096);
  for (int64_t i = 0; i < n; i += stride) h = hash_step(h, (*s->token_file_)[i]);
  s->fingerprint_ = hash_step(h, (*s->token_file_)[n - 1]);
  return s;
}

int64_t SampleSet::length(int64_t i) const {
  if (token_file_) return std::min<int64_t>(seq_len_, token_file_->size() - 1 - i * seq_len_);
  return offsets_[size_t(i) + 1] - offsets_[size_t(i)];
}

void SampleSet::read(int64_t i, int64_t begin, int64_t len, int32_t* inputs, int32_t* labels) const {
  SF_CHECK(begin >= 0 && len >= 0 && begin + len <= length(i), "sample read out of range");
  if (token_file_) {
    const int64_t p = i * seq_len_ + begin;
    for (int64_t t = 0; t < len; ++t) {
      inputs[t] = int32_t((*token_file_)[p + t]);
      labels[t] = int32_t((*token_file_)[p + t + 1]);
    }
    return;
  }
  const int64_t o = offsets_[size_t(i)] + begin;
  std::copy_n(inputs_.begin() + o, len, inputs);
  std::copy_n(labels_.begin() + o, len, labels);
}

int64_t SampleSet::valid_labels(int64_t i, int64_t begin, int64_t len) const {
  if (token_file_) return len;
  const int64_t o = offsets_[size_t(i)] + begin;
  return std::count_if(labels_.begin() + o, labels_.begin() + o + len,
                       [](int32_t l) { return l != kIgnoreLabel; });
}

uint32_t SampleSet::max_token_id() const {
  if (token_file_) return token_file_->max_id();
  int32_t m = 0;
  for (int32_t t : inputs_) m = std::max(m, t);
  for (int32_t t : labels_) m = std::max(m, t);
  return uint32_t(m);
}

uint64_t SampleSet::sample_hash(int64_t i) const {
  uint64_t h = 0x5a3e;
  if (token_file_) return hash_step(h, uint64_t(i));
  for (int64_t t = offsets_[size_t(i)]; t < offsets_[size_t(i) + 1]; ++t)
    h = hash_step(h, (uint64_t(uint32_t(inputs_[size_t(t)])) << 32) | uint32_t(labels_[size_t(t)]));
  return h;
}

void SampleSet::add_document(const std::vector<int32_t>& tokens, const std::vector<uint8_t>& target) {
  SF_CHECK(tokens.size() == target.size() && tokens.size() >= 2, "document of ", tokens.size(), " tokens");
  for (size_t t = 0; t + 1 < tokens.size(); ++t) {
    inputs_.push_back(tokens[t]);
    labels_.push_back(target[t + 1] ? tokens[t + 1] : kIgnoreLabel);
  }
  offsets_.push_back(int64_t(inputs_.size()));
}

void SampleSet::finish() {
  uint64_t h = hash_step(0x5e75, uint64_t(size()));
  for (int64_t i = 0; i < size(); ++i) h = hash_step(h, sample_hash(i));
  fingerprint_ = h;
}

// ---- loading --------------------------------------------------------------------------------

std::string DataReport::summary() const {
  std::ostringstream os;
  os << path.string() << ": " << data_format_name(format);
  if (!chat_format.empty()) os << " (" << chat_format << " template)";
  os << ", " << samples << " samples";
  if (format != DataFormat::tokens) os << " from " << lines << " lines";
  os << ", " << tokens << " tokens (" << loss_tokens << " with loss)";
  if (bad_lines) os << "; " << bad_lines << " bad lines skipped";
  if (no_loss) os << "; " << no_loss << " samples with nothing to learn dropped";
  if (mask_fallback) os << "; " << mask_fallback << " masks from piecewise tokenization";
  return os.str();
}

LoadedData load_dataset(const fs::path& path, const Tokenizer* tok, const DatasetOptions& opt) {
  SF_REQUIRE(fs::exists(path), path.string(), ": no such dataset file");
  LoadedData out;
  DataReport& rep = out.report;
  rep.path = path;
  rep.format = detect_format(path, opt.format, opt.skip_bad_lines);
  if (rep.format == DataFormat::tokens) {
    out.samples = SampleSet::from_token_file(path, opt.seq_len);
    rep.samples = out.samples->size();
    for (int64_t i = 0; i < rep.samples; ++i) rep.tokens += out.samples->length(i);
    rep.loss_tokens = rep.tokens;
    return out;
  }
  SF_REQUIRE(tok, path.string(), ": a ", data_format_name(rep.format),
             " dataset needs the model's tokenizer");
  ChatFormat chat;
  LineContext ctx{rep.format, tok, &chat, {opt.chat_date}};
  if (rep.format == DataFormat::messages) {
    const std::string src = opt.tokenizer_dir.empty()
                                ? std::string("the tokenizer's tokenizer_config.json")
                                : (opt.tokenizer_dir / "tokenizer_config.json").string();
    chat = resolve_chat_format(*tok, opt.chat_format, src);
    rep.chat_format = chat.name;
    if (chat.family == ChatFamily::llama3 && chat.llama31_system) {
      // One date for the whole run (and its resume), even across midnight.
      if (ctx.render.date_string.empty())
        ctx.render.date_string = chat.date_from_clock ? today_date_string() : chat.date_string;
      rep.chat_date = ctx.render.date_string;
    }
  }
  auto samples = std::make_shared<SampleSet>();
  JsonlReader reader(path);
  std::vector<std::string_view> lines;
  int64_t first = 0;
  struct Result {
    TokenizedDoc doc;
    std::string error;
    bool blank = false;
  };
  std::vector<Result> results;
  while (reader.next_block(lines, first)) {
    results.assign(lines.size(), Result{});
    const int64_t n = int64_t(lines.size());
    const int64_t per_task = 64;
    host_pool().run_tasks((n + per_task - 1) / per_task, [&](int64_t task) {
      for (int64_t i = task * per_task; i < std::min(n, (task + 1) * per_task); ++i) {
        Result& r = results[size_t(i)];
        if (blank_line(lines[size_t(i)])) {
          r.blank = true;
          continue;
        }
        try {
          r.doc = process_line(lines[size_t(i)], ctx);
        } catch (const Error& e) {
          r.error = e.what();
        }
      }
    });
    for (size_t i = 0; i < results.size(); ++i) {
      Result& r = results[i];
      if (r.blank) continue;
      ++rep.lines;
      if (!r.error.empty()) {
        std::string msg = path.string() + ":" + std::to_string(first + int64_t(i)) + ": " + r.error;
        if (!opt.skip_bad_lines)
          SF_FAIL(input, msg, " (fix the line, or pass --skip-bad-lines to skip and count such lines)");
        ++rep.bad_lines;
        if (rep.bad_examples.size() < 5) rep.bad_examples.push_back(std::move(msg));
        continue;
      }
      bool any = false;
      for (size_t t = 1; t < r.doc.target.size(); ++t) any |= r.doc.target[t] != 0;
      if (r.doc.tokens.size() < 2 || !any) {
        ++rep.no_loss;
        continue;
      }
      rep.mask_fallback += r.doc.mask_fallback;
      samples->add_document(r.doc.tokens, r.doc.target);
      r.doc = {};
    }
  }
  samples->finish();
  rep.samples = samples->size();
  SF_REQUIRE(rep.samples > 0, path.string(), ": no usable sample (", rep.lines, " lines, ",
             rep.bad_lines, " bad)");
  for (int64_t i = 0; i < rep.samples; ++i) {
    rep.tokens += samples->length(i);
    rep.loss_tokens += samples->valid_labels(i, 0, samples->length(i));
  }
  out.samples = std::move(samples);
  return out;
}

DataSplit split_dataset(const SampleSet& s, double fraction) {
  SF_REQUIRE(fraction >= 0 && fraction < 1, "--eval-fraction must be in [0, 1), got ", fraction);
  const int64_t n = s.size();
  DataSplit sp;
  int64_t k = 0;
  if (fraction > 0 && n >= 2)
    k = std::clamp<int64_t>(std::llround(fraction * double(n)), 1, n - 1);
  std::vector<int64_t> idx(static_cast<size_t>(n));
  std::iota(idx.begin(), idx.end(), 0);
  if (!s.is_token_file() && k > 0) {
    std::vector<std::pair<uint64_t, int64_t>> key(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) key[size_t(i)] = {s.sample_hash(i), i};
    std::nth_element(key.begin(), key.begin() + k, key.end());
    std::vector<uint8_t> is_eval(static_cast<size_t>(n), 0);
    for (int64_t i = 0; i < k; ++i) is_eval[size_t(key[size_t(i)].second)] = 1;
    for (int64_t i = 0; i < n; ++i) (is_eval[size_t(i)] ? sp.eval : sp.train).push_back(i);
    return sp;
  }
  sp.train.assign(idx.begin(), idx.end() - k);
  sp.eval.assign(idx.end() - k, idx.end());
  return sp;
}

}  // namespace sf
