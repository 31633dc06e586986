// Hand-written scanners for the pre-tokenizer split regexes of byte-level BPE tokenizers.
// Each scanner returns the end of the leftmost-first match starting at a given position of a
// valid UTF-8 string, exactly as the regex engine of Hugging Face `tokenizers` would find it:
//   gpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   llama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   (Qwen2/2.5/3 use the llama3 form with \p{N} instead of \p{N}{1,3}.)
// Every code point starts a match of these patterns, so a scan covers the whole string.
// Pure functions; thread-safe.
#pragma once
#include <cstddef>
#include <optional>
#include <string_view>

namespace sf::tok {

struct SplitRegex {
  enum class Kind { gpt2, llama3 } kind = Kind::gpt2;
  int max_digits = 0;  // llama3: longest \p{N} run in one match (0: unbounded)
};

// The scanner for a Split pre-tokenizer's regex, or nullopt when the pattern is not one of the
// known forms (the caller reports it).
std::optional<SplitRegex> recognize_split_regex(std::string_view pattern);

// The GPT-2 pattern, which the ByteLevel pre-tokenizer applies when use_regex is true.
inline SplitRegex gpt2_regex() { return SplitRegex{SplitRegex::Kind::gpt2, 0}; }

// End (byte offset, > i) of the match that starts at byte i < s.size() of valid UTF-8 s.
size_t match_at(const SplitRegex& re, std::string_view s, size_t i);

}  // namespace sf::tok
