// Embedding, decoder-layer and head recipes (see model/recipes.h for the contract).
// The slot aliasing of LayerActs is documented there; the comments below mark the points
// where a slot changes owner, which is what makes the ordering of these calls matter.
#include "model/recipes.h"

#include <algorithm>

#include "core/error.h"

namespace sf {

namespace {

void check_x(const char* what, Mat x, int64_t T, int64_t C) {
  SF_CHECK(!x.empty() && x.rows == T && x.cols == C && x.contiguous(), what, " must be a ",
           "contiguous [", T, ", ", C, "] Mat, got [", x.rows, ", ", x.cols, "] ld ", x.ld);
}

void check_inputs(const BatchInputs& in, const LayerActs& a) {
  SF_CHECK(in.n_tokens == a.T, "batch inputs have ", in.n_tokens,
           " tokens but the layer scratch is bound for ", a.T);
  SF_CHECK(in.positions && in.cu_seqlens && in.inv_freq, "layer recipe: batch inputs not bound");
}

// Whether attention_half_forward runs the attention itself or finds its output kept.
enum class Attention { run, kept };

// Forward of the attention half, up to the mlp-norm: everything the MLP tiles need.
// Leaves resid, xn2, rstd2, q/k/v (+qr/kr), att, lse valid; xn1 is dead. Attention::kept:
// att and lse hold this layer's values already and are only read (nothing before the
// attention writes slot A or lse: see the slot table in recipes.h).
void attention_half_forward(Backend& be, Stream& s, const ModelConfig& cfg, const LayerWeights& w,
                            const LayerActs& a, const BatchInputs& in, Mat x_in,
                            Attention attention = Attention::run) {
  const float eps = float(cfg.rms_norm_eps);
  const int64_t T = a.T, Q = cfg.q_dim(), KV = cfg.kv_dim();
  const int H = int(cfg.num_attention_heads), KVH = int(cfg.num_key_value_heads);
  const int D = int(cfg.head_dim);

  be.rmsnorm_forward(s, a.xn1, a.rstd1, x_in, w.attn_norm, eps);
  if (!a.qkv.empty()) {  // fused: one GEMM, q|k|v are column blocks
    be.gemm(s, a.qkv, a.xn1, Trans::no, w.wqkv, Trans::yes, 1.f, 0.f);
    if (!w.bqkv.empty()) be.bias_add(s, a.qkv, w.bqkv);
  } else {  // planar (qk_norm): three GEMMs on row blocks of wqkv
    be.gemm(s, a.q, a.xn1, Trans::no, w.wqkv.row_block(0, Q), Trans::yes, 1.f, 0.f);
    be.gemm(s, a.k, a.xn1, Trans::no, w.wqkv.row_block(Q, KV), Trans::yes, 1.f, 0.f);
    be.gemm(s, a.v, a.xn1, Trans::no, w.wqkv.row_block(Q + KV, KV), Trans::yes, 1.f, 0.f);
    if (!w.bqkv.empty()) {
      be.bias_add(s, a.q, w.bqkv.col_block(0, Q));
      be.bias_add(s, a.k, w.bqkv.col_block(Q, KV));
      be.bias_add(s, a.v, w.bqkv.col_block(Q + KV, KV));
    }
  }
  if (cfg.qk_norm) {  // per-head RMSNorm: rows of D
    SF_CHECK(!w.q_norm.empty() && !w.k_norm.empty(), "qwen3 layer without q_norm/k_norm");
    be.rmsnorm_forward(s, a.qr.reshaped(T * H, D), a.rstd_q, a.q.reshaped(T * H, D), w.q_norm,
                       eps);
    be.rmsnorm_forward(s, a.kr.reshaped(T * KVH, D), a.rstd_k, a.k.reshaped(T * KVH, D),
                       w.k_norm, eps);
  }
  be.rope_forward(s, a.qr, H, D, in.positions, in.inv_freq);
  be.rope_forward(s, a.kr, KVH, D, in.positions, in.inv_freq);
  if (attention == Attention::run)
    be.attention_forward(s, a.att, a.lse, a.qr, a.kr, a.v, in.attn, in.cu_seqlens);
  // slot G: attn_proj lives only until the residual add.
  be.gemm(s, a.attn_proj, a.att, Trans::no, w.wo, Trans::yes, 1.f, 0.f);
  // slot R: xn1 is dead (consumed by the qkv GEMM); resid takes it over.
  be.add_rmsnorm_forward(s, a.resid, a.xn2, a.rstd2, x_in, a.attn_proj, w.mlp_norm, eps);
}

// One MLP tile: tokens [r0, r0 + n) of the chunk. Rows of the [T, .] buffers are views into
// them; gate_up, sw and dsw are the first n rows of the tile scratch (slots G, S).
struct MlpTile {
  int64_t r0 = 0, n = 0;
  Mat xn2, dxn2, gate_up, sw, dsw;
};

MlpTile mlp_tile(const LayerActs& a, int64_t r0) {
  const int64_t n = std::min(a.mlp_tile, a.T - r0);
  return {r0, n, a.xn2.row_block(r0, n), a.dxn.row_block(r0, n), a.gate_up.row_block(0, n),
          a.sw.row_block(0, n), a.dsw.row_block(0, n)};
}

// gate_up = xn2 Wgu^T, sw = swiglu(gate, up) for one tile.
void mlp_tile_up(Backend& be, Stream& s, const ModelConfig& cfg, const LayerWeights& w,
                 const MlpTile& t) {
  const int64_t F = cfg.intermediate_size;
  // slot G: gate_up overwrites attn_proj (forward) or the previous tile's dgate_up.
  be.gemm(s, t.gate_up, t.xn2, Trans::no, w.w_gate_up, Trans::yes, 1.f, 0.f);
  be.swiglu_forward(s, t.sw, t.gate_up.col_block(0, F), t.gate_up.col_block(F, F));
}

// One tile's MLP backward from its rows of dy: dW_down, dW_gate_up (+=), dxn2 rows
// (overwrite). Consumes the tile's gate_up and sw.
void mlp_tile_backward(Backend& be, Stream& s, const ModelConfig& cfg, const LayerWeights& w,
                       const LayerGrads& g, const MlpTile& t, Mat dy) {
  const int64_t F = cfg.intermediate_size;
  be.gemm(s, g.w_down, dy, Trans::yes, t.sw, Trans::no, 1.f, 1.f);
  // slot S: dsw overwrites sw (consumed by the GEMM above).
  be.gemm(s, t.dsw, dy, Trans::no, w.w_down, Trans::no, 1.f, 0.f);
  Mat gate = t.gate_up.col_block(0, F), up = t.gate_up.col_block(F, F);
  be.swiglu_backward(s, gate, up, t.dsw, gate, up);  // slot G: dgate_up in place
  Mat dgate_up = t.gate_up;
  be.gemm(s, g.w_gate_up, dgate_up, Trans::yes, t.xn2, Trans::no, 1.f, 1.f);
  // slot N: this tile's dxn2 rows overwrite its xn2 rows (consumed by the GEMM above).
  be.gemm(s, t.dxn2, dgate_up, Trans::no, w.w_gate_up, Trans::no, 1.f, 0.f);
}

// x_out = resid + swiglu(xn2 Wgu^T) Wdown^T, tile by tile. x_in is dead once the attention
// half has run, so x_out may alias it.
void mlp_forward(Backend& be, Stream& s, const ModelConfig& cfg, const LayerWeights& w,
                 const LayerActs& a, Mat x_out) {
  for (int64_t r0 = 0; r0 < a.T; r0 += a.mlp_tile) {
    const MlpTile t = mlp_tile(a, r0);
    mlp_tile_up(be, s, cfg, w, t);
    Mat out = x_out.row_block(r0, t.n), resid = a.resid.row_block(r0, t.n);
    if (out.data != resid.data) be.copy_on_device(s, out.data, resid.data, out.bytes());
    be.gemm(s, out, t.sw, Trans::no, w.w_down, Trans::yes, 1.f, 1.f);
  }
}

// The MLP's backward, tile by tile (recomputing each tile's gate_up and sw unless up_kept),
// then the mlp-norm's over every token: dy (== dx_out) becomes dresid, the gradient of the
// mid-layer residual.
void mlp_backward(Backend& be, Stream& s, const ModelConfig& cfg, const LayerWeights& w,
                  const LayerGrads& g, const LayerActs& a, Mat dy, bool up_kept) {
  for (int64_t r0 = 0; r0 < a.T; r0 += a.mlp_tile) {
    const MlpTile t = mlp_tile(a, r0);
    if (!up_kept) mlp_tile_up(be, s, cfg, w, t);
    mlp_tile_backward(be, s, cfg, w, g, t, dy.row_block(r0, t.n));
  }
  // dresid = rmsnorm'(dxn2) + dy, written over dy.
  be.rmsnorm_backward(s, dy, g.mlp_norm, a.dxn, a.resid, w.mlp_norm, a.rstd2, dy);
}

// Backward of resid = x_in + attention(xn1) Wo^T from dresid: weight gradients +=, dx_in
// (overwrite; may alias dresid).
void attention_half_backward(Backend& be, Stream& s, const ModelConfig& cfg,
                             const LayerWeights& w, const LayerGrads& g, const LayerActs& a,
                             const BatchInputs& in, Mat x_in, Mat dresid, Mat dx_in) {
  const float eps = float(cfg.rms_norm_eps);
  const int64_t T = a.T, Q = cfg.q_dim(), KV = cfg.kv_dim();
  const int H = int(cfg.num_attention_heads), KVH = int(cfg.num_key_value_heads);
  const int D = int(cfg.head_dim);
  be.gemm(s, g.wo, dresid, Trans::yes, a.att, Trans::no, 1.f, 1.f);
  // slot S: datt overwrites the last MLP tile's dsw (consumed by swiglu_backward).
  be.gemm(s, a.datt, dresid, Trans::no, w.wo, Trans::no, 1.f, 0.f);
  // slot G: dq|dk|dv overwrite the last tile's dgate_up (consumed by its two GEMMs).
  be.attention_backward(s, a.dq, a.dk, a.dv, a.datt, a.att, a.lse, a.qr, a.kr, a.v, in.attn,
                        in.cu_seqlens);
  be.rope_backward(s, a.dq, H, D, in.positions, in.inv_freq);
  be.rope_backward(s, a.dk, KVH, D, in.positions, in.inv_freq);
  if (cfg.qk_norm) {
    // slot QKN: dq_raw/dk_raw overwrite qr/kr (consumed by attention_backward).
    be.rmsnorm_backward(s, a.dq_raw.reshaped(T * H, D), g.q_norm, a.dq.reshaped(T * H, D),
                        a.q.reshaped(T * H, D), w.q_norm, a.rstd_q, Mat{});
    be.rmsnorm_backward(s, a.dk_raw.reshaped(T * KVH, D), g.k_norm, a.dk.reshaped(T * KVH, D),
                        a.k.reshaped(T * KVH, D), w.k_norm, a.rstd_k, Mat{});
  }
  // slot R: recompute xn1 over resid (consumed by the mlp-norm backward); also rewrites
  // rstd1 with the same values.
  be.rmsnorm_forward(s, a.xn1, a.rstd1, x_in, w.attn_norm, eps);
  if (!a.dqkv.empty()) {  // fused
    if (!g.bqkv.empty()) be.bias_backward(s, g.bqkv, a.dqkv);
    be.gemm(s, g.wqkv, a.dqkv, Trans::yes, a.xn1, Trans::no, 1.f, 1.f);
    // slot N: dxn (now dxn1) overwrites dxn2 (consumed by the mlp-norm backward).
    be.gemm(s, a.dxn, a.dqkv, Trans::no, w.wqkv, Trans::no, 1.f, 0.f);
  } else {  // planar
    const Mat parts[3] = {a.dq_raw, a.dk_raw, a.dv};
    const int64_t row0[3] = {0, Q, Q + KV}, rows[3] = {Q, KV, KV};
    for (int i = 0; i < 3; ++i) {
      if (!g.bqkv.empty()) be.bias_backward(s, g.bqkv.col_block(row0[i], rows[i]), parts[i]);
      be.gemm(s, g.wqkv.row_block(row0[i], rows[i]), parts[i], Trans::yes, a.xn1, Trans::no,
              1.f, 1.f);
      be.gemm(s, a.dxn, parts[i], Trans::no, w.wqkv.row_block(row0[i], rows[i]), Trans::no,
              1.f, i == 0 ? 0.f : 1.f);
    }
  }
  // dx_in = rmsnorm'(dxn1) + dresid; dx_in may alias dresid (== dx_out).
  be.rmsnorm_backward(s, dx_in, g.attn_norm, a.dxn, x_in, w.attn_norm, a.rstd1, dresid);
}

}  // namespace

void embedding_forward(Backend& be, Stream& s, const EmbeddingWeights& w, const BatchInputs& in,
                       Mat x) {
  check_x("embedding_forward x", x, in.n_tokens, w.table.cols);
  be.embedding_forward(s, x, in.tokens, w.table);
}

void embedding_backward(Backend& be, Stream& s, const EmbeddingGrads& g, const BatchInputs& in,
                        Mat dx) {
  check_x("embedding_backward dx", dx, in.n_tokens, g.table.cols);
  SF_CHECK(g.table.dtype == DType::f32, "embedding gradient must be f32");
  be.embedding_backward(s, g.table, in.tokens, dx);
}

void layer_forward(Backend& be, Stream& s, const ModelConfig& cfg, const LayerWeights& w,
                   const LayerActs& a, const BatchInputs& in, Mat x_in, Mat x_out) {
  check_inputs(in, a);
  check_x("layer_forward x_in", x_in, a.T, cfg.hidden_size);
  check_x("layer_forward x_out", x_out, a.T, cfg.hidden_size);
  attention_half_forward(be, s, cfg, w, a, in, x_in);
  mlp_forward(be, s, cfg, w, a, x_out);
}

void layer_backward(Backend& be, Stream& s, const ModelConfig& cfg, const LayerWeights& w,
                    const LayerGrads& g, const LayerActs& a, const BatchInputs& in, Mat x_in,
                    Mat dx_out, Mat dx_in, Recompute recompute) {
  check_inputs(in, a);
  const int64_t C = cfg.hidden_size;
  check_x("layer_backward x_in", x_in, a.T, C);
  check_x("layer_backward dx_out", dx_out, a.T, C);
  check_x("layer_backward dx_in", dx_in, a.T, C);
  SF_CHECK(x_in.data != dx_out.data && x_in.data != dx_in.data,
           "layer_backward: x_in must not alias the gradient buffers");
  SF_CHECK(g.wqkv.dtype == DType::f32, "layer gradients must be f32");
  if (recompute != Recompute::none)
    attention_half_forward(be, s, cfg, w, a, in, x_in,
                           recompute == Recompute::all ? Attention::run : Attention::kept);
  // One tile and no recompute: the forward left its gate_up and sw in place.
  const bool up_kept = recompute == Recompute::none && a.mlp_tile == a.T;
  mlp_backward(be, s, cfg, w, g, a, dx_out, up_kept);  // dx_out becomes dresid
  attention_half_backward(be, s, cfg, w, g, a, in, x_in, dx_out, dx_in);
}

void head_forward_backward(Backend& be, Stream& s, const ModelConfig& cfg, const HeadWeights& w,
                           const HeadGrads& g, const HeadActs& a, const BatchInputs& in, Mat x,
                           Mat dx, float* loss_sum, float grad_scale) {
  const int64_t C = cfg.hidden_size;
  SF_CHECK(in.n_tokens == a.T, "batch inputs have ", in.n_tokens,
           " tokens but the head scratch is bound for ", a.T);
  SF_CHECK(in.labels && loss_sum, "head recipe: labels or loss not bound");
  check_x("head x", x, a.T, C);
  be.rmsnorm_forward(s, a.xn, a.rstd, x, w.final_norm, float(cfg.rms_norm_eps));
  if (dx.empty()) {
    be.lm_head_loss(s, loss_sum, Mat{}, Mat{}, a.xn, w.lm_head, in.labels, grad_scale, a.logits);
    return;
  }
  check_x("head dx", dx, a.T, C);
  SF_CHECK(dx.data != x.data, "head: dx must not alias x");
  SF_CHECK(g.lm_head.dtype == DType::f32 && g.final_norm.dtype == DType::f32,
           "head gradients must be f32");
  be.lm_head_loss(s, loss_sum, a.dxn, g.lm_head, a.xn, w.lm_head, in.labels, grad_scale,
                  a.logits);
  be.rmsnorm_backward(s, dx, g.final_norm, a.dxn, x, w.final_norm, a.rstd, Mat{});
}

}  // namespace sf
