// Bindings of flat unit buffers and scratch buffers to the Mats of model/recipes.h.
// Pure pointer arithmetic: nothing here touches backend memory.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/recipes.h"

namespace sf {

namespace {

Mat slot_mat(const Unit& u, ParamKind k, void* base, DType dt) {
  const ParamSlot* p = u.find(k);
  if (!p) return {};
  return Mat(static_cast<char*>(base) + p->offset * int64_t(dtype_size(dt)), dt, p->rows,
             p->cols);
}

}  // namespace

LayerParams bind_layer(const Unit& unit, void* base, DType dt) {
  SF_CHECK(unit.kind == UnitKind::layer, "bind_layer on a unit that is not a decoder layer");
  SF_CHECK(base, "bind_layer: null buffer for layer ", unit.layer);
  LayerParams p;
  p.attn_norm = slot_mat(unit, ParamKind::attn_norm, base, dt);
  p.wqkv = slot_mat(unit, ParamKind::wqkv, base, dt);
  p.bqkv = slot_mat(unit, ParamKind::bqkv, base, dt);
  p.q_norm = slot_mat(unit, ParamKind::q_norm, base, dt);
  p.k_norm = slot_mat(unit, ParamKind::k_norm, base, dt);
  p.wo = slot_mat(unit, ParamKind::wo, base, dt);
  p.mlp_norm = slot_mat(unit, ParamKind::mlp_norm, base, dt);
  p.w_gate_up = slot_mat(unit, ParamKind::w_gate_up, base, dt);
  p.w_down = slot_mat(unit, ParamKind::w_down, base, dt);
  return p;
}

EmbeddingParams bind_embedding(const Unit& unit, void* base, DType dt) {
  SF_CHECK(unit.kind == UnitKind::embedding, "bind_embedding on a non-embedding unit");
  SF_CHECK(base, "bind_embedding: null buffer");
  return {slot_mat(unit, ParamKind::embedding, base, dt)};
}

HeadParams bind_head(const Unit& unit, void* base, DType dt, Mat tied_table) {
  SF_CHECK(unit.kind == UnitKind::head, "bind_head on a non-head unit");
  SF_CHECK(base, "bind_head: null buffer");
  HeadParams p;
  p.final_norm = slot_mat(unit, ParamKind::final_norm, base, dt);
  p.lm_head = slot_mat(unit, ParamKind::lm_head, base, dt);
  if (p.lm_head.empty()) {
    SF_CHECK(!tied_table.empty(),
             "bind_head: tied embeddings need the embedding table passed as tied_table");
    SF_CHECK(tied_table.dtype == dt, "bind_head: tied table dtype differs from the head's");
    p.lm_head = tied_table;
  } else {
    SF_CHECK(tied_table.empty(), "bind_head: tied_table given but the model has an lm_head");
  }
  return p;
}

AttentionShape attention_shape(const ModelConfig& cfg, int n_seqs, int max_seqlen) {
  AttentionShape a;
  a.n_heads = int(cfg.num_attention_heads);
  a.n_kv_heads = int(cfg.num_key_value_heads);
  a.head_dim = int(cfg.head_dim);
  // yarn scales cos and sin, so both q and k: the scores by its square.
  const double rope_scale = rope_attention_scaling(cfg);
  a.scale = float(rope_scale * rope_scale / std::sqrt(double(cfg.head_dim)));
  a.n_seqs = n_seqs;
  a.max_seqlen = max_seqlen;
  return a;
}

namespace {

constexpr size_t kScratchAlign = 256;  // bytes; every slot starts aligned for vector loads

struct Carver {
  std::vector<ScratchEntry> table;
  size_t end = 0;
  size_t add(const std::string& name, size_t bytes) {
    size_t off = (end + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
    table.push_back({name, off, bytes});
    end = off + bytes;
    return off;
  }
  size_t total() const { return (end + kScratchAlign - 1) / kScratchAlign * kScratchAlign; }
};

// Widths (elements per token) of the LayerActs slots.
struct LayerWidths {
  int64_t C, Q, KV, F, H, KVH;
  bool qk_norm;
  int64_t qkv() const { return Q + 2 * KV; }
  // Slots G and S: their [T, .] users and the MLP tile's (see recipes.h).
  int64_t slot_g(int64_t T, int64_t tile) const {
    return std::max(T * std::max(C, qkv()), tile * 2 * F);
  }
  int64_t slot_s(int64_t T, int64_t tile) const { return std::max(T * Q, tile * F); }
};

// Rows of one MLP tile: T when untiled (0) or when the tile covers every token.
int64_t mlp_tile_rows(int64_t T, int64_t mlp_tile_tokens) {
  SF_CHECK(mlp_tile_tokens >= 0, "layer scratch: mlp_tile_tokens is ", mlp_tile_tokens,
           "; pass a positive token count, or 0 for an untiled MLP");
  return mlp_tile_tokens == 0 ? T : std::min(T, mlp_tile_tokens);
}

LayerWidths widths(const ModelConfig& c) {
  SF_CHECK(c.hidden_size > 0 && c.head_dim > 0 && c.num_attention_heads > 0,
           "layer scratch for an unset model config");
  return {c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size, c.num_attention_heads,
          c.num_key_value_heads, c.qk_norm};
}

Carver carve_layer(const ModelConfig& cfg, int64_t T, DType dt, int64_t mlp_tile_tokens) {
  SF_CHECK(T > 0, "layer scratch for ", T, " tokens");
  LayerWidths w = widths(cfg);
  const int64_t tile = mlp_tile_rows(T, mlp_tile_tokens);
  size_t e = dtype_size(dt), T_ = size_t(T);
  Carver c;
  c.add("R: xn1 | resid", T_ * w.C * e);
  c.add("N: xn2 | dxn", T_ * w.C * e);
  c.add("QKV: q k v", T_ * w.qkv() * e);
  if (w.qk_norm) c.add("QKN: normed q k | dq_raw dk_raw", T_ * (w.Q + w.KV) * e);
  c.add("A: att", T_ * w.Q * e);
  c.add("G: attn_proj | gate_up tile | dq dk dv", size_t(w.slot_g(T, tile)) * e);
  c.add("S: sw tile | dsw tile | datt", size_t(w.slot_s(T, tile)) * e);
  c.add("rstd1", T_ * 4);
  c.add("rstd2", T_ * 4);
  c.add("lse", T_ * w.H * 4);
  if (w.qk_norm) {
    c.add("rstd_q", T_ * w.H * 4);
    c.add("rstd_k", T_ * w.KVH * 4);
  }
  return c;
}

}  // namespace

std::vector<ScratchEntry> layer_acts_table(const ModelConfig& cfg, int64_t T, DType dt,
                                           int64_t mlp_tile_tokens) {
  return carve_layer(cfg, T, dt, mlp_tile_tokens).table;
}

size_t layer_acts_bytes(const ModelConfig& cfg, int64_t T, DType dt, int64_t mlp_tile_tokens) {
  return carve_layer(cfg, T, dt, mlp_tile_tokens).total();
}

LayerActs bind_layer_acts(const ModelConfig& cfg, int64_t T, DType dt, void* base,
                          size_t bytes, int64_t mlp_tile_tokens) {
  Carver c = carve_layer(cfg, T, dt, mlp_tile_tokens);
  SF_CHECK(base, "bind_layer_acts: null buffer");
  SF_CHECK(bytes >= c.total(), "bind_layer_acts: buffer of ", bytes, " bytes is smaller than the ",
           c.total(), " bytes needed for ", T, " tokens (MLP tile ", mlp_tile_tokens, ")");
  const int64_t tile = mlp_tile_rows(T, mlp_tile_tokens);
  LayerWidths w = widths(cfg);
  char* b = static_cast<char*>(base);
  size_t e = dtype_size(dt);
  size_t i = 0;
  auto next = [&] { return b + c.table[i++].offset; };
  auto mat = [&](char* p, int64_t cols) { return Mat(p, dt, T, cols); };

  LayerActs a;
  a.T = T;
  a.mlp_tile = tile;
  char* r = next();
  a.xn1 = mat(r, w.C);
  a.resid = mat(r, w.C);
  char* n = next();
  a.xn2 = mat(n, w.C);
  a.dxn = mat(n, w.C);
  char* qkv = next();
  char* qkn = w.qk_norm ? next() : nullptr;
  if (!w.qk_norm) {
    a.qkv = mat(qkv, w.qkv());
    a.q = a.qkv.col_block(0, w.Q);
    a.k = a.qkv.col_block(w.Q, w.KV);
    a.v = a.qkv.col_block(w.Q + w.KV, w.KV);
    a.qr = a.q;
    a.kr = a.k;
  } else {
    a.q = mat(qkv, w.Q);
    a.k = mat(qkv + T * w.Q * e, w.KV);
    a.v = mat(qkv + T * (w.Q + w.KV) * e, w.KV);
    a.qr = mat(qkn, w.Q);
    a.kr = mat(qkn + T * w.Q * e, w.KV);
  }
  a.att = mat(next(), w.Q);
  char* g = next();
  a.attn_proj = mat(g, w.C);
  a.gate_up = Mat(g, dt, tile, 2 * w.F);
  if (!w.qk_norm) {
    a.dqkv = mat(g, w.qkv());
    a.dq = a.dqkv.col_block(0, w.Q);
    a.dk = a.dqkv.col_block(w.Q, w.KV);
    a.dv = a.dqkv.col_block(w.Q + w.KV, w.KV);
    a.dq_raw = a.dq;
    a.dk_raw = a.dk;
  } else {
    a.dq = mat(g, w.Q);
    a.dk = mat(g + T * w.Q * e, w.KV);
    a.dv = mat(g + T * (w.Q + w.KV) * e, w.KV);
    a.dq_raw = a.qr;  // slot QKN is free once attention backward has consumed qr, kr
    a.dk_raw = a.kr;
  }
  char* sw = next();
  a.sw = Mat(sw, dt, tile, w.F);
  a.dsw = a.sw;
  a.datt = mat(sw, w.Q);
  a.rstd1 = reinterpret_cast<float*>(next());
  a.rstd2 = reinterpret_cast<float*>(next());
  a.lse = reinterpret_cast<float*>(next());
  if (w.qk_norm) {
    a.rstd_q = reinterpret_cast<float*>(next());
    a.rstd_k = reinterpret_cast<float*>(next());
  }
  SF_CHECK(i == c.table.size(), "bind_layer_acts: slot table and binding disagree");
  return a;
}

namespace {

Carver carve_head(const ModelConfig& cfg, int64_t T, DType dt, int64_t chunk_rows) {
  SF_CHECK(T > 0 && chunk_rows > 0, "head scratch for ", T, " tokens, chunk ", chunk_rows);
  size_t e = dtype_size(dt), T_ = size_t(T), C = size_t(cfg.hidden_size);
  Carver c;
  c.add("xn", T_ * C * e);
  c.add("dxn", T_ * C * e);
  c.add("rstd", T_ * 4);
  c.add("logits", size_t(chunk_rows) * size_t(cfg.vocab_size) * 4);
  return c;
}

}  // namespace

std::vector<ScratchEntry> head_acts_table(const ModelConfig& cfg, int64_t T, DType dt,
                                          int64_t chunk_rows) {
  return carve_head(cfg, T, dt, chunk_rows).table;
}

size_t head_acts_bytes(const ModelConfig& cfg, int64_t T, DType dt, int64_t chunk_rows) {
  return carve_head(cfg, T, dt, chunk_rows).total();
}

HeadActs bind_head_acts(const ModelConfig& cfg, int64_t T, DType dt, int64_t chunk_rows,
                        void* base, size_t bytes) {
  Carver c = carve_head(cfg, T, dt, chunk_rows);
  SF_CHECK(base, "bind_head_acts: null buffer");
  SF_CHECK(bytes >= c.total(), "bind_head_acts: buffer of ", bytes, " bytes is smaller than the ",
           c.total(), " bytes needed for ", T, " tokens");
  char* b = static_cast<char*>(base);
  HeadActs h;
  h.T = T;
  h.xn = Mat(b + c.table[0].offset, dt, T, cfg.hidden_size);
  h.dxn = Mat(b + c.table[1].offset, dt, T, cfg.hidden_size);
  h.rstd = reinterpret_cast<float*>(b + c.table[2].offset);
  h.logits = Mat(b + c.table[3].offset, DType::f32, chunk_rows, cfg.vocab_size);
  return h;
}

}  // namespace sf
