// Where every parameter lives. The model is a list of units, each stored as ONE flat
// buffer per dtype (fp32 master, Adam m/v, bf16 weights, grads) so that moving or updating a
// unit is one memcpy / one optimizer sweep:
//   unit 0          embedding   [V, C]
//   units 1..L      decoder layers
//   unit L+1        head: final norm (+ lm_head [V, C] when embeddings are untied)
// Inside a layer, q/k/v weights are stacked into one [q_dim + 2 kv_dim, C] matrix and
// gate/up into one [2F, C] matrix, so each fused projection is a single GEMM; the Hugging
// Face tensors are row blocks of these ("parts").
#pragma once
#include "optim/param_range.h"  // StateUnit, ParamRange: header-only types
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "io/model_config.h"

namespace sf {

enum class ParamKind {
  embedding,   // [V, C]
  attn_norm,   // [1, C]
  wqkv,        // [q_dim + 2 kv_dim, C]
  bqkv,        // [1, q_dim + 2 kv_dim]    (qwen2, or llama/qwen3 with attention_bias)
  q_norm,      // [1, D]                   (qwen3)
  k_norm,      // [1, D]                   (qwen3)
  wo,          // [C, q_dim]
  mlp_norm,    // [1, C]
  w_gate_up,   // [2F, C]
  w_down,      // [C, F]
  final_norm,  // [1, C]
  lm_head,     // [V, C]                   (untied only)
};
std::string_view param_kind_name(ParamKind k);

// One Hugging Face tensor inside a parameter: rows [row0, row0 + rows) of the parameter
// (1-D HF tensors are a row block of a [1, n] parameter: row0 = 0 and col0 used instead).
struct ParamPart {
  std::string hf_name;
  std::vector<int64_t> hf_shape;  // as stored in safetensors
  int64_t offset = 0;             // element offset of this part inside the unit
  int64_t numel = 0;
};

struct ParamSlot {
  ParamKind kind;
  int64_t rows = 0, cols = 0;
  int64_t offset = 0;  // element offset inside the unit's flat buffer (64-aligned)
  bool decay = true;   // weight decay applies (false for norms and biases)
  std::vector<ParamPart> parts;
  int64_t numel() const { return rows * cols; }
};

enum class UnitKind { embedding, layer, head };

struct Unit {
  UnitKind kind;
  int layer = -1;  // for UnitKind::layer
  std::vector<ParamSlot> params;
  int64_t numel = 0;  // flat buffer size in elements (incl. alignment padding)
  const ParamSlot* find(ParamKind k) const;
  const ParamSlot& get(ParamKind k) const;
  // Sets the elements of `base` (numel floats) that no part covers (slot alignment padding)
  // to zero; checks that the parts neither overlap nor leave the unit.
  void zero_padding(float* base) const;
};

struct ModelLayout {
  std::vector<Unit> units;
  int n_layers = 0;
  bool tied = false;

  static ModelLayout build(const ModelConfig& c);
  const Unit& embedding() const { return units.front(); }
  const Unit& layer(int i) const { return units[size_t(1 + i)]; }
  const Unit& head() const { return units.back(); }
  int64_t total_numel() const;  // sum of unit buffers (with padding)

  struct Location {
    int unit;
    const ParamSlot* slot;
    const ParamPart* part;
  };
  // The unit/slot/part holding a Hugging Face tensor, or nullopt for an unknown name.
  std::optional<Location> find_hf(const std::string& hf_name) const;
  // Every HF tensor name in file order.
  std::vector<std::string> hf_names() const;
};

// The optimizer's view of the units (optim/param_store.h): each unit's length and its decay
// groups, contiguous slots of one group merged into one range.
std::vector<StateUnit> state_units(const ModelLayout& layout);

constexpr int64_t kParamAlign = 64;  // elements; keeps every slot 128-byte aligned in bf16

}  // namespace sf
