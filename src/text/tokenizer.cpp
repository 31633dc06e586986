// Native Hugging Face tokenizer (see tokenizer.h). The encode pipeline mirrors `tokenizers`:
//   1. split the raw text on added tokens with normalized=false (leftmost-longest);
//   2. normalize each remaining piece, then split it on added tokens with normalized=true;
//   3. run the pre-tokenizer steps over each piece (recursively, no intermediate vectors);
//   4. BPE each word (cached), merging by rank with HF's priority-queue order.
// Decoding maps ids to token strings and runs the decoder chain.
#include "text/tokenizer.h"

#include <algorithm>
#include <array>
#include <fstream>
#include <mutex>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "text/tokenizer_regex.h"
#include "text/tokenizer_unicode.h"

namespace sf {

namespace {

using json = nlohmann::json;

struct StrHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using StrMap = std::unordered_map<std::string, V, StrHash, std::equal_to<>>;

// ---- byte-level alphabet (GPT-2's bytes_to_unicode) ---------------------------------------

struct ByteAlphabet {
  char32_t to_cp[256];
  std::string to_utf8[256];
  int16_t from_cp[324];  // code point -> byte, -1 if not in the alphabet
  ByteAlphabet() {
    std::fill(std::begin(from_cp), std::end(from_cp), int16_t(-1));
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      to_cp[b] = printable ? char32_t(b) : char32_t(256 + n++);
      uni::append_utf8(to_utf8[b], to_cp[b]);
      from_cp[to_cp[b]] = int16_t(b);
    }
  }
  int byte_of(char32_t c) const { return c < 324 ? from_cp[c] : -1; }
};
const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet a;
  return a;
}

// ---- merge table: (left id, right id) -> (rank, merged id), open addressing -----------------

class PairMap {
 public:
  struct Value {
    uint32_t rank;
    int32_t id;
  };
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    keys_.assign(cap, kEmpty);
    vals_.assign(cap, Value{0, 0});
    mask_ = cap - 1;
  }
  void insert_or_assign(int32_t a, int32_t b, Value v) {
    const uint64_t key = make_key(a, b);
    size_t i = slot(key);
    while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & mask_;
    keys_[i] = key;
    vals_[i] = v;
  }
  const Value* find(int32_t a, int32_t b) const {
    const uint64_t key = make_key(a, b);
    size_t i = slot(key);
    while (true) {
      if (keys_[i] == key) return &vals_[i];
      if (keys_[i] == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t(0);
  static uint64_t make_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  size_t slot(uint64_t key) const { return size_t((key * 0x9E3779B97F4A7C15ull) >> 32) & mask_; }
  std::vector<uint64_t> keys_;
  std::vector<Value> vals_;
  size_t mask_ = 0;
};

// ---- added tokens ---------------------------------------------------------------------------

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// Byte trie over added-token strings, for leftmost-longest matching.
class TokenTrie {
 public:
  bool empty() const { return nodes_.size() == 1; }
  void add(std::string_view s, int32_t token) {
    if (s.empty()) return;
    int32_t n = 0;
    for (unsigned char c : s) {
      int32_t child = -1;
      for (auto& [k, v] : nodes_[size_t(n)].kids)
        if (k == c) child = v;
      if (child < 0) {
        child = int32_t(nodes_.size());
        nodes_[size_t(n)].kids.emplace_back(c, child);
        nodes_.emplace_back();
      }
      n = child;
    }
    if (nodes_[size_t(n)].token < 0) nodes_[size_t(n)].token = token;
    first_[static_cast<unsigned char>(s[0])] = true;
  }
  bool may_start(unsigned char c) const { return first_[c]; }
  // The longest token at s[i..]: (token, byte length) or (-1, 0).
  std::pair<int32_t, size_t> longest(std::string_view s, size_t i) const {
    int32_t n = 0, best = -1;
    size_t best_len = 0;
    for (size_t j = i; j < s.size(); ++j) {
      int32_t child = -1;
      for (auto& [k, v] : nodes_[size_t(n)].kids)
        if (k == static_cast<unsigned char>(s[j])) child = v;
      if (child < 0) break;
      n = child;
      if (nodes_[size_t(n)].token >= 0) {
        best = nodes_[size_t(n)].token;
        best_len = j + 1 - i;
      }
    }
    return {best, best_len};
  }

 private:
  struct Node {
    std::vector<std::pair<unsigned char, int32_t>> kids;
    int32_t token = -1;
  };
  std::vector<Node> nodes_{Node{}};
  bool first_[256] = {};
};

struct Segment {
  size_t start, end;
  int32_t token;  // index into the added tokens, or -1 for text
};

// ---- pipeline steps -------------------------------------------------------------------------

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct NormStep {
  enum class Kind { nfc, prepend, replace, strip } kind;
  std::string a, b;  // prepend: a; replace: a -> b
  bool left = false, right = false;
};

struct PreStep {
  enum class Kind { byte_level, split_regex, split_string, metaspace, digits, whitespace_split } kind;
  bool add_prefix_space = false, use_regex = true;  // byte_level
  tok::SplitRegex regex;                            // split_regex
  std::string pattern;                              // split_string; metaspace: the replacement
  char32_t replacement = 0;                         // metaspace
  Behavior behavior = Behavior::isolated;
  bool invert = false;
  enum class Prepend { always, first, never } prepend = Prepend::always;  // metaspace
  bool split = true;                                                     // metaspace
  bool individual_digits = false;                                        // digits
};

struct DecStep {
  enum class Kind { byte_level, metaspace, replace, byte_fallback, fuse, strip } kind;
  std::string a, b;          // replace: a -> b; metaspace: a = replacement
  char32_t content = 0;      // strip
  size_t start = 0, stop = 0;  // strip
  bool prepend = true;       // metaspace: prepend_scheme != never
};

constexpr std::string_view kMeta = "\xE2\x96\x81";  // U+2581, SentencePiece's word boundary

struct Span {
  size_t start, end;
  bool match;
};

// Pieces kept by a split behaviour (HF NormalizedString::split), empty ones dropped.
void apply_behavior(const std::vector<Span>& m, Behavior b, bool invert,
                    std::vector<std::pair<size_t, size_t>>& out) {
  out.clear();
  std::vector<Span> acc;
  acc.reserve(m.size());
  bool prev = false;
  switch (b) {
    case Behavior::isolated:
      for (const auto& s : m) acc.push_back({s.start, s.end, false});
      break;
    case Behavior::removed:
      for (const auto& s : m) acc.push_back({s.start, s.end, s.match != invert});
      break;
    case Behavior::contiguous:
      for (const auto& s : m) {
        const bool is = s.match != invert;
        if (!acc.empty() && is == prev)
          acc.back().end = s.end;
        else
          acc.push_back({s.start, s.end, false});
        prev = is;
      }
      break;
    case Behavior::merged_with_previous:
      for (const auto& s : m) {
        const bool is = s.match != invert;
        if (!acc.empty() && is && !prev)
          acc.back().end = s.end;
        else
          acc.push_back({s.start, s.end, false});
        prev = is;
      }
      break;
    case Behavior::merged_with_next:
      for (auto it = m.rbegin(); it != m.rend(); ++it) {
        const bool is = it->match != invert;
        if (!acc.empty() && is && !prev)
          acc.back().start = it->start;
        else
          acc.push_back({it->start, it->end, false});
        prev = is;
      }
      std::reverse(acc.begin(), acc.end());
      break;
  }
  for (const auto& s : acc)
    if (!s.match && s.end > s.start) out.emplace_back(s.start, s.end);
}

// Matches of a code-point predicate: each matching code point is its own match.
template <class P>
void char_spans(std::string_view s, P pred, std::vector<Span>& out) {
  out.clear();
  size_t last = 0, i = 0;
  while (i < s.size()) {
    int len;
    const char32_t c = uni::decode_utf8(s.data() + i, &len);
    if (pred(c)) {
      if (last < i) out.push_back({last, i, false});
      out.push_back({i, i + size_t(len), true});
      last = i + size_t(len);
    }
    i += size_t(len);
  }
  if (last < s.size()) out.push_back({last, s.size(), false});
}

void string_spans(std::string_view s, std::string_view pat, std::vector<Span>& out) {
  out.clear();
  size_t last = 0, i = 0;
  while (!pat.empty() && (i = s.find(pat, i)) != std::string_view::npos) {
    if (last < i) out.push_back({last, i, false});
    out.push_back({i, i + pat.size(), true});
    i += pat.size();
    last = i;
  }
  if (last < s.size()) out.push_back({last, s.size(), false});
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty() || s.find(from) == std::string::npos) return;
  std::string r;
  r.reserve(s.size());
  size_t i = 0, j;
  while ((j = s.find(from, i)) != std::string::npos) {
    r.append(s, i, j - i);
    r.append(to);
    i = j + from.size();
  }
  r.append(s, i, std::string::npos);
  s.swap(r);
}

// ---- JSON helpers ---------------------------------------------------------------------------

struct Src {
  std::string file;
};

[[noreturn]] void bad(const Src& src, std::string_view field, const std::string& msg) {
  SF_FAIL(input, src.file, ": field \"", field, "\": ", msg);
}

const json* opt(const json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return (it == j.end() || it->is_null()) ? nullptr : &*it;
}
bool get_bool(const json& j, const char* key, bool dflt, const Src& src, const std::string& where) {
  const json* v = opt(j, key);
  if (!v) return dflt;
  if (!v->is_boolean()) bad(src, where + "." + key, "expected true or false, got " + v->dump());
  return v->get<bool>();
}
std::string get_str(const json& j, const char* key, const Src& src, const std::string& where) {
  const json* v = opt(j, key);
  if (!v || !v->is_string()) bad(src, where + "." + key, "missing or not a string");
  return v->get<std::string>();
}
size_t get_size(const json& j, const char* key, size_t dflt, const Src& src, const std::string& where) {
  const json* v = opt(j, key);
  if (!v) return dflt;
  if (!v->is_number_unsigned()) bad(src, where + "." + key, "expected a non-negative integer, got " + v->dump());
  return v->get<size_t>();
}
char32_t one_char(const std::string& s, const Src& src, const std::string& field) {
  if (s.empty() || !uni::is_valid_utf8(s)) bad(src, field, "expected one character");
  int len;
  const char32_t c = uni::decode_utf8(s.data(), &len);
  if (size_t(len) != s.size()) bad(src, field, "expected one character, got \"" + s + "\"");
  return c;
}
// A pattern object {"String": s} (ok) or {"Regex": r} (returned in *regex).
std::string get_pattern(const json& j, const Src& src, const std::string& where, bool* is_regex) {
  const json* p = opt(j, "pattern");
  if (!p || !p->is_object()) bad(src, where + ".pattern", "missing (expected {\"String\": ...} or {\"Regex\": ...})");
  if (const json* s = opt(*p, "String"); s && s->is_string()) {
    *is_regex = false;
    return s->get<std::string>();
  }
  if (const json* r = opt(*p, "Regex"); r && r->is_string()) {
    *is_regex = true;
    return r->get<std::string>();
  }
  bad(src, where + ".pattern", "expected {\"String\": ...} or {\"Regex\": ...}, got " + p->dump());
}
Behavior parse_behavior(const json& j, const Src& src, const std::string& where) {
  const std::string b = get_str(j, "behavior", src, where);
  if (b == "Removed") return Behavior::removed;
  if (b == "Isolated") return Behavior::isolated;
  if (b == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (b == "MergedWithNext") return Behavior::merged_with_next;
  if (b == "Contiguous") return Behavior::contiguous;
  bad(src, where + ".behavior", "unknown split behavior \"" + b + "\"");
}
PreStep::Prepend parse_prepend_scheme(const json& j, const Src& src, const std::string& where) {
  if (const json* p = opt(j, "prepend_scheme")) {
    const std::string s = p->is_string() ? p->get<std::string>() : p->dump();
    if (s == "always") return PreStep::Prepend::always;
    if (s == "first") return PreStep::Prepend::first;
    if (s == "never") return PreStep::Prepend::never;
    bad(src, where + ".prepend_scheme", "expected \"always\", \"first\" or \"never\", got " + s);
  }
  // Files written before prepend_scheme existed carry add_prefix_space instead.
  return get_bool(j, "add_prefix_space", true, src, where) ? PreStep::Prepend::always
                                                            : PreStep::Prepend::never;
}

json read_json(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  if (!f) SF_FAIL(io, p.string(), ": cannot open for reading");
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::parse_error& e) {
    SF_FAIL(input, p.string(), ": malformed JSON: ", e.what());
  }
}

}  // namespace

// =============================================================================================

struct Tokenizer::Impl {
  Src src;
  // Model (BPE).
  StrMap<int32_t> vocab;
  std::vector<std::string> model_tokens;  // id -> token ("" for holes)
  std::vector<bool> model_has;
  PairMap merges;
  int32_t unk_id = -1;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  std::string prefix, suffix;  // continuing_subword_prefix, end_of_word_suffix
  int32_t byte_fallback_ids[256];
  int32_t byte_sym[256];  // byte-level fast path: id of the single-character token of each byte
  // Added tokens.
  std::vector<AddedToken> added;
  StrMap<int32_t> added_by_content;  // -> index into added
  TokenTrie raw_trie, norm_trie;
  // Pipeline.
  std::vector<NormStep> normalizers;
  std::vector<PreStep> pre;
  bool defer_byte_map = false;  // the last pre-tokenizer step is ByteLevel: map bytes in the model
  // SentencePiece-style vocabularies: no token holds a "▁" after another character, so no
  // merge crosses the start of a "▁word", and BPE of a long word equals BPE of its "▁" pieces
  // (which the cache then serves). Set when that holds of the whole vocabulary.
  bool split_at_metaspace = false;
  bool has_decoder = false;
  std::vector<DecStep> decoders;
  bool byte_level_decode_only = false;
  // Id tables over model and added tokens (added first, as HF's id_to_token).
  std::vector<std::string> id_tokens;
  std::vector<uint8_t> id_flags;  // 1: has a token, 2: special
  std::vector<std::string> id_bytes;  // byte-level decode fast path
  int64_t vocab_size = 0;
  // Config.
  std::optional<int32_t> bos, eos, pad;
  bool add_bos = false;
  std::string chat_template;

  // Word cache (BPE results), sharded to keep concurrent encodes from contending.
  static constexpr size_t kShards = 64, kShardCapacity = 2048, kMaxCachedWord = 256;
  struct Shard {
    std::mutex mu;
    StrMap<std::vector<int32_t>> map;
  };
  mutable std::array<Shard, kShards> cache;

  int32_t lookup(std::string_view s) const {
    auto it = vocab.find(s);
    return it == vocab.end() ? -1 : it->second;
  }

  // ---- loading ----
  void load_model(const json& m);
  void load_added(const json& j);
  void load_normalizer(const json& n, const std::string& where);
  void load_pre_tokenizer(const json& p, const std::string& where);
  void load_decoder(const json& d, const std::string& where);
  void finish();
  void load_config(const std::filesystem::path& dir, const json& tokenizer_json);

  // ---- encoding ----
  void find_matches(std::string_view s, const TokenTrie& trie, bool skip_special,
                    std::vector<Segment>& out) const;
  std::string_view normalize(std::string_view s, std::string& buf) const;
  void pre_tokenize(size_t step, std::string_view piece, bool origin, std::vector<int32_t>& out) const;
  void model_word(std::string_view word, std::vector<int32_t>& out) const;
  void cached_bpe(std::string_view word, std::vector<int32_t>& out) const;
  void bpe(std::string_view word, std::vector<int32_t>& out) const;
  void encode(std::string_view text, bool skip_special, std::vector<int32_t>& out) const;
  // ---- decoding ----
  std::string decode(std::span<const int32_t> ids, bool skip_special) const;
};

// ---- loading --------------------------------------------------------------------------------

void Tokenizer::Impl::load_model(const json& m) {
  if (!m.is_object()) bad(src, "model", "missing or not an object");
  std::string type = "BPE";
  if (const json* t = opt(m, "type")) {
    type = t->is_string() ? t->get<std::string>() : t->dump();
  } else if (!opt(m, "merges")) {
    bad(src, "model.type", "missing, and the model has no merges (only BPE is supported)");
  }
  if (type != "BPE")
    bad(src, "model.type", "unsupported model type \"" + type + "\" (only BPE is supported)");
  const json* v = opt(m, "vocab");
  if (!v || !v->is_object()) bad(src, "model.vocab", "missing or not an object of token -> id");
  vocab.reserve(v->size());
  int32_t max_id = -1;
  for (auto it = v->begin(); it != v->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() > INT32_MAX)
      bad(src, "model.vocab", "id of token \"" + it.key() + "\" is not a non-negative integer");
    const auto id = int32_t(it.value().get<int64_t>());
    vocab[it.key()] = id;
    max_id = std::max(max_id, id);
  }
  model_tokens.assign(size_t(max_id + 1), std::string());
  model_has.assign(size_t(max_id + 1), false);
  for (const auto& [tok, id] : vocab) {
    model_tokens[size_t(id)] = tok;
    model_has[size_t(id)] = true;
  }
  if (const json* d = opt(m, "dropout"); d && !(d->is_number() && d->get<double>() == 0.0))
    bad(src, "model.dropout", "BPE dropout is not supported (expected null), got " + d->dump());
  if (const json* u = opt(m, "unk_token")) {
    if (!u->is_string()) bad(src, "model.unk_token", "expected a string or null");
    unk_id = lookup(u->get<std::string>());
    if (unk_id < 0) bad(src, "model.unk_token", "\"" + u->get<std::string>() + "\" is not in the vocabulary");
  }
  fuse_unk = get_bool(m, "fuse_unk", false, src, "model");
  byte_fallback = get_bool(m, "byte_fallback", false, src, "model");
  ignore_merges = get_bool(m, "ignore_merges", false, src, "model");
  if (const json* p = opt(m, "continuing_subword_prefix")) prefix = p->get<std::string>();
  if (const json* p = opt(m, "end_of_word_suffix")) suffix = p->get<std::string>();
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    byte_fallback_ids[b] = lookup(name);
    byte_sym[b] = lookup(byte_alphabet().to_utf8[b]);
  }

  const json* mg = opt(m, "merges");
  if (!mg) bad(src, "model.merges", "missing (a BPE model needs its merges)");
  if (!mg->is_array()) bad(src, "model.merges", "expected an array");
  merges.reserve(mg->size());
  uint32_t rank = 0;
  std::string left, right;
  for (const auto& e : *mg) {
    const std::string where = "model.merges[" + std::to_string(rank) + "]";
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        bad(src, where, "expected \"left right\" (two tokens, one space), got \"" + s + "\"");
      left = s.substr(0, sp);
      right = s.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      left = e[0].get<std::string>();
      right = e[1].get<std::string>();
    } else {
      bad(src, where, "expected \"left right\" or [\"left\", \"right\"], got " + e.dump());
    }
    const int32_t a = lookup(left), b = lookup(right);
    if (a < 0) bad(src, where, "token \"" + left + "\" is not in the vocabulary");
    if (b < 0) bad(src, where, "token \"" + right + "\" is not in the vocabulary");
    if (!prefix.empty() && right.starts_with(prefix)) right.erase(0, prefix.size());
    const int32_t c = lookup(left + right);
    if (c < 0) bad(src, where, "merged token \"" + left + right + "\" is not in the vocabulary");
    merges.insert_or_assign(a, b, {rank, c});
    ++rank;
  }
}

void Tokenizer::Impl::load_added(const json& j) {
  if (j.is_null()) return;
  if (!j.is_array()) bad(src, "added_tokens", "expected an array");
  for (size_t i = 0; i < j.size(); ++i) {
    const json& t = j[i];
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    AddedToken a;
    a.content = get_str(t, "content", src, where);
    const json* id = opt(t, "id");
    if (!id || !id->is_number_integer() || id->get<int64_t>() < 0 || id->get<int64_t>() > INT32_MAX)
      bad(src, where + ".id", "missing or not a non-negative integer");
    a.single_word = get_bool(t, "single_word", false, src, where);
    a.lstrip = get_bool(t, "lstrip", false, src, where);
    a.rstrip = get_bool(t, "rstrip", false, src, where);
    a.special = get_bool(t, "special", false, src, where);
    a.normalized = get_bool(t, "normalized", !a.special, src, where);
    if (a.content.empty()) continue;  // HF ignores these
    if (auto it = added_by_content.find(a.content); it != added_by_content.end()) {
      AddedToken& old = added[size_t(it->second)];  // HF keeps the id and takes the new flags
      a.id = old.id;
      old = std::move(a);
      continue;
    }
    // HF assigns ids itself, ignoring the "id" field: a token already in the vocabulary keeps
    // that id; a new one gets the next id after the vocabulary and the added tokens so far.
    a.id = lookup(a.content);
    if (a.id < 0) {
      const auto model_size = int32_t(vocab.size());
      int32_t max = -1;
      for (const auto& b : added) max = std::max(max, b.id);
      a.id = max < 0 ? model_size : (max >= model_size || model_size == 0) ? max + 1 : model_size;
    }
    added_by_content[a.content] = int32_t(added.size());
    added.push_back(std::move(a));
  }
}

void Tokenizer::Impl::load_normalizer(const json& n, const std::string& where) {
  const std::string type = get_str(n, "type", src, where);
  if (type == "Sequence") {
    const json* list = opt(n, "normalizers");
    if (!list || !list->is_array()) bad(src, where + ".normalizers", "missing or not an array");
    for (size_t i = 0; i < list->size(); ++i)
      load_normalizer((*list)[i], where + ".normalizers[" + std::to_string(i) + "]");
  } else if (type == "NFC") {
    normalizers.push_back({NormStep::Kind::nfc, {}, {}});
  } else if (type == "Prepend") {
    normalizers.push_back({NormStep::Kind::prepend, get_str(n, "prepend", src, where), {}});
  } else if (type == "Replace") {
    bool is_regex;
    std::string pat = get_pattern(n, src, where, &is_regex);
    if (is_regex) bad(src, where + ".pattern", "Replace with a Regex pattern is not supported");
    if (pat.empty()) bad(src, where + ".pattern", "empty Replace pattern is not supported");
    normalizers.push_back({NormStep::Kind::replace, std::move(pat), get_str(n, "content", src, where)});
  } else if (type == "Strip") {
    NormStep s{NormStep::Kind::strip, {}, {}};
    s.left = get_bool(n, "strip_left", true, src, where);
    s.right = get_bool(n, "strip_right", true, src, where);
    normalizers.push_back(s);
  } else {
    bad(src, where + ".type", "unsupported normalizer type \"" + type +
                                  "\" (supported: NFC, Prepend, Replace, Strip, Sequence)");
  }
}

void Tokenizer::Impl::load_pre_tokenizer(const json& p, const std::string& where) {
  const std::string type = get_str(p, "type", src, where);
  PreStep s{};
  if (type == "Sequence") {
    const json* list = opt(p, "pretokenizers");
    if (!list || !list->is_array()) bad(src, where + ".pretokenizers", "missing or not an array");
    for (size_t i = 0; i < list->size(); ++i)
      load_pre_tokenizer((*list)[i], where + ".pretokenizers[" + std::to_string(i) + "]");
    return;
  } else if (type == "ByteLevel") {
    s.kind = PreStep::Kind::byte_level;
    s.add_prefix_space = get_bool(p, "add_prefix_space", true, src, where);
    s.use_regex = get_bool(p, "use_regex", true, src, where);
    s.regex = tok::gpt2_regex();
  } else if (type == "Split") {
    bool is_regex;
    std::string pat = get_pattern(p, src, where, &is_regex);
    s.behavior = parse_behavior(p, src, where);
    s.invert = get_bool(p, "invert", false, src, where);
    if (is_regex) {
      auto re = tok::recognize_split_regex(pat);
      if (!re)
        bad(src, where + ".pattern.Regex",
            "unsupported split regex \"" + pat + "\" (supported: the GPT-2, Llama-3 and Qwen2/3 patterns)");
      s.kind = PreStep::Kind::split_regex;
      s.regex = *re;
    } else {
      if (pat.empty()) bad(src, where + ".pattern.String", "empty split pattern is not supported");
      s.kind = PreStep::Kind::split_string;
      s.pattern = std::move(pat);
    }
  } else if (type == "Metaspace") {
    s.kind = PreStep::Kind::metaspace;
    s.pattern = get_str(p, "replacement", src, where);
    s.replacement = one_char(s.pattern, src, where + ".replacement");
    s.prepend = parse_prepend_scheme(p, src, where);
    s.split = get_bool(p, "split", true, src, where);
  } else if (type == "Digits") {
    s.kind = PreStep::Kind::digits;
    s.individual_digits = get_bool(p, "individual_digits", false, src, where);
  } else if (type == "WhitespaceSplit") {
    s.kind = PreStep::Kind::whitespace_split;
  } else {
    bad(src, where + ".type",
        "unknown pre-tokenizer type \"" + type +
            "\" (supported: ByteLevel, Split, Metaspace, Digits, WhitespaceSplit, Sequence)");
  }
  pre.push_back(std::move(s));
}

void Tokenizer::Impl::load_decoder(const json& d, const std::string& where) {
  const std::string type = get_str(d, "type", src, where);
  DecStep s{};
  if (type == "Sequence") {
    const json* list = opt(d, "decoders");
    if (!list || !list->is_array()) bad(src, where + ".decoders", "missing or not an array");
    for (size_t i = 0; i < list->size(); ++i)
      load_decoder((*list)[i], where + ".decoders[" + std::to_string(i) + "]");
    return;
  } else if (type == "ByteLevel") {
    s.kind = DecStep::Kind::byte_level;
  } else if (type == "Metaspace") {
    s.kind = DecStep::Kind::metaspace;
    s.a = get_str(d, "replacement", src, where);
    one_char(s.a, src, where + ".replacement");
    s.prepend = parse_prepend_scheme(d, src, where) != PreStep::Prepend::never;
  } else if (type == "Replace") {
    bool is_regex;
    s.a = get_pattern(d, src, where, &is_regex);
    if (is_regex) bad(src, where + ".pattern", "Replace with a Regex pattern is not supported");
    s.kind = DecStep::Kind::replace;
    s.b = get_str(d, "content", src, where);
  } else if (type == "ByteFallback") {
    s.kind = DecStep::Kind::byte_fallback;
  } else if (type == "Fuse") {
    s.kind = DecStep::Kind::fuse;
  } else if (type == "Strip") {
    s.kind = DecStep::Kind::strip;
    s.content = one_char(get_str(d, "content", src, where), src, where + ".content");
    s.start = get_size(d, "start", 0, src, where);
    s.stop = get_size(d, "stop", 0, src, where);
  } else {
    bad(src, where + ".type",
        "unsupported decoder type \"" + type +
            "\" (supported: ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence)");
  }
  decoders.push_back(std::move(s));
}

void Tokenizer::Impl::finish() {
  // Added-token tries: raw content for normalized=false, normalized content otherwise.
  for (size_t i = 0; i < added.size(); ++i) {
    if (!added[i].normalized) {
      raw_trie.add(added[i].content, int32_t(i));
    } else {
      std::string buf;
      norm_trie.add(normalize(added[i].content, buf), int32_t(i));
    }
  }
  defer_byte_map = !pre.empty() && pre.back().kind == PreStep::Kind::byte_level;
  const bool any_byte_level = std::any_of(pre.begin(), pre.end(), [](const PreStep& p) {
    return p.kind == PreStep::Kind::byte_level;
  });
  if (!any_byte_level && prefix.empty() && suffix.empty() && lookup(kMeta) >= 0) {
    split_at_metaspace = true;
    for (const auto& [tok, id] : vocab) {
      for (size_t i = tok.find(kMeta, 1); i != std::string::npos; i = tok.find(kMeta, i + 1))
        if (!std::string_view(tok).substr(0, i).ends_with(kMeta)) split_at_metaspace = false;
      if (!split_at_metaspace) break;
    }
  }
  byte_level_decode_only = decoders.size() == 1 && decoders[0].kind == DecStep::Kind::byte_level;

  // Id tables: added tokens take precedence over the model's (HF id_to_token).
  int32_t max_id = int32_t(model_tokens.size()) - 1;
  for (const auto& a : added) max_id = std::max(max_id, a.id);
  id_tokens.assign(size_t(max_id + 1), std::string());
  id_flags.assign(size_t(max_id + 1), 0);
  for (size_t id = 0; id < model_tokens.size(); ++id)
    if (model_has[id]) {
      id_tokens[id] = model_tokens[id];
      id_flags[id] = 1;
    }
  std::unordered_set<std::string_view> special;
  for (const auto& a : added) {
    id_tokens[size_t(a.id)] = a.content;
    id_flags[size_t(a.id)] = 1;
    if (a.special) special.insert(a.content);
  }
  for (size_t id = 0; id < id_tokens.size(); ++id)
    if ((id_flags[id] & 1) && special.count(id_tokens[id])) id_flags[id] |= 2;
  // HF get_vocab_size(true): distinct token strings of the model and added vocabularies.
  vocab_size = int64_t(vocab.size());
  for (const auto& a : added)
    if (!vocab.count(a.content)) ++vocab_size;
  if (byte_level_decode_only) {
    const ByteAlphabet& ab = byte_alphabet();
    id_bytes.assign(id_tokens.size(), std::string());
    for (size_t id = 0; id < id_tokens.size(); ++id) {
      const std::string& t = id_tokens[id];
      std::string bytes;
      bool all = true;
      for (size_t i = 0; i < t.size();) {
        int len;
        const int b = ab.byte_of(uni::decode_utf8(t.data() + i, &len));
        if (b < 0) {
          all = false;
          break;
        }
        bytes.push_back(char(b));
        i += size_t(len);
      }
      id_bytes[id] = all ? std::move(bytes) : t;
    }
  }
}

namespace {
// A special-token field of tokenizer_config.json: "text", {"content": "text", ...} or null.
std::optional<std::string> config_token(const json& cfg, const char* key, const Src& src) {
  const json* v = opt(cfg, key);
  if (!v) return std::nullopt;
  if (v->is_string()) return v->get<std::string>();
  if (v->is_object() && opt(*v, "content") && (*v)["content"].is_string()) return (*v)["content"].get<std::string>();
  bad(src, key, "expected a token string, {\"content\": ...} or null, got " + v->dump());
}
}  // namespace

void Tokenizer::Impl::load_config(const std::filesystem::path& dir, const json& tj) {
  // Template post-processors start with the BOS token when the model wants one.
  std::optional<std::string> template_bos;
  if (const json* pp = opt(tj, "post_processor")) {
    std::vector<const json*> procs{pp};
    if (opt(*pp, "type") && (*pp)["type"] == "Sequence" && opt(*pp, "processors") && (*pp)["processors"].is_array()) {
      procs.clear();
      for (const auto& p : (*pp)["processors"]) procs.push_back(&p);
    }
    for (const json* p : procs) {
      const json* type = opt(*p, "type");
      const json* single = opt(*p, "single");
      if (type && *type == "TemplateProcessing" && single && single->is_array() && !single->empty()) {
        const json& first = (*single)[0];
        if (const json* st = opt(first, "SpecialToken"); st && opt(*st, "id") && (*st)["id"].is_string())
          template_bos = (*st)["id"].get<std::string>();
      }
    }
  }
  const std::filesystem::path cfg_path = dir / "tokenizer_config.json";
  json cfg = json::object();
  if (std::filesystem::exists(cfg_path)) cfg = read_json(cfg_path);
  if (!cfg.is_object()) SF_FAIL(input, cfg_path.string(), ": expected a JSON object");
  const Src csrc{cfg_path.string()};
  auto id_of = [&](const std::string& tok, const char* key) -> int32_t {
    auto it = added_by_content.find(tok);
    const int32_t id = it != added_by_content.end() ? added[size_t(it->second)].id : lookup(tok);
    if (id < 0) bad(csrc, key, "token \"" + tok + "\" is not in the vocabulary of " + src.file);
    return id;
  };
  if (auto t = config_token(cfg, "bos_token", csrc)) bos = id_of(*t, "bos_token");
  if (auto t = config_token(cfg, "eos_token", csrc)) eos = id_of(*t, "eos_token");
  if (auto t = config_token(cfg, "pad_token", csrc)) pad = id_of(*t, "pad_token");
  if (const json* b = opt(cfg, "add_bos_token")) {
    if (!b->is_boolean()) bad(csrc, "add_bos_token", "expected true or false");
    add_bos = b->get<bool>();
  } else if (template_bos) {
    const int32_t id = id_of(*template_bos, "post_processor");
    add_bos = !bos || *bos == id;
    if (!bos) bos = id;
  }
  if (const json* t = opt(cfg, "chat_template")) {
    if (t->is_string()) {
      chat_template = t->get<std::string>();
    } else if (t->is_array()) {  // [{"name": ..., "template": ...}]: take "default", else the first
      for (const auto& e : *t)
        if (opt(e, "template") && e["template"].is_string() &&
            (chat_template.empty() || (opt(e, "name") && e["name"] == "default")))
          chat_template = e["template"].get<std::string>();
    } else {
      bad(csrc, "chat_template", "expected a string or a list of {name, template}");
    }
  } else if (std::filesystem::exists(dir / "chat_template.jinja")) {
    std::ifstream f(dir / "chat_template.jinja", std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    chat_template = ss.str();
  }
}

Tokenizer Tokenizer::load(const std::filesystem::path& path) {
  std::filesystem::path file = path;
  if (std::filesystem::is_directory(path)) file = path / "tokenizer.json";
  SF_REQUIRE(std::filesystem::exists(file), file.string(), ": no such file (expected a Hugging Face tokenizer.json)");
  auto impl = std::make_shared<Impl>();
  impl->src.file = file.string();
  const json j = read_json(file);
  if (!j.is_object()) bad(impl->src, "(top level)", "expected a JSON object");
  try {
    const json* model = opt(j, "model");
    if (!model) bad(impl->src, "model", "missing");
    impl->load_model(*model);
    if (const json* a = opt(j, "added_tokens")) impl->load_added(*a);
    if (const json* n = opt(j, "normalizer")) impl->load_normalizer(*n, "normalizer");
    if (const json* p = opt(j, "pre_tokenizer")) impl->load_pre_tokenizer(*p, "pre_tokenizer");
    if (const json* d = opt(j, "decoder")) {
      impl->has_decoder = true;
      impl->load_decoder(*d, "decoder");
    }
    impl->finish();
    impl->load_config(file.parent_path(), j);
  } catch (const json::exception& e) {
    SF_FAIL(input, file.string(), ": unexpected JSON structure: ", e.what());
  }
  return Tokenizer(std::move(impl));
}

// ---- encoding -------------------------------------------------------------------------------

void Tokenizer::Impl::find_matches(std::string_view s, const TokenTrie& trie, bool skip_special,
                                   std::vector<Segment>& out) const {
  out.clear();
  size_t start_offset = 0;
  const size_t n = s.size();
  auto word_at = [&](size_t i) {
    int len;
    return (uni::char_class(uni::decode_utf8(s.data() + i, &len)) & uni::kWord) != 0;
  };
  auto word_before = [&](size_t i) {  // the code point ending at byte i is a word character
    size_t k = i - 1;
    while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
    return word_at(k);
  };
  for (size_t i = 0; i < n;) {
    if (!trie.may_start(static_cast<unsigned char>(s[i]))) {
      ++i;
      continue;
    }
    const auto [tok, len] = trie.longest(s, i);
    if (tok < 0) {
      ++i;
      continue;
    }
    size_t start = i, stop = i + len;
    i = stop;  // like an Aho-Corasick iterator, resume after this match even if it is discarded
    const AddedToken& t = added[size_t(tok)];
    if (skip_special && t.special) continue;
    if (t.single_word) {
      const bool start_space = start == 0 || !word_before(start);
      const bool stop_space = stop == n || !word_at(stop);
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) {
      size_t k = start;  // start of the whitespace run that ends at `start`
      while (k > 0) {
        size_t p = k - 1;
        while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
        int l;
        if (!uni::is_whitespace(uni::decode_utf8(s.data() + p, &l))) break;
        k = p;
      }
      start = std::max(k, start_offset);
    }
    if (t.rstrip) {
      while (stop < n) {
        int l;
        if (!uni::is_whitespace(uni::decode_utf8(s.data() + stop, &l))) break;
        stop += size_t(l);
      }
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, tok});
    start_offset = stop;
  }
  if (start_offset < n) out.push_back({start_offset, n, -1});
}

std::string_view Tokenizer::Impl::normalize(std::string_view s, std::string& buf) const {
  if (normalizers.empty()) return s;
  buf.assign(s);
  for (const auto& n : normalizers) {
    switch (n.kind) {
      case NormStep::Kind::nfc:
        if (!uni::nfc_quick_check(buf)) buf = uni::nfc(buf);
        break;
      case NormStep::Kind::prepend:
        if (!buf.empty()) buf.insert(0, n.a);
        break;
      case NormStep::Kind::replace:
        replace_all(buf, n.a, n.b);
        break;
      case NormStep::Kind::strip: {
        size_t b = 0, e = buf.size();
        if (n.left)
          while (b < e) {
            int l;
            if (!uni::is_whitespace(uni::decode_utf8(buf.data() + b, &l))) break;
            b += size_t(l);
          }
        if (n.right)
          while (e > b) {
            size_t p = e - 1;
            while (p > b && (static_cast<unsigned char>(buf[p]) & 0xC0) == 0x80) --p;
            int l;
            if (!uni::is_whitespace(uni::decode_utf8(buf.data() + p, &l))) break;
            e = p;
          }
        buf = buf.substr(b, e - b);
        break;
      }
    }
  }
  return buf;
}

void Tokenizer::Impl::pre_tokenize(size_t step, std::string_view piece, bool origin,
                                   std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (step == pre.size()) {
    model_word(piece, out);
    return;
  }
  const PreStep& p = pre[step];
  const bool last = step + 1 == pre.size();
  std::vector<Span> spans;
  std::vector<std::pair<size_t, size_t>> parts;
  auto emit_parts = [&](std::string_view text) {
    for (const auto& [b, e] : parts) pre_tokenize(step + 1, text.substr(b, e - b), origin && b == 0, out);
  };
  switch (p.kind) {
    case PreStep::Kind::byte_level: {
      std::string with_space;
      std::string_view text = piece;
      if (p.add_prefix_space && piece[0] != ' ') {
        with_space.reserve(piece.size() + 1);
        with_space.push_back(' ');
        with_space.append(piece);
        text = with_space;
      }
      // Materialize the byte-to-character map unless the model applies it (last step).
      auto next = [&](std::string_view part, bool org) {
        if (last) {
          pre_tokenize(step + 1, part, org, out);
        } else {
          std::string mapped;
          for (unsigned char c : part) mapped += byte_alphabet().to_utf8[c];
          pre_tokenize(step + 1, mapped, org, out);
        }
      };
      if (!p.use_regex) {
        next(text, origin);
      } else {
        for (size_t i = 0; i < text.size();) {
          const size_t e = tok::match_at(p.regex, text, i);
          next(text.substr(i, e - i), origin && i == 0);
          i = e;
        }
      }
      return;
    }
    case PreStep::Kind::split_regex: {
      if (p.behavior == Behavior::isolated) {  // every match and gap is a piece; no vectors
        for (size_t i = 0; i < piece.size();) {
          const size_t e = tok::match_at(p.regex, piece, i);
          pre_tokenize(step + 1, piece.substr(i, e - i), origin && i == 0, out);
          i = e;
        }
        return;
      }
      for (size_t i = 0; i < piece.size();) {
        const size_t e = tok::match_at(p.regex, piece, i);
        spans.push_back({i, e, true});
        i = e;
      }
      apply_behavior(spans, p.behavior, p.invert, parts);
      emit_parts(piece);
      return;
    }
    case PreStep::Kind::split_string:
      string_spans(piece, p.pattern, spans);
      apply_behavior(spans, p.behavior, p.invert, parts);
      emit_parts(piece);
      return;
    case PreStep::Kind::digits:
      char_spans(piece, [](char32_t c) { return uni::is_numeric(c); }, spans);
      apply_behavior(spans, p.individual_digits ? Behavior::isolated : Behavior::contiguous, false, parts);
      emit_parts(piece);
      return;
    case PreStep::Kind::whitespace_split:
      char_spans(piece, [](char32_t c) { return uni::is_whitespace(c); }, spans);
      apply_behavior(spans, Behavior::removed, false, parts);
      emit_parts(piece);
      return;
    case PreStep::Kind::metaspace: {
      std::string text;
      text.reserve(piece.size() + 8);
      const bool starts = piece.starts_with(p.pattern) || piece[0] == ' ';
      if (!starts && (p.prepend == PreStep::Prepend::always || (p.prepend == PreStep::Prepend::first && origin)))
        text += p.pattern;
      for (char c : piece) {
        if (c == ' ')
          text += p.pattern;
        else
          text.push_back(c);
      }
      if (!p.split) {
        pre_tokenize(step + 1, text, origin, out);
        return;
      }
      const char32_t r = p.replacement;
      char_spans(text, [r](char32_t c) { return c == r; }, spans);
      apply_behavior(spans, Behavior::merged_with_next, false, parts);
      emit_parts(text);
      return;
    }
  }
}

void Tokenizer::Impl::model_word(std::string_view word, std::vector<int32_t>& out) const {
  if (split_at_metaspace) {
    // Cut before each "▁" that follows another character (see split_at_metaspace).
    size_t start = 0;
    for (size_t i = word.find(kMeta, 1); i != std::string_view::npos; i = word.find(kMeta, i + 1)) {
      if (word.substr(0, i).ends_with(kMeta)) continue;
      cached_bpe(word.substr(start, i - start), out);
      start = i;
    }
    cached_bpe(word.substr(start), out);
    return;
  }
  cached_bpe(word, out);
}

void Tokenizer::Impl::cached_bpe(std::string_view word, std::vector<int32_t>& out) const {
  if (word.size() >= kMaxCachedWord) {
    bpe(word, out);
    return;
  }
  const size_t h = StrHash{}(word);
  Shard& shard = cache[(h >> 7) % kShards];
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    auto it = shard.map.find(word);
    if (it != shard.map.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t before = out.size();
  bpe(word, out);
  std::vector<int32_t> ids(out.begin() + ptrdiff_t(before), out.end());
  std::lock_guard<std::mutex> lock(shard.mu);
  if (shard.map.size() >= kShardCapacity) shard.map.clear();
  shard.map.emplace(std::string(word), std::move(ids));
}

namespace {
struct Symbol {
  int32_t id;
  int32_t prev, next;
  uint32_t len;  // bytes covered; 0 once merged into its left neighbour
};
struct MergeCand {
  uint32_t rank;
  uint32_t pos;
  int32_t id;
  bool operator<(const MergeCand& o) const {  // max-heap order: lowest rank, then leftmost, on top
    return rank != o.rank ? rank > o.rank : pos > o.pos;
  }
};
}  // namespace

void Tokenizer::Impl::bpe(std::string_view word, std::vector<int32_t>& out) const {
  // `word` is raw bytes when the ByteLevel map is deferred to here; the model sees it mapped.
  std::string mapped_buf;
  std::string_view m = word;
  // Fast path: every byte has its single-character token, so the symbols are known directly.
  const bool fast_bytes = defer_byte_map && prefix.empty() && suffix.empty() &&
                          std::all_of(word.begin(), word.end(),
                                      [&](char c) { return byte_sym[static_cast<unsigned char>(c)] >= 0; });
  if (defer_byte_map && (!fast_bytes || ignore_merges)) {
    for (unsigned char c : word) mapped_buf += byte_alphabet().to_utf8[c];
    m = mapped_buf;
  }
  if (ignore_merges) {
    if (int32_t id = lookup(m); id >= 0) {
      out.push_back(id);
      return;
    }
  }
  thread_local std::vector<Symbol> syms;
  syms.clear();
  auto add = [&](int32_t id, uint32_t len) {
    const auto n = int32_t(syms.size());
    syms.push_back({id, n - 1, -1, len});
    if (n > 0) syms[size_t(n - 1)].next = n;
  };
  if (fast_bytes) {
    for (unsigned char c : word) add(byte_sym[c], 1);
  } else {
    // HF BPE::merge_word: one symbol per character (with prefix / suffix), byte fallback, unk.
    int32_t unk = -1;
    uint32_t unk_len = 0;
    std::string piece;
    for (size_t i = 0; i < m.size();) {
      const size_t len = size_t(uni::utf8_len(static_cast<unsigned char>(m[i])));
      const bool first = i == 0, is_last = i + len >= m.size();
      piece.clear();
      if (!first) piece += prefix;
      piece.append(m.substr(i, len));
      if (is_last) piece += suffix;
      i += len;
      if (const int32_t id = lookup(piece); id >= 0) {
        if (unk >= 0) {
          add(unk, unk_len);
          unk = -1;
        }
        add(id, uint32_t(len));
        continue;
      }
      if (byte_fallback) {
        bool all = true;
        for (unsigned char c : piece) all = all && byte_fallback_ids[c] >= 0;
        if (all) {
          for (unsigned char c : piece) add(byte_fallback_ids[c], 1);
          continue;
        }
      }
      if (unk_id >= 0) {
        if (unk >= 0 && fuse_unk) {
          unk_len += uint32_t(len);
        } else {
          if (unk >= 0) add(unk, unk_len);
          unk = unk_id;
          unk_len = uint32_t(len);
        }
      }
    }
    if (unk >= 0) add(unk, unk_len);
  }
  if (syms.size() > 1) {
    thread_local std::vector<MergeCand> heap;
    heap.clear();
    for (size_t i = 0; i + 1 < syms.size(); ++i)
      if (const auto* v = merges.find(syms[i].id, syms[i + 1].id)) heap.push_back({v->rank, uint32_t(i), v->id});
    std::make_heap(heap.begin(), heap.end());
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end());
      const MergeCand top = heap.back();
      heap.pop_back();
      Symbol& cur = syms[top.pos];
      if (cur.len == 0 || cur.next < 0) continue;
      const auto rpos = size_t(cur.next);
      const Symbol right = syms[rpos];
      const auto* v = merges.find(cur.id, right.id);
      if (!v || v->id != top.id) continue;  // stale entry: the pair here has changed
      cur.id = top.id;
      cur.len += right.len;
      cur.next = right.next;
      syms[rpos].len = 0;
      if (right.next >= 0) syms[size_t(right.next)].prev = int32_t(top.pos);
      if (cur.prev >= 0)
        if (const auto* w = merges.find(syms[size_t(cur.prev)].id, cur.id)) {
          heap.push_back({w->rank, uint32_t(cur.prev), w->id});
          std::push_heap(heap.begin(), heap.end());
        }
      if (cur.next >= 0)
        if (const auto* w = merges.find(cur.id, syms[size_t(cur.next)].id)) {
          heap.push_back({w->rank, top.pos, w->id});
          std::push_heap(heap.begin(), heap.end());
        }
    }
  }
  for (const auto& s : syms)
    if (s.len) out.push_back(s.id);
}

void Tokenizer::Impl::encode(std::string_view text, bool skip_special, std::vector<int32_t>& out) const {
  std::vector<Segment> segs, sub;
  find_matches(text, raw_trie, skip_special, segs);
  std::string buf;
  for (const auto& sg : segs) {
    if (sg.token >= 0) {
      out.push_back(added[size_t(sg.token)].id);
      continue;
    }
    const std::string_view piece = normalize(text.substr(sg.start, sg.end - sg.start), buf);
    const bool origin = sg.start == 0;
    if (norm_trie.empty()) {
      pre_tokenize(0, piece, origin, out);
      continue;
    }
    find_matches(piece, norm_trie, skip_special, sub);
    for (const auto& s2 : sub) {
      if (s2.token >= 0)
        out.push_back(added[size_t(s2.token)].id);
      else
        pre_tokenize(0, piece.substr(s2.start, s2.end - s2.start), origin && s2.start == 0, out);
    }
  }
}

// ---- decoding -------------------------------------------------------------------------------

namespace {

std::vector<std::u32string> to_u32(const std::string& s) {
  std::vector<std::u32string> r(1);
  for (size_t i = 0; i < s.size();) {
    int len;
    r[0].push_back(uni::decode_utf8(s.data() + i, &len));
    i += size_t(len);
  }
  return r;
}

std::string from_u32(const std::u32string& s) {
  std::string r;
  for (char32_t c : s) uni::append_utf8(r, c);
  return r;
}

// HF ByteFallback: a "<0xXX>" token is a byte; a run of them becomes its UTF-8 text, or one
// U+FFFD per byte when the run is not valid UTF-8.
std::optional<uint8_t> fallback_byte(const std::string& t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  if (hi >= 0 && lo >= 0) return uint8_t(hi * 16 + lo);
  if (t[3] == '+' && lo >= 0) return uint8_t(lo);  // Rust's from_str_radix accepts a '+' sign
  return std::nullopt;
}

}  // namespace

std::string Tokenizer::Impl::decode(std::span<const int32_t> ids, bool skip_special) const {
  auto keep = [&](int32_t id) {
    if (id < 0 || size_t(id) >= id_flags.size()) return false;
    const uint8_t f = id_flags[size_t(id)];
    return (f & 1) && !(skip_special && (f & 2));
  };
  if (byte_level_decode_only) {
    std::string bytes;
    for (int32_t id : ids)
      if (keep(id)) bytes += id_bytes[size_t(id)];
    return uni::is_valid_utf8(bytes) ? bytes : uni::repair_utf8(bytes);
  }
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids)
    if (keep(id)) toks.push_back(id_tokens[size_t(id)]);
  if (!has_decoder) {
    std::string r;
    for (size_t i = 0; i < toks.size(); ++i) {
      if (i) r += ' ';
      r += toks[i];
    }
    return r;
  }
  const ByteAlphabet& ab = byte_alphabet();
  for (const DecStep& d : decoders) {
    switch (d.kind) {
      case DecStep::Kind::byte_level: {
        std::string bytes;
        for (const auto& t : toks) {
          std::string b;
          bool all = true;
          for (size_t i = 0; i < t.size() && all;) {
            int len;
            const int v = ab.byte_of(uni::decode_utf8(t.data() + i, &len));
            all = v >= 0;
            b.push_back(char(v));
            i += size_t(len);
          }
          bytes += all ? b : t;
        }
        toks.assign(1, uni::repair_utf8(bytes));
        break;
      }
      case DecStep::Kind::metaspace: {
        int len;
        const char32_t r = uni::decode_utf8(d.a.data(), &len);
        for (size_t i = 0; i < toks.size(); ++i) {
          std::string out;
          for (size_t k = 0; k < toks[i].size();) {
            const char32_t c = uni::decode_utf8(toks[i].data() + k, &len);
            if (c == r) {
              if (!(i == 0 && d.prepend)) out.push_back(' ');
            } else {
              out.append(toks[i], k, size_t(len));
            }
            k += size_t(len);
          }
          toks[i] = std::move(out);
        }
        break;
      }
      case DecStep::Kind::replace:
        for (auto& t : toks) replace_all(t, d.a, d.b);
        break;
      case DecStep::Kind::byte_fallback: {
        std::vector<std::string> out;
        std::string run;
        size_t run_len = 0;
        auto flush = [&] {
          if (!run_len) return;
          if (uni::is_valid_utf8(run)) {
            out.push_back(run);
          } else {
            for (size_t k = 0; k < run_len; ++k) out.emplace_back("\xEF\xBF\xBD");
          }
          run.clear();
          run_len = 0;
        };
        for (auto& t : toks) {
          if (auto b = fallback_byte(t)) {
            run.push_back(char(*b));
            ++run_len;
          } else {
            flush();
            out.push_back(std::move(t));
          }
        }
        flush();
        toks.swap(out);
        break;
      }
      case DecStep::Kind::fuse: {
        std::string all;
        for (const auto& t : toks) all += t;
        toks.assign(1, std::move(all));
        break;
      }
      case DecStep::Kind::strip:
        for (auto& t : toks) {
          std::u32string c = to_u32(t)[0];
          size_t b = 0, e = c.size();
          for (size_t i = 0; i < d.start && i < c.size() && c[i] == d.content; ++i) b = i + 1;
          for (size_t i = 0; i < d.stop && i < c.size() && c[c.size() - i - 1] == d.content; ++i)
            e = c.size() - i - 1;
          t = e > b ? from_u32(c.substr(b, e - b)) : std::string();
        }
        break;
    }
  }
  std::string r;
  for (const auto& t : toks) r += t;
  return r;
}

// ---- public API -----------------------------------------------------------------------------

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::string repaired;
  if (!uni::is_valid_utf8(text)) {
    repaired = uni::repair_utf8(text);
    text = repaired;
  }
  std::vector<int32_t> out;
  out.reserve(text.size() / 4 + 4);
  impl_->encode(text, !parse_special, out);
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  return impl_->decode(ids, skip_special);
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->added_by_content.find(token);
  if (it != impl_->added_by_content.end()) return impl_->added[size_t(it->second)].id;
  return impl_->lookup(token);
}

std::string Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || size_t(id) >= impl_->id_tokens.size()) return {};
  return impl_->id_tokens[size_t(id)];
}

int64_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
std::optional<int32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<int32_t> Tokenizer::eos_id() const { return impl_->eos; }
std::optional<int32_t> Tokenizer::pad_id() const { return impl_->pad; }
bool Tokenizer::add_bos() const { return impl_->add_bos; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

}  // namespace sf
