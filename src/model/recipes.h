// Decoder-model "recipes": the forward/backward of one unit (embedding, decoder layer, head)
// written once against the Backend interface, plus the bindings that turn flat buffers into
// the Mats the recipes use.
//
// Recipes never allocate and never schedule: the caller binds parameter buffers (one flat
// buffer per unit, laid out by ModelLayout), a scratch buffer (LayerActs / HeadActs) and the
// batch inputs, and the recipe enqueues ops on the given stream. Everything a recipe reads
// or writes is in backend memory; nothing is dereferenced on the host.
//
// Semantics shared by every recipe:
//  - weights, activations, x and dx: backend compute dtype (f32 host, bf16 CUDA);
//  - weight gradients: f32, ACCUMULATED (+=) into the unit's flat gradient buffer;
//  - activation gradients (dx_in, head dx): OVERWRITTEN.
//  - By default only layer inputs are kept between a layer's forward and its backward:
//    layer_backward recomputes the forward from x_in (this is what the engine offloads); it
//    can also take the attention's output and lse as kept (Recompute below).
//  - The MLP is token-wise, so a layer runs it over tiles of at most LayerActs::mlp_tile
//    tokens (one tile = the whole chunk unless the scratch was bound with a smaller
//    mlp_tile_tokens): its scratch then holds [tile, 2F] + [tile, F] instead of [T, 3F].
//    Its weight gradients accumulate tile by tile, as they do chunk by chunk.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "io/model_config.h"
#include "model/param_layout.h"

namespace sf {

// ---- parameter bindings ------------------------------------------------------------------
// One Mat per parameter slot, viewing the unit's flat buffer at the slot's offset. The same
// structs serve for weights (compute dtype) and gradients (f32). Absent parameters (bqkv
// without bias, q_norm/k_norm outside qwen3) are empty Mats.
struct LayerParams {
  Mat attn_norm;  // [1, C]
  Mat wqkv;       // [Q + 2KV, C]  rows: q heads, k heads, v heads
  Mat bqkv;       // [1, Q + 2KV] or empty
  Mat q_norm;     // [1, D] or empty
  Mat k_norm;     // [1, D] or empty
  Mat wo;         // [C, Q]
  Mat mlp_norm;   // [1, C]
  Mat w_gate_up;  // [2F, C]  rows: gate then up
  Mat w_down;     // [C, F]
};
using LayerWeights = LayerParams;
using LayerGrads = LayerParams;

struct EmbeddingParams {
  Mat table;  // [V, C]
};
using EmbeddingWeights = EmbeddingParams;
using EmbeddingGrads = EmbeddingParams;

struct HeadParams {
  Mat final_norm;  // [1, C]
  Mat lm_head;     // [V, C]: the head unit's lm_head, or the embedding table when tied
};
using HeadWeights = HeadParams;
using HeadGrads = HeadParams;

// `base` is the start of the unit's flat buffer, holding elements of `dtype` (compute dtype
// for weights, f32 for gradients). Throws if `unit` is of the wrong kind.
LayerParams bind_layer(const Unit& unit, void* base, DType dtype);
EmbeddingParams bind_embedding(const Unit& unit, void* base, DType dtype);
// For tied embeddings the head unit has no lm_head: pass the embedding unit's table (weights
// or gradients) as `tied_table`; its gradient then accumulates into the embedding unit.
HeadParams bind_head(const Unit& unit, void* base, DType dtype, Mat tied_table = {});

// ---- batch inputs ------------------------------------------------------------------------
// One chunk of tokens (whole packed sequences), all arrays in backend memory. Non-owning:
// see DeviceBatch (model/device_batch.h) for an owner that uploads a Batch.
struct BatchInputs {
  int64_t n_tokens = 0;
  const int32_t* tokens = nullptr;      // [T]
  const int32_t* labels = nullptr;      // [T], kIgnoreLabel = no loss
  const int32_t* positions = nullptr;   // [T]
  const int32_t* cu_seqlens = nullptr;  // [n_seqs + 1]
  const float* inv_freq = nullptr;      // [head_dim / 2] f32, rope_inv_freq(config)
  AttentionShape attn;                  // n_seqs and max_seqlen of this chunk
};
// The AttentionShape of `cfg` for a chunk with these sequences (scale 1/sqrt(head_dim)).
AttentionShape attention_shape(const ModelConfig& cfg, int n_seqs, int max_seqlen);

// ---- per-layer scratch -----------------------------------------------------------------
// Everything one decoder layer needs for T tokens, carved from one buffer. Allocate once for
// the largest chunk and re-bind per chunk (layout for T tokens fits in the space for more,
// with the same mlp_tile_tokens). The MLP's own buffers (gate_up, sw, dsw) are sized for one
// tile of `tile` = min(mlp_tile_tokens, T) rows (mlp_tile_tokens 0: tile = T, untiled); the
// other [T, .] buffers for every token. Several logical buffers share memory when their
// lifetimes do not overlap; the aliasing groups ("slots") are:
//   slot R  [T,C]  xn1 (attn-normed input: forward up to the qkv GEMM, recomputed in
//                  backward just before the qkv weight gradient), resid (x_in + attention).
//   slot N  [T,C]  xn2 (mlp-normed resid), then dxn (dxn2, later dxn1) in backward. A
//                  tile's dxn2 rows overwrite its own xn2 rows once its gate_up weight
//                  gradient has read them; the other tiles' rows are untouched.
//   slot QKV       q, k, v projections (+bias). Fused layout [T, Q+2KV] (row t = q|k|v)
//                  for llama/mistral/qwen2; planar q [T,Q] | k [T,KV] | v [T,KV] when
//                  qk_norm (so each head's rows are a contiguous [T*H, D] view for the
//                  per-head norm). RoPE is applied in place unless qk_norm.
//   slot QKN       qk_norm only: normed+roped q [T,Q] | k [T,KV]; in backward dq_raw, dk_raw.
//   slot A  [T,Q]  att (attention output).
//   slot G         max([T,C], [T,Q+2KV], [tile,2F]): attention o-proj output [T,C]
//                  (forward, until the residual add), then gate_up [tile,2F] of each MLP
//                  tile in turn; in backward each tile's dgate_up (in place), then, after
//                  the last tile, dq|dk|dv [T,Q+2KV].
//   slot S         max([T,Q], [tile,F]): sw (swiglu output) [tile,F]; in backward dsw
//                  [tile,F] (in place), then, after the last tile, datt [T,Q].
//   f32 stats      rstd1 [T], rstd2 [T], lse [H,T], rstd_q [T*H], rstd_k [T*KVH].
struct LayerActs {
  int64_t T = 0;
  int64_t mlp_tile = 0;  // rows of gate_up / sw / dsw: min(mlp_tile_tokens, T), or T
  Mat xn1, resid;        // slot R
  Mat xn2, dxn;          // slot N
  Mat qkv;               // fused [T, Q+2KV] view of slot QKV (empty when qk_norm)
  Mat q, k, v;           // raw projections (views into slot QKV)
  Mat qr, kr;            // q, k as fed to attention (roped; == q, k unless qk_norm)
  Mat att;               // slot A
  Mat attn_proj;         // slot G, forward only
  Mat gate_up;           // slot G: [mlp_tile, 2F]
  Mat dqkv;              // slot G: fused [T, Q+2KV] (empty when qk_norm)
  Mat dq, dk, dv;        // slot G: gradients w.r.t. qr, kr, v (then raw, in place, via RoPE)
  Mat dq_raw, dk_raw;    // gradients w.r.t. q, k (== dq, dk unless qk_norm: slot QKN)
  Mat sw, dsw;           // slot S: [mlp_tile, F]
  Mat datt;              // slot S: [T, Q]
  float* rstd1 = nullptr;
  float* rstd2 = nullptr;
  float* lse = nullptr;     // [H, T]
  float* rstd_q = nullptr;  // [T*H] (qk_norm)
  float* rstd_k = nullptr;  // [T*KVH] (qk_norm)
};

// A named region of a scratch buffer, for memory reports.
struct ScratchEntry {
  std::string name;
  size_t offset = 0, bytes = 0;
};
// The slots of LayerActs for T tokens with activations of `dtype`, in buffer order; the MLP
// in tiles of at most mlp_tile_tokens tokens (0 or >= T: one tile, untiled; negative throws).
std::vector<ScratchEntry> layer_acts_table(const ModelConfig& cfg, int64_t T, DType dtype,
                                           int64_t mlp_tile_tokens = 0);
size_t layer_acts_bytes(const ModelConfig& cfg, int64_t T, DType dtype,
                        int64_t mlp_tile_tokens = 0);
// Carves LayerActs for T tokens from [base, base + bytes); throws if bytes is too small.
LayerActs bind_layer_acts(const ModelConfig& cfg, int64_t T, DType dtype, void* base,
                          size_t bytes, int64_t mlp_tile_tokens = 0);

// Scratch of the head for T tokens: xn [T,C], dxn [T,C], rstd [T] and the f32 logits chunk
// [chunk_rows, V] that lm_head_loss works in. The head never runs concurrently with a layer
// on the same stream, so HeadActs may share memory with LayerActs.
struct HeadActs {
  int64_t T = 0;
  Mat xn, dxn;
  float* rstd = nullptr;
  Mat logits;  // [chunk_rows, V] f32
};
std::vector<ScratchEntry> head_acts_table(const ModelConfig& cfg, int64_t T, DType dtype,
                                          int64_t chunk_rows);
size_t head_acts_bytes(const ModelConfig& cfg, int64_t T, DType dtype, int64_t chunk_rows);
HeadActs bind_head_acts(const ModelConfig& cfg, int64_t T, DType dtype, int64_t chunk_rows,
                        void* base, size_t bytes);

// ---- recipes -------------------------------------------------------------------------------
// x [T, C] (overwrite) = embedding rows of in.tokens.
void embedding_forward(Backend& be, Stream& s, const EmbeddingWeights& w,
                       const BatchInputs& in, Mat x);
// dtable (f32, accumulate) += scatter of dx [T, C] by in.tokens.
void embedding_backward(Backend& be, Stream& s, const EmbeddingGrads& g, const BatchInputs& in,
                        Mat dx);

// x_out [T, C] (overwrite) = layer(x_in). x_out may be the same Mat as x_in. Uses all of acts.
// On return acts.att and acts.lse still hold the attention's output and log-sum-exp (nothing
// after attention_forward writes slot A or lse), so a caller may copy them out for a
// Recompute::all_but_attention backward; att / lse may view buffers outside the scratch.
void layer_forward(Backend& be, Stream& s, const ModelConfig& cfg, const LayerWeights& w,
                   const LayerActs& acts, const BatchInputs& in, Mat x_in, Mat x_out);

// What layer_backward reruns of the layer's forward before backpropagating:
//  all               everything, from x_in (the sliding window's default: only layer inputs
//                    are kept between a layer's forward and its backward);
//  all_but_attention everything but attention_forward: acts.att and acts.lse hold what
//                    layer_forward left in them for this layer and x_in (the caller kept
//                    them, or copied them back into any buffers acts.att / acts.lse view);
//                    the norms, projections, RoPE, o-proj and MLP are recomputed around them;
//  none              nothing: acts hold everything layer_forward left for this layer and x_in
//                    (kept activations).
// Each mode gives the same bits (with more than one MLP tile the forward keeps only the last
// tile's gate_up and sw, so `none` recomputes each tile's from the kept xn2).
enum class Recompute : uint8_t { all, all_but_attention, none };

// Recomputes the forward from x_in as `recompute` says, then backpropagates dx_out [T, C]:
// weight gradients accumulate (+=) into g, dx_in [T, C] is overwritten. dx_out is DESTROYED
// (it holds the gradient of the mid-layer residual on return unless it is dx_in); dx_in may
// be the same Mat as dx_out, so one [T, C] gradient buffer can flow through every layer. x_in
// must not alias dx_out / dx_in. acts are consumed whatever the mode, but for att and lse,
// which all_but_attention and none only read (so there they may view buffers outside the
// scratch, e.g. an engine's store).
void layer_backward(Backend& be, Stream& s, const ModelConfig& cfg, const LayerWeights& w,
                    const LayerGrads& g, const LayerActs& acts, const BatchInputs& in,
                    Mat x_in, Mat dx_out, Mat dx_in, Recompute recompute = Recompute::all);
// The older spelling: recompute = true is Recompute::all, false Recompute::none.
inline void layer_backward(Backend& be, Stream& s, const ModelConfig& cfg, const LayerWeights& w,
                           const LayerGrads& g, const LayerActs& acts, const BatchInputs& in,
                           Mat x_in, Mat dx_out, Mat dx_in, bool recompute) {
  layer_backward(be, s, cfg, w, g, acts, in, x_in, dx_out, dx_in,
                 recompute ? Recompute::all : Recompute::none);
}

// Final RMSNorm + LM head + cross-entropy over tokens with a label.
// loss_sum (f32 scalar in backend memory, ACCUMULATE) += sum of token losses (unscaled).
// If dx is non-empty: dx [T, C] (overwrite) = grad_scale * dLoss/dx, and g.final_norm,
// g.lm_head (f32, accumulate) += grad_scale * dLoss/dW. With dx empty, g is unused
// (forward only). dx must not alias x.
void head_forward_backward(Backend& be, Stream& s, const ModelConfig& cfg, const HeadWeights& w,
                           const HeadGrads& g, const HeadActs& acts, const BatchInputs& in,
                           Mat x, Mat dx, float* loss_sum, float grad_scale);

}  // namespace sf
