// UTF-8 helpers, character classes and NFC for the native tokenizer (see tokenizer_unicode.h).
#include "text/tokenizer_unicode.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace sf::uni {

namespace detail {
// Classes of U+0000..U+007F, the same values the generated range table holds for them.
constexpr uint8_t make_ascii_class(int c) {
  if (c >= 'a' && c <= 'z') return kLetter | kWord;
  if (c >= 'A' && c <= 'Z') return kLetter | kWord;
  if (c >= '0' && c <= '9') return kNumber | kWord;
  if (c == '_') return kWord;
  if ((c >= 0x09 && c <= 0x0D) || c == ' ') return kSpace;
  return 0;
}
struct AsciiTable {
  uint8_t v[128];
  constexpr AsciiTable() : v() {
    for (int i = 0; i < 128; ++i) v[i] = make_ascii_class(i);
  }
};
constexpr AsciiTable kAscii{};
const uint8_t kAsciiClass[128] = {
#define R(i) kAscii.v[i], kAscii.v[i + 1], kAscii.v[i + 2], kAscii.v[i + 3]
    R(0),  R(4),  R(8),  R(12), R(16), R(20), R(24), R(28), R(32),  R(36),  R(40),
    R(44), R(48), R(52), R(56), R(60), R(64), R(68), R(72), R(76),  R(80),  R(84),
    R(88), R(92), R(96), R(100), R(104), R(108), R(112), R(116), R(120), R(124),
#undef R
};
}  // namespace detail

namespace {

uint32_t range_lookup(const ClassRange* r, size_t n, char32_t c) {
  // First range whose last >= c.
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (r[mid].last < c)
      lo = mid + 1;
    else
      hi = mid;
  }
  return (lo < n && r[lo].first <= c) ? r[lo].value : 0;
}

uint8_t ccc(char32_t c) {
  if (c < 0x300) return 0;
  return static_cast<uint8_t>(range_lookup(tables::kCccRanges, tables::kCccRanges_size, c));
}

// Hangul syllable arithmetic (Unicode 3.12).
constexpr char32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr int kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
              kSCount = kLCount * kNCount;

void decompose(char32_t c, std::vector<char32_t>& out) {
  if (c >= kSBase && c < kSBase + kSCount) {
    const int s = int(c - kSBase);
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  const auto* b = tables::kDecompositions;
  const auto* e = b + tables::kDecompositions_size;
  const auto* it = std::lower_bound(b, e, c, [](const Decomposition& d, char32_t v) { return d.cp < v; });
  if (it == e || it->cp != c) {
    out.push_back(c);
    return;
  }
  for (uint32_t i = 0; i < it->length; ++i) decompose(tables::kDecompositionPool[it->offset + i], out);
}

// The primary composite of (a, b), or 0.
char32_t compose(char32_t a, char32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
      b < kTBase + kTCount)
    return a + (b - kTBase);
  const uint64_t key = (uint64_t(a) << 21) | b;
  const auto* s = tables::kCompositions;
  const auto* e = s + tables::kCompositions_size;
  const auto* it = std::lower_bound(s, e, key, [](const Composition& x, uint64_t k) { return x.key < k; });
  return (it != e && it->key == key) ? it->composite : 0;
}

}  // namespace

uint8_t char_class_slow(char32_t c) {
  return static_cast<uint8_t>(range_lookup(tables::kClassRanges, tables::kClassRanges_size, c));
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(char(c));
  } else if (c < 0x800) {
    out.push_back(char(0xC0 | (c >> 6)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(char(0xE0 | (c >> 12)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  } else {
    out.push_back(char(0xF0 | (c >> 18)));
    out.push_back(char(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(char(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(char(0x80 | (c & 0x3F)));
  }
}

namespace {
// Length of the valid sequence at s[i..] (>= 1), or -(length of the maximal invalid
// subpart) (<= -1): the lead byte plus the continuation bytes that were still acceptable.
int utf8_step(const unsigned char* s, size_t n, size_t i) {
  const unsigned char b = s[i];
  if (b < 0x80) return 1;
  int need;
  unsigned char lo = 0x80, hi = 0xBF;  // the range allowed for the first continuation byte
  if (b >= 0xC2 && b <= 0xDF) {
    need = 1;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 2;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 3;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k <= need; ++k) {
    if (i + k >= n) return -k;
    const unsigned char c = s[i + k];
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) return -k;
  }
  return need + 1;
}
}  // namespace

size_t valid_utf8_prefix(std::string_view sv) {
  const auto* s = reinterpret_cast<const unsigned char*>(sv.data());
  const size_t n = sv.size();
  size_t i = 0;
  while (i < n) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= n) {
      uint64_t w;
      std::memcpy(&w, s + i, 8);
      if (w & 0x8080808080808080ull) break;
      i += 8;
    }
    if (i >= n) break;
    const int k = utf8_step(s, n, i);
    if (k < 0) return i;
    i += size_t(k);
  }
  return n;
}

std::string repair_utf8(std::string_view sv) {
  const auto* s = reinterpret_cast<const unsigned char*>(sv.data());
  const size_t n = sv.size();
  std::string out;
  out.reserve(n + 8);
  size_t i = 0;
  while (i < n) {
    const int k = utf8_step(s, n, i);
    if (k > 0) {
      out.append(sv.data() + i, size_t(k));
      i += size_t(k);
    } else {
      out.append("\xEF\xBF\xBD");
      i += size_t(-k);
    }
  }
  return out;
}

bool nfc_quick_check(std::string_view s) {
  // Every code point below U+0300 is NFC-stable, and those are the ones with lead bytes < 0xCC.
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0xCC) {
      i += b < 0x80 ? 1 : 2;
      continue;
    }
    int len;
    const char32_t c = decode_utf8(s.data() + i, &len);
    if (range_lookup(tables::kNfcUnsafeRanges, tables::kNfcUnsafeRanges_size, c)) return false;
    i += size_t(len);
  }
  return true;
}

std::string nfc(std::string_view s) {
  if (nfc_quick_check(s)) return std::string(s);
  // 1. Full canonical decomposition.
  std::vector<char32_t> d;
  d.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    int len;
    const char32_t c = decode_utf8(s.data() + i, &len);
    decompose(c, d);
    i += size_t(len);
  }
  // 2. Canonical ordering: stable sort of each run of non-starters by combining class.
  std::vector<uint8_t> cc(d.size());
  for (size_t i = 0; i < d.size(); ++i) cc[i] = ccc(d[i]);
  for (size_t i = 1; i < d.size(); ++i) {
    if (cc[i] == 0) continue;
    for (size_t j = i; j > 0 && cc[j - 1] > cc[j]; --j) {
      std::swap(d[j - 1], d[j]);
      std::swap(cc[j - 1], cc[j]);
    }
  }
  // 3. Canonical composition.
  std::vector<char32_t> out;
  std::vector<uint8_t> occ;
  out.reserve(d.size());
  occ.reserve(d.size());
  ptrdiff_t starter = -1;
  for (size_t i = 0; i < d.size(); ++i) {
    const char32_t c = d[i];
    const uint8_t k = cc[i];
    if (starter >= 0) {
      const bool adjacent = size_t(starter) + 1 == out.size();
      const uint8_t last = occ.back();
      // Not blocked: nothing in between, or the last one in between has a lower, non-zero class.
      if (adjacent || (last != 0 && last < k)) {
        if (char32_t comp = compose(out[size_t(starter)], c)) {
          out[size_t(starter)] = comp;
          continue;
        }
      }
    }
    if (k == 0) starter = ptrdiff_t(out.size());
    out.push_back(c);
    occ.push_back(k);
  }
  std::string r;
  r.reserve(s.size());
  for (char32_t c : out) append_utf8(r, c);
  return r;
}

}  // namespace sf::uni
