// Split-regex scanners (see tokenizer_regex.h). Each branch below is one alternative of the
// pattern, tried in pattern order; backtracking is reasoned out per alternative in comments.
#include "text/tokenizer_regex.h"

#include <string>

#include "text/tokenizer_unicode.h"

namespace sf::tok {

namespace {

constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlamaHead =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|)";
constexpr std::string_view kLlamaTail = R"(| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr uint8_t kLN = uni::kLetter | uni::kNumber;

struct Cursor {
  std::string_view s;
  // Code point at byte i (i < size) and its length.
  char32_t at(size_t i, int* len) const { return uni::decode_utf8(s.data() + i, len); }
  uint8_t cls(size_t i) const {
    int len;
    return uni::char_class(at(i, &len));
  }
  size_t next(size_t i) const { return i + size_t(uni::utf8_len(static_cast<unsigned char>(s[i]))); }
  // End of the run of code points from i whose class satisfies pred.
  template <class P>
  size_t run(size_t i, P pred) const {
    while (i < s.size()) {
      int len;
      const char32_t c = at(i, &len);
      if (!pred(uni::char_class(c), c)) break;
      i += size_t(len);
    }
    return i;
  }
};

bool is_other(uint8_t k) { return (k & (kLN | uni::kSpace)) == 0; }

// ASCII-case-insensitive letter test, plus U+017F LATIN SMALL LETTER LONG S, which Unicode
// simple case folding maps to 's'. Returns the byte length matched at i, 0 if none.
size_t fold_letter(std::string_view s, size_t i, char lower) {
  if (i >= s.size()) return 0;
  const char c = s[i];
  if (c == lower || c == lower - 32) return 1;
  if (lower == 's' && i + 1 < s.size() && static_cast<unsigned char>(c) == 0xC5 &&
      static_cast<unsigned char>(s[i + 1]) == 0xBF)
    return 2;
  return 0;
}

size_t contraction(std::string_view s, size_t i, bool ci) {
  // 's|'t|'re|'ve|'m|'ll|'d at s[i] == '\''; returns the end or 0.
  const size_t j = i + 1;
  if (j >= s.size()) return 0;
  if (!ci) {
    const char c = s[j];
    if (c == 's' || c == 't' || c == 'm' || c == 'd') return j + 1;
    if (j + 1 < s.size()) {
      const char d = s[j + 1];
      if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) return j + 2;
    }
    return 0;
  }
  for (char one : {'s', 't', 'm', 'd'})
    if (size_t n = fold_letter(s, j, one)) return j + n;
  static constexpr char kTwo[3][2] = {{'r', 'e'}, {'v', 'e'}, {'l', 'l'}};
  for (const auto& two : kTwo) {
    if (size_t n = fold_letter(s, j, two[0]))
      if (size_t m = fold_letter(s, j + n, two[1])) return j + n + m;
  }
  return 0;
}

// \s+(?!\S)|\s+ at a whitespace code point i (the run of whitespace is [i, e)).
size_t whitespace_tail(const Cursor& cur, size_t i, size_t e) {
  if (e == cur.s.size()) return e;  // (?!\S) holds at the end of the text
  // Followed by non-space: give back the last whitespace code point if the run has two or more.
  size_t last = i, k = i;
  while (k < e) {
    last = k;
    k = cur.next(k);
  }
  return last > i ? last : e;
}

size_t match_gpt2(const Cursor& cur, size_t i) {
  const std::string_view s = cur.s;
  if (s[i] == '\'')
    if (size_t e = contraction(s, i, false)) return e;
  // ` ?X+`: with a leading space the X run starts after it; without, the space is not X.
  size_t j = i;
  if (s[i] == ' ' && i + 1 < s.size()) j = i + 1;
  if (!(s[i] == ' ' && j == i)) {
    const uint8_t k = cur.cls(j);
    if (k & uni::kLetter) return cur.run(j, [](uint8_t c, char32_t) { return (c & uni::kLetter) != 0; });
    if (k & uni::kNumber) return cur.run(j, [](uint8_t c, char32_t) { return (c & uni::kNumber) != 0; });
    if (is_other(k)) return cur.run(j, [](uint8_t c, char32_t) { return is_other(c); });
  }
  const size_t e = cur.run(i, [](uint8_t c, char32_t) { return (c & uni::kSpace) != 0; });
  if (e == i) return cur.next(i);  // unreachable: every code point is L, N, space or other
  return whitespace_tail(cur, i, e);
}

size_t match_llama3(const SplitRegex& re, const Cursor& cur, size_t i) {
  const std::string_view s = cur.s;
  if (s[i] == '\'')
    if (size_t e = contraction(s, i, true)) return e;
  int len;
  const char32_t c = cur.at(i, &len);
  const uint8_t k = uni::char_class(c);
  auto letters = [](uint8_t x, char32_t) { return (x & uni::kLetter) != 0; };
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (k & uni::kLetter) return cur.run(i, letters);
  if (!(k & kLN) && c != '\r' && c != '\n') {
    const size_t j = i + size_t(len);
    if (j < s.size() && (cur.cls(j) & uni::kLetter)) return cur.run(j, letters);
  }
  // \p{N}{1,max}
  if (k & uni::kNumber) {
    size_t e = i;
    int n = 0;
    while (e < s.size() && (re.max_digits == 0 || n < re.max_digits) && (cur.cls(e) & uni::kNumber)) {
      e = cur.next(e);
      ++n;
    }
    return e;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  {
    size_t j = i;
    if (c == ' ' && i + 1 < s.size()) j = i + 1;
    if (!(c == ' ' && j == i) && is_other(cur.cls(j))) {
      size_t e = cur.run(j, [](uint8_t x, char32_t) { return is_other(x); });
      while (e < s.size() && (s[e] == '\r' || s[e] == '\n')) ++e;
      return e;
    }
  }
  const size_t e = cur.run(i, [](uint8_t x, char32_t) { return (x & uni::kSpace) != 0; });
  if (e == i) return cur.next(i);  // unreachable
  // \s*[\r\n]+: greedy \s* gives back until [\r\n]+ can match, i.e. up to the last newline.
  for (size_t p = e; p > i; --p)
    if (s[p - 1] == '\r' || s[p - 1] == '\n') return p;
  return whitespace_tail(cur, i, e);
}

}  // namespace

std::optional<SplitRegex> recognize_split_regex(std::string_view pattern) {
  if (pattern == kGpt2) return gpt2_regex();
  if (pattern.starts_with(kLlamaHead) && pattern.ends_with(kLlamaTail) &&
      pattern.size() > kLlamaHead.size() + kLlamaTail.size()) {
    const std::string_view mid =
        pattern.substr(kLlamaHead.size(), pattern.size() - kLlamaHead.size() - kLlamaTail.size());
    if (mid == R"(\p{N})") return SplitRegex{SplitRegex::Kind::llama3, 1};
    if (mid == R"(\p{N}+)") return SplitRegex{SplitRegex::Kind::llama3, 0};
    for (int n = 1; n <= 9; ++n) {
      if (mid == std::string(R"(\p{N}{1,)") + char('0' + n) + "}") return SplitRegex{SplitRegex::Kind::llama3, n};
    }
  }
  return std::nullopt;
}

size_t match_at(const SplitRegex& re, std::string_view s, size_t i) {
  const Cursor cur{s};
  return re.kind == SplitRegex::Kind::gpt2 ? match_gpt2(cur, i) : match_llama3(re, cur, i);
}

}  // namespace sf::tok
