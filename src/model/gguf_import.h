// Model weights from a llama-architecture GGUF file (llama.cpp's format), mapped onto the
// Hugging Face tensor names and so onto slideformer's layout (model/param_layout.h), with the
// values transformers gets when it loads the same file (AutoModelForCausalLM.from_pretrained(
// dir, gguf_file=...)): gguf-py's dequantization (io/gguf.h) and the reverse of llama.cpp's
// Q/K row permutation, bit for bit.
//
// Names (both directions): token_embd -> model.embed_tokens, output_norm -> model.norm, output -> lm_head,
// blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}
// -> model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj, post_attention_layernorm,
// mlp.{gate,up,down}_proj}, each .weight (and .bias) unchanged.
// Shapes: GGUF lists dims innermost first, so a GGUF [ne0 = in, ne1 = out] tensor is the
// row-major [out, in] matrix; the bytes need no transpose.
// Q/K: llama.cpp's converter reorders the rows of q_proj (heads = num_attention_heads) and
// k_proj (heads = num_key_value_heads) within each head from HF's rotate-half order
// [x_0 .. x_{D/2-1}, y_0 .. y_{D/2-1}] to interleaved pairs [x_0, y_0, x_1, y_1, ...];
// import undoes it (GGUF row h*D + 2i + j -> HF row h*D + j*D/2 + i).
//
// load_gguf_weights has load_model_weights' contract (model/weights_io.h): it validates the
// whole file against the config first (architecture, head counts and sizes in the metadata,
// every expected tensor present, none unexpected, shapes, readable types), then OVERWRITES
// every element of every unit buffer (padding zeroed).
#pragma once
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/gguf.h"
#include "io/model_config.h"
#include "model/param_layout.h"
#include "model/weights_io.h"

namespace sf {

// The Hugging Face name of a llama-architecture GGUF tensor, or nullopt for a name outside
// the mapping.
std::optional<std::string> gguf_llama_hf_name(std::string_view gguf_name);

// The llama.cpp name of a Hugging Face tensor (the inverse of gguf_llama_hf_name, plus
// Qwen3's self_attn.{q,k}_norm -> blk.N.attn_{q,k}_norm), or nullopt outside the mapping.
std::optional<std::string> gguf_name_for_hf(std::string_view hf_name);

// dst[rows, cols] in llama.cpp's interleaved order from src in HF's order (what its
// converter does to a llama-family q or k projection); the inverse of unpermute_qk_rows.
void permute_qk_rows(const float* src, float* dst, int64_t rows, int64_t cols,
                     int64_t n_heads);

// dst[rows, cols] (row-major, HF order) from src[rows, cols] in llama.cpp's permuted order,
// for a q or k projection (weight or bias: cols = 1) of n_heads heads. dst != src.
void unpermute_qk_rows(const float* src, float* dst, int64_t rows, int64_t cols,
                       int64_t n_heads);

// Loads the weights of `gguf` (a llama-architecture GGUF) into unit_ptrs[u] (layout.units[u]
// .numel floats each). Throws Error(input) naming file, tensor and what is wrong.
// Ignored without error: "output.weight" when embeddings are tied, "rope_freqs.weight"
// (llama3 rope factors, which the config carries). notes: metadata that disagrees with the
// config in ways the weights do not depend on (rope freq_base, rms eps, context length).
WeightsLoadInfo load_gguf_weights(const std::filesystem::path& gguf, const ModelConfig& c,
                                  const ModelLayout& layout,
                                  const std::vector<float*>& unit_ptrs);

}  // namespace sf
