#include "data/sample_set.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/thread_pool.h"
#include "data/dataset_records.h"
#include "data/data_file_kind.h"
#include "data/record_formats.h"

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

}  // namespace

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

namespace {

// ---- records -------------------------------------------------------------------------------

std::string json_error(const json::exception& e) {
  std::string m = e.what();
  if (m.starts_with("[json.exception.")) m = m.substr(m.find(']') + 2);
  return "invalid JSON: " + m;
}

TokenizedDoc process_record(const Record& rec, const RecordContext& c) {
  if (c.format == DataFormat::plain_text) return tokenize_document(std::string(rec.text), c);
  if (rec.value) return tokenize_record(*rec.value, c);
  json o;
  try {
    o = json::parse(rec.text);
  } catch (const json::exception& e) {
    SF_FAIL(input, json_error(e));
  }
  return tokenize_record(o, c);
}

DataFormat forced_format(const std::string& forced) {
  if (forced == "prompt-completion") return DataFormat::prompt_completion;
  if (forced == "chat") return DataFormat::messages;
  for (DataFormat f : {DataFormat::text, DataFormat::prompt_completion, DataFormat::messages,
                       DataFormat::tokens, DataFormat::sharegpt, DataFormat::chat_prompt_completion,
                       DataFormat::alpaca, DataFormat::plain_text})
    if (forced == data_format_name(f)) return f;
  SF_FAIL(input, "--data-format ", forced, " is not known; use auto, text, prompt_completion, "
          "messages, sharegpt, chat_prompt_completion, alpaca, plain_text or tokens");
}

}  // namespace

DataFormat detect_data_format(const fs::path& path, const std::string& forced, bool skip_bad) {
  const std::string ext = path.extension().string();
  if (forced != "auto") return forced_format(forced);
  if (is_token_file_extension(ext)) return DataFormat::tokens;
  RecordReader r(path, record_layout(path));
  if (r.layout() == RecordLayout::text_documents) return DataFormat::plain_text;
  std::vector<Record> recs;
  while (r.next_block(recs)) {
    for (const Record& rec : recs) {
      json parsed;
      const json* o = rec.value;
      if (!o) {
        try {
          parsed = json::parse(rec.text);
        } catch (const json::exception& e) {
          if (skip_bad) continue;
          SF_FAIL(input, r.where(rec.number), ": ", json_error(e));
        }
        o = &parsed;
      }
      if (!o->is_object()) {
        if (skip_bad) continue;
        SF_FAIL(input, r.where(rec.number), ": expected a JSON object, got ",
                o->is_array() ? "an array" : "a " + std::string(o->type_name()));
      }
      return format_of_record(*o, r.where(rec.number));
    }
  }
  SF_FAIL(input, path.string(), ": no dataset record found (the file is empty or every record is bad)");
}

// ---- public helpers -------------------------------------------------------------------------

const char* data_format_name(DataFormat f) {
  switch (f) {
    case DataFormat::text: return "text";
    case DataFormat::prompt_completion: return "prompt_completion";
    case DataFormat::messages: return "messages";
    case DataFormat::tokens: return "tokens";
    case DataFormat::sharegpt: return "sharegpt";
    case DataFormat::chat_prompt_completion: return "chat_prompt_completion";
    case DataFormat::alpaca: return "alpaca";
    case DataFormat::plain_text: return "plain_text";
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
  if (format != DataFormat::tokens) os << " from " << lines << " records";
  os << ", " << tokens << " tokens (" << loss_tokens << " with loss)";
  if (bad_lines) os << "; " << bad_lines << " bad records skipped";
  if (no_loss) os << "; " << no_loss << " samples with nothing to learn dropped";
  if (mask_fallback) os << "; " << mask_fallback << " masks from piecewise tokenization";
  return os.str();
}

namespace {

// The chat format of a file of `format`: resolved from the tokenizer or forced; alpaca without
// one (no --chat-format, no chat_template) renders as prompt/completion (null).
std::optional<ChatFormat> chat_for(DataFormat format, const Tokenizer& tok,
                                   const DatasetOptions& opt) {
  if (!format_renders_chat(format)) return std::nullopt;
  if (format == DataFormat::alpaca && opt.chat_format == "auto" && tok.chat_template().empty())
    return std::nullopt;
  const std::string src = opt.tokenizer_dir.empty()
                              ? std::string("the tokenizer's tokenizer_config.json")
                              : (opt.tokenizer_dir / "tokenizer_config.json").string();
  return resolve_chat_format(tok, opt.chat_format, src);
}

struct RecordResult {
  TokenizedDoc doc;
  std::string error;
};

// Tokenizes one block of records in parallel.
void tokenize_block(const std::vector<Record>& recs, const RecordContext& ctx,
                    std::vector<RecordResult>& results) {
  results.assign(recs.size(), RecordResult{});
  const int64_t n = int64_t(recs.size());
  const int64_t per_task = 64;
  host_pool().run_tasks((n + per_task - 1) / per_task, [&](int64_t task) {
    for (int64_t i = task * per_task; i < std::min(n, (task + 1) * per_task); ++i) {
      try {
        results[size_t(i)].doc = process_record(recs[size_t(i)], ctx);
      } catch (const Error& e) {
        results[size_t(i)].error = e.what();
      }
    }
  });
}

LoadedData load_token_file(const fs::path& path, const DatasetOptions& opt) {
  LoadedData out;
  out.report.path = path;
  out.report.format = DataFormat::tokens;
  out.samples = SampleSet::from_token_file(path, opt.seq_len);
  out.report.samples = out.samples->size();
  for (int64_t i = 0; i < out.report.samples; ++i) out.report.tokens += out.samples->length(i);
  out.report.loss_tokens = out.report.tokens;
  return out;
}

}  // namespace

LoadedData load_dataset(const fs::path& path, const Tokenizer* tok, const DatasetOptions& opt) {
  SF_REQUIRE(fs::exists(path), path.string(), ": no such dataset file");
  const DataFormat format = detect_data_format(path, opt.format, opt.skip_bad_lines);
  if (format == DataFormat::tokens) return load_token_file(path, opt);
  LoadedData out;
  DataReport& rep = out.report;
  rep.path = path;
  rep.format = format;
  SF_REQUIRE(tok, path.string(), ": a ", data_format_name(rep.format),
             " dataset needs the model's tokenizer");
  const std::optional<ChatFormat> chat = chat_for(format, *tok, opt);
  RecordContext ctx{rep.format, tok, chat ? &*chat : nullptr, {opt.chat_date}};
  if (chat) {
    rep.chat_format = chat->name;
    if (chat->family == ChatFamily::llama3 && chat->llama31_system) {
      // One date for the whole run (and its resume), even across midnight.
      if (ctx.render.date_string.empty())
        ctx.render.date_string = chat->date_from_clock ? today_date_string() : chat->date_string;
      rep.chat_date = ctx.render.date_string;
    }
  } else if (format == DataFormat::alpaca) {
    rep.chat_format = "no chat template: as prompt/completion";
  }
  auto samples = std::make_shared<SampleSet>();
  RecordReader reader(path, format == DataFormat::plain_text ? RecordLayout::text_documents
                                                             : record_layout(path));
  std::vector<Record> recs;
  std::vector<RecordResult> results;
  while (reader.next_block(recs)) {
    tokenize_block(recs, ctx, results);
    for (size_t i = 0; i < results.size(); ++i) {
      RecordResult& r = results[i];
      ++rep.lines;
      if (!r.error.empty()) {
        std::string msg = reader.where(recs[i].number) + ": " + r.error;
        if (!opt.skip_bad_lines)
          SF_FAIL(input, msg, " (fix the record, or pass --skip-bad-lines to skip and count such records)");
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
  SF_REQUIRE(rep.samples > 0, path.string(), ": no usable sample (", rep.lines, " records, ",
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
