// Unicode support for the native tokenizer (text/tokenizer.h): UTF-8 decoding and repair,
// the character classes its pre-tokenizer scanners match (\p{L}, \p{N}, \s, \w), and NFC.
// Owns nothing mutable; every function is pure and thread-safe. The tables are generated
// (scripts/gen_unicode_tables.py -> tokenizer_unicode_tables.cpp); see that script for which
// Unicode version each table follows and why.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sf::uni {

// Character class bits (a code point may carry several, e.g. letters are also word chars).
enum : uint8_t {
  kLetter = 1,  // \p{L}: Lu Ll Lt Lm Lo
  kNumber = 2,  // \p{N}: Nd Nl No
  kSpace = 4,   // \s: the White_Space property
  kWord = 8,    // \w as the Rust regex crate defines it (Alphabetic, M, Nd, Pc, Join_Control)
};

struct ClassRange {
  char32_t first, last;  // inclusive
  uint32_t value;
};
struct Decomposition {
  char32_t cp;
  uint32_t offset, length;  // into kDecompositionPool
};
struct Composition {
  uint64_t key;  // (first << 21) | second
  char32_t composite;
};

namespace tables {
extern const ClassRange kClassRanges[];
extern const size_t kClassRanges_size;
extern const ClassRange kCccRanges[];
extern const size_t kCccRanges_size;
extern const ClassRange kNfcUnsafeRanges[];
extern const size_t kNfcUnsafeRanges_size;
extern const Decomposition kDecompositions[];
extern const size_t kDecompositions_size;
extern const char32_t kDecompositionPool[];
extern const size_t kDecompositionPool_size;
extern const Composition kCompositions[];
extern const size_t kCompositions_size;
}  // namespace tables

uint8_t char_class_slow(char32_t c);  // binary search in kClassRanges

namespace detail {
extern const uint8_t kAsciiClass[128];
}
inline uint8_t char_class(char32_t c) {
  return c < 128 ? detail::kAsciiClass[c] : char_class_slow(c);
}
inline bool is_whitespace(char32_t c) { return (char_class(c) & kSpace) != 0; }
inline bool is_numeric(char32_t c) { return (char_class(c) & kNumber) != 0; }

// Decodes the code point at p (valid UTF-8 with at least one byte); *len gets its byte count.
inline char32_t decode_utf8(const char* p, int* len) {
  const auto b0 = static_cast<unsigned char>(p[0]);
  if (b0 < 0x80) {
    *len = 1;
    return b0;
  }
  if (b0 < 0xE0) {
    *len = 2;
    return (char32_t(b0 & 0x1F) << 6) | (static_cast<unsigned char>(p[1]) & 0x3F);
  }
  if (b0 < 0xF0) {
    *len = 3;
    return (char32_t(b0 & 0x0F) << 12) | (char32_t(static_cast<unsigned char>(p[1]) & 0x3F) << 6) |
           (static_cast<unsigned char>(p[2]) & 0x3F);
  }
  *len = 4;
  return (char32_t(b0 & 0x07) << 18) | (char32_t(static_cast<unsigned char>(p[1]) & 0x3F) << 12) |
         (char32_t(static_cast<unsigned char>(p[2]) & 0x3F) << 6) |
         (static_cast<unsigned char>(p[3]) & 0x3F);
}
// Byte length of the UTF-8 sequence that starts with lead byte b (valid UTF-8).
inline int utf8_len(unsigned char b) { return b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4; }

void append_utf8(std::string& out, char32_t c);

// Length of the longest valid UTF-8 prefix of s.
size_t valid_utf8_prefix(std::string_view s);
inline bool is_valid_utf8(std::string_view s) { return valid_utf8_prefix(s) == s.size(); }
// Replaces each maximal invalid subsequence by U+FFFD, as Rust's String::from_utf8_lossy and
// Python's bytes.decode("utf-8", "replace") do.
std::string repair_utf8(std::string_view s);

// True when s is certainly unchanged by NFC (quick check: no code point that may compose,
// decompose or reorder). s must be valid UTF-8.
bool nfc_quick_check(std::string_view s);
// Canonical composition (NFC) of valid UTF-8 s.
std::string nfc(std::string_view s);

}  // namespace sf::uni
