// A native Hugging Face tokenizer: reads tokenizer.json (and tokenizer_config.json beside it)
// and encodes / decodes exactly as the `tokenizers` library does, with no Python at run time.
//
// Supported (anything else is rejected at load with an error naming the file and field):
//   model:         BPE (vocab, merges as "a b" strings or [a, b] pairs, unk_token, fuse_unk,
//                  byte_fallback, ignore_merges, continuing_subword_prefix, end_of_word_suffix)
//   normalizer:    NFC, Prepend, Replace (string pattern), Strip, Sequence, null
//   pre_tokenizer: ByteLevel (add_prefix_space, use_regex), Split (string patterns; the GPT-2,
//                  Llama-3 and Qwen2/3 regexes), Metaspace, Digits, WhitespaceSplit, Sequence
//   decoder:       ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence, null
//   added tokens:  matched in the raw text (normalized=false) or the normalized text
//                  (normalized=true), honouring lstrip / rstrip / single_word / special
// The post_processor is not applied: encode() adds no BOS/EOS; callers add them (add_bos()).
// Input that is not valid UTF-8 is first repaired (each maximal invalid subsequence becomes
// U+FFFD, as Python's errors="replace" does), since HF only accepts text.
//
// A Tokenizer is immutable after load(); copies share the loaded data. encode/decode may run
// concurrently from several threads (the internal word cache is locked per shard).
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sf {

class Tokenizer {
 public:
  // `path`: a directory holding tokenizer.json, or the tokenizer.json file itself. A
  // tokenizer_config.json in the same directory, when present, supplies bos/eos/pad tokens,
  // add_bos_token and chat_template (else chat_template.jinja there, if present).
  static Tokenizer load(const std::filesystem::path& path);

  // Token ids of `text`; no BOS/EOS added. parse_special=false treats special added tokens in
  // the text as plain text (HF's encode_special_tokens=True); non-special added tokens still match.
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  // Text of `ids`; unknown ids are skipped (as HF does); skip_special drops special tokens.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  int32_t token_to_id(std::string_view token) const;  // -1 if none
  std::string id_to_token(int32_t id) const;          // "" if none
  // Distinct tokens of the model vocabulary and the added tokens (HF get_vocab_size(true)).
  int64_t vocab_size() const;

  std::optional<int32_t> bos_id() const;
  std::optional<int32_t> eos_id() const;
  std::optional<int32_t> pad_id() const;
  // tokenizer_config.json's add_bos_token; without it, whether the post_processor's template
  // starts with the BOS token.
  bool add_bos() const;
  const std::string& chat_template() const;  // "" if none

  struct Impl;

 private:
  explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

}  // namespace sf
