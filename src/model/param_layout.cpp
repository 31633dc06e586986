#include "model/param_layout.h"

#include <algorithm>

#include <unordered_map>

#include "core/error.h"

namespace sf {

std::string_view param_kind_name(ParamKind k) {
  switch (k) {
    case ParamKind::embedding: return "embedding";
    case ParamKind::attn_norm: return "attn_norm";
    case ParamKind::wqkv: return "wqkv";
    case ParamKind::bqkv: return "bqkv";
    case ParamKind::q_norm: return "q_norm";
    case ParamKind::k_norm: return "k_norm";
    case ParamKind::wo: return "wo";
    case ParamKind::mlp_norm: return "mlp_norm";
    case ParamKind::w_gate_up: return "w_gate_up";
    case ParamKind::w_down: return "w_down";
    case ParamKind::final_norm: return "final_norm";
    case ParamKind::lm_head: return "lm_head";
  }
  return "?";
}

const ParamSlot* Unit::find(ParamKind k) const {
  for (auto& p : params)
    if (p.kind == k) return &p;
  return nullptr;
}

const ParamSlot& Unit::get(ParamKind k) const {
  const ParamSlot* p = find(k);
  SF_CHECK(p, "unit has no parameter ", param_kind_name(k));
  return *p;
}

namespace {

int64_t align_up(int64_t x) { return (x + kParamAlign - 1) / kParamAlign * kParamAlign; }

struct UnitBuilder {
  Unit u;
  // A 2-D parameter made of row blocks, each an HF matrix [rows_i, cols].
  void matrix(ParamKind k, int64_t cols, bool decay,
              std::vector<std::pair<std::string, int64_t>> row_parts) {
    ParamSlot s{k, 0, cols, align_up(u.numel), decay, {}};
    for (auto& [name, r] : row_parts) {
      s.parts.push_back({name, {r, cols}, s.offset + s.rows * cols, r * cols});
      s.rows += r;
    }
    u.numel = s.offset + s.numel();
    u.params.push_back(std::move(s));
  }
  // A 1-D parameter [1, n] made of consecutive HF vectors.
  void vector(ParamKind k, bool decay, std::vector<std::pair<std::string, int64_t>> parts) {
    ParamSlot s{k, 1, 0, align_up(u.numel), decay, {}};
    for (auto& [name, n] : parts) {
      s.parts.push_back({name, {n}, s.offset + s.cols, n});
      s.cols += n;
    }
    u.numel = s.offset + s.numel();
    u.params.push_back(std::move(s));
  }
};

}  // namespace

ModelLayout ModelLayout::build(const ModelConfig& c) {
  ModelLayout m;
  m.n_layers = int(c.num_hidden_layers);
  m.tied = c.tie_word_embeddings;
  const int64_t C = c.hidden_size, F = c.intermediate_size, V = c.vocab_size;
  const int64_t Q = c.q_dim(), KV = c.kv_dim(), D = c.head_dim;

  UnitBuilder emb{{UnitKind::embedding}};
  emb.matrix(ParamKind::embedding, C, true, {{"model.embed_tokens.weight", V}});
  m.units.push_back(std::move(emb.u));

  for (int i = 0; i < m.n_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    UnitBuilder b{{UnitKind::layer, i}};
    // Large matrices first, then the small vectors, so the big ones stay aligned and dense.
    b.matrix(ParamKind::wqkv, C, true,
             {{p + "self_attn.q_proj.weight", Q},
              {p + "self_attn.k_proj.weight", KV},
              {p + "self_attn.v_proj.weight", KV}});
    b.matrix(ParamKind::wo, Q, true, {{p + "self_attn.o_proj.weight", C}});
    b.matrix(ParamKind::w_gate_up, C, true,
             {{p + "mlp.gate_proj.weight", F}, {p + "mlp.up_proj.weight", F}});
    b.matrix(ParamKind::w_down, F, true, {{p + "mlp.down_proj.weight", C}});
    b.vector(ParamKind::attn_norm, false, {{p + "input_layernorm.weight", C}});
    b.vector(ParamKind::mlp_norm, false, {{p + "post_attention_layernorm.weight", C}});
    if (c.qkv_bias)
      b.vector(ParamKind::bqkv, false,
               {{p + "self_attn.q_proj.bias", Q},
                {p + "self_attn.k_proj.bias", KV},
                {p + "self_attn.v_proj.bias", KV}});
    if (c.qk_norm) {
      b.vector(ParamKind::q_norm, false, {{p + "self_attn.q_norm.weight", D}});
      b.vector(ParamKind::k_norm, false, {{p + "self_attn.k_norm.weight", D}});
    }
    m.units.push_back(std::move(b.u));
  }

  UnitBuilder head{{UnitKind::head}};
  head.vector(ParamKind::final_norm, false, {{"model.norm.weight", C}});
  if (!c.tie_word_embeddings) head.matrix(ParamKind::lm_head, C, true, {{"lm_head.weight", V}});
  m.units.push_back(std::move(head.u));
  return m;
}

int64_t ModelLayout::total_numel() const {
  int64_t n = 0;
  for (auto& u : units) n += u.numel;
  return n;
}

std::optional<ModelLayout::Location> ModelLayout::find_hf(const std::string& name) const {
  for (size_t ui = 0; ui < units.size(); ++ui)
    for (auto& s : units[ui].params)
      for (auto& part : s.parts)
        if (part.hf_name == name) return Location{int(ui), &s, &part};
  return std::nullopt;
}

std::vector<std::string> ModelLayout::hf_names() const {
  std::vector<std::string> names;
  for (auto& u : units)
    for (auto& s : u.params)
      for (auto& part : s.parts) names.push_back(part.hf_name);
  return names;
}

void Unit::zero_padding(float* base) const {
  std::vector<std::pair<int64_t, int64_t>> filled;
  for (auto& s : params)
    for (auto& part : s.parts) filled.emplace_back(part.offset, part.offset + part.numel);
  std::sort(filled.begin(), filled.end());
  int64_t at = 0;
  for (auto& [b, e] : filled) {
    SF_CHECK(b >= at && e <= numel, "parts overlap or leave the unit");
    std::fill(base + at, base + b, 0.f);
    at = e;
  }
  std::fill(base + at, base + numel, 0.f);
}

std::vector<StateUnit> state_units(const ModelLayout& layout) {
  std::vector<StateUnit> out;
  for (const Unit& unit : layout.units) {
    StateUnit s;
    s.numel = unit.numel;
    for (const ParamSlot& slot : unit.params) {
      // Merge with the previous range when contiguous and of the same decay group.
      if (!s.ranges.empty() && s.ranges.back().decay == slot.decay &&
          s.ranges.back().offset + s.ranges.back().numel == slot.offset)
        s.ranges.back().numel += slot.numel();
      else
        s.ranges.push_back({slot.offset, slot.numel(), slot.decay});
    }
    // The embedding table is updated in runs of whole rows (the step's touched rows, then the
    // others): a compact state's blocks follow its rows (optim/state_format.h).
    if (unit.kind == UnitKind::embedding && s.ranges.size() == 1 && unit.params.size() == 1)
      s.ranges[0].row = unit.params[0].cols;
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace sf
