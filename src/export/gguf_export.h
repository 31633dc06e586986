// A Hugging Face model directory (Llama, Mistral, Qwen2/2.5, Qwen3) -> one GGUF file that
// llama.cpp (and so Ollama, LM Studio) loads: the conventions of llama.cpp's
// convert_hf_to_gguf.py, reimplemented from its design.
//
// Tensors: llama.cpp's names (model/gguf_import.h: token_embd, blk.N.attn_q ... ffn_down,
// attn_q_norm / attn_k_norm for Qwen3, attn_{q,k,v}.bias for Qwen2, output_norm, output
// unless the embeddings are tied), dims innermost first. Matrices in the chosen type (F16,
// BF16 or Q8_0; a Q8_0 matrix whose rows are not whole blocks of 32 falls back to F16, as the
// converter does), vectors (norms, biases) in F32. Llama and Mistral use llama.cpp's "llama"
// architecture, whose RoPE rotates interleaved pairs: q_proj and k_proj rows are permuted per
// head (permute_qk_rows); Qwen rotates halves as HF does and needs none. Llama 3 RoPE
// scaling becomes a rope_freqs tensor (per-frequency divisors), linear and yarn metadata.
//
// Metadata: general.* (architecture, name, file_type, quantization_version), the shape
// ({arch}.context_length, embedding_length, block_count, feed_forward_length, head counts,
// key/value length, rope dimension count and freq_base, rms eps), and the tokenizer from
// tokenizer.json + tokenizer_config.json: tokenizer.ggml.model "gpt2" (byte-level BPE: tokens,
// types, merges, pre-tokenizer name) or "llama" (BPE with byte fallback, SentencePiece's
// form: tokens, types, scores), bos/eos/eot/pad/unk ids, add_bos_token, the chat template.
// The token list has vocab_size entries: ids the tokenizer leaves unused are "[PAD<id>]".
//
// Refused with an error naming the file and field: a directory without tokenizer.json, a
// tokenizer that is not BPE, a vocabulary larger than the model's, and RoPE settings
// llama.cpp cannot express (yarn with explicit attention/mscale factors or truncate false).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace sf {

enum class GgufExportType { f16, bf16, q8_0 };
// "f16" | "bf16" | "q8_0"; Error(input) naming `flag` otherwise.
GgufExportType parse_gguf_export_type(const std::string& s, const std::string& flag);

struct GgufExportResult {
  uint64_t bytes = 0;
  int64_t tensors = 0;
  std::string architecture;         // llama.cpp's: llama | qwen2 | qwen3
  std::string tokenizer_model;      // gpt2 | llama
  std::string pre_tokenizer;        // gpt2 only: e.g. "smollm", "llama-bpe", "qwen2"
  std::vector<std::string> notes;   // what llama.cpp will do differently, fallbacks taken
};

// Reads model_dir (config.json, safetensors, tokenizer files) and writes `out` atomically.
GgufExportResult export_gguf(const std::filesystem::path& model_dir,
                             const std::filesystem::path& out, GgufExportType type);

}  // namespace sf
