// The tokenizer.* metadata of a GGUF file, from a Hugging Face tokenizer.json and
// tokenizer_config.json (see gguf_export.h for what is written and refused).
//
// Token types are llama.cpp's: 1 normal, 2 unknown, 3 control (special added tokens), 4 user
// defined (other added tokens), 5 unused (ids the tokenizer leaves free), 6 byte (<0xXX> of
// a byte-fallback vocabulary).
// "llama" vocabularies carry scores, which llama.cpp's SentencePiece tokenizer uses to pick
// the next merge (highest first): a token made by merge rank r scores -r, so merges happen in
// the BPE's own order; tokens no merge makes (single characters, bytes, added and control
// tokens, which llama.cpp matches whole) score -1e9, so no merge ever prefers to form them.
// The pre-tokenizer name (gpt2 vocabularies) is recognised from the pre_tokenizer's
// structure: ByteLevel alone "gpt-2", Digits + ByteLevel "smollm", the Llama 3 split regex
// "llama-bpe", Qwen's "qwen2"; anything else "default", with a note.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "io/gguf_writer.h"

namespace sf {

struct GgufVocabInfo {
  std::string model;  // gpt2 | llama
  std::string pre;    // gpt2 only
  std::vector<std::string> notes;
};

// Adds the tokenizer keys for a model of vocab_size rows. Error(input) naming the file and
// field for a tokenizer it cannot describe.
GgufVocabInfo add_gguf_vocab(GgufWriter& w, const std::filesystem::path& dir,
                             int64_t vocab_size);

namespace gguf_token_type {
constexpr int32_t normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6;
}

}  // namespace sf
