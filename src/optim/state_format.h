// Compact AdamW state formats: how one unit's master weights and moments m, v are encoded in
// host memory, where each parameter range's state lives, and how many bytes that takes.
// Owns the encodings (below), the byte layout of a unit (UnitStateLayout) and the non-owning
// view the optimizer works through (UnitStateView). The update itself is state_adamw.h.
//
// Encodings (every one exact, deterministic and ISA-independent):
//  - fp32 master / fp32 moments: plain floats, indexed by the element's index in the unit
//    (the layout ParamStore has always had).
//  - bf16 moments: m and v stored as bf16, round to nearest even (core/dtype.h), indexed by
//    the element's index in the unit.
//  - int8 moments: block-wise. A block is at most kStateBlock elements of one range (grid
//    below) with one fp32 scale per moment: the block's absmax (largest |x|; 0 for an all-zero
//    block). An element is stored as a code c (uint8) of a 256-entry sorted map: x is
//    dequantised as map[c] * scale and quantised to the nearest map entry of x / scale, found
//    by comparing x / scale against the 255 midpoints (m[k] + m[k+1]) * 0.5f: c = the number
//    of midpoints strictly below x / scale (a tie goes to the smaller entry). Exact fp32
//    comparisons, so every ISA and the GPU pick the same code.
//      m (signed) map: 0, +-2^(-k/8) for k = 0..126 and +2^(-127/8): 127 negative, zero,
//      128 positive entries, dense near 0 (constant ratio 2^(1/8): a relative rounding error
//      <= 4.5% down to 2^-15.9 * absmax).
//      v (unsigned) map: 0 and 2^(-k/8) for k = 0..254 (down to 2^-31.75 * absmax: sqrt(v)
//      then spans the same range as m).
//    Non-finite moments are not representable (a block's scale ignores NaN); the caller
//    skips steps with a non-finite gradient norm (adamw.h's grad_scale check).
//    Ranges with numel < kInt8MinNumel (norms, biases) keep fp32 moments.
//    Block grid: a range with row == 0 is cut on the unit's absolute grid: its blocks are
//    range ∩ [k * kStateBlock, (k + 1) * kStateBlock). A range with row > 0 is numel / row
//    rows of `row` elements, each cut into blocks from the row's own start (the last block
//    of a row may be short). Scales are stored in block order.
//    Moments of an int8-mode unit are packed range by range (each range's codes, or fp32
//    values for a small range, start at a multiple of 64 bytes).
//  - bf16 master: bf16 bits indexed by the unit element. The update runs in fp32 on the
//    decoded value; the result is rounded back STOCHASTICALLY: the 16 dropped bits of the
//    fp32 value plus a 16-bit hash r of (rounding_seed, unit, element index in the unit,
//    step) carry into the kept bits, so it rounds up (in magnitude) with probability
//    dropped / 2^16: unbiased, stateless, the same bits on every ISA, thread count and GPU.
//    NaN stays a quiet NaN. Why stochastic (bench/bench_master_rounding, 100k weights,
//    10,000 AdamW steps at lr 2e-5): round to nearest loses updates below half a bf16 ulp,
//    so the weights stall (93-94% of the fp32 run's displacement lost, loss well above
//    fp32's); stochastic rounding is unbiased and ends near fp32's loss (quadratic 2.9e-5 vs
//    2.8e-5, logistic 0.6604 vs 0.6592; RNE 1.0e-4 and 0.6636), its weights random-walking
//    around the fp32 ones (36-71% of the displacement). Kahan compensation tracks fp32 to
//    the bf16 rounding floor, but its bf16 compensation buffer makes the master 4 B/param:
//    no saving over an fp32 master, which has no drift at all.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "optim/param_range.h"

namespace sf {

enum class MomentFormat : uint8_t { f32, bf16, int8 };
enum class MasterFormat : uint8_t { f32, bf16 };

struct StateFormat {
  MomentFormat moments = MomentFormat::f32;
  MasterFormat master = MasterFormat::f32;
  bool is_fp32() const { return moments == MomentFormat::f32 && master == MasterFormat::f32; }
  bool operator==(const StateFormat&) const = default;
};

const char* moment_format_name(MomentFormat f);  // "fp32", "bf16", "int8" (the flag values)
const char* master_format_name(MasterFormat f);  // "fp32", "bf16"
std::optional<MomentFormat> parse_moment_format(std::string_view s);  // nullopt: bad value
std::optional<MasterFormat> parse_master_format(std::string_view s);

constexpr int64_t kStateBlock = 256;     // int8: elements per scale
constexpr int64_t kInt8MinNumel = 4096;  // int8: smaller ranges (norms, biases) keep f32 moments

// One parameter range's state.
struct RangeStateLayout {
  int64_t offset = 0, numel = 0, row = 0;  // the unit's ParamRange
  bool decay = true;
  MomentFormat moments = MomentFormat::f32;  // int8 units: f32 for ranges < kInt8MinNumel
  size_t moment_offset = 0;  // byte offset of the range's first element in m (and in v)
  int64_t scale_offset = 0;  // int8: index of the range's first block scale
  int64_t scale_count = 0;   // int8: its number of blocks; else 0
};

// Where one unit's compact state lives.
struct UnitStateLayout {
  StateFormat format;
  int64_t numel = 0;        // elements of the unit (padding included)
  size_t master_bytes = 0;  // numel * 4 (fp32) or numel * 2 (bf16)
  size_t moment_bytes = 0;  // bytes of m; v has the same layout
  int64_t scale_count = 0;  // fp32 scales per moment (int8 only; else 0)
  std::vector<RangeStateLayout> ranges;
};

// Throws Error(internal) for ranges that are unsorted, overlap, leave the unit, a row > 0
// that does not divide its range, or a unit of 2^32 elements or more.
UnitStateLayout unit_state_layout(const StateUnit& unit, StateFormat format);
// master + m + v + both moments' scales: what the memory planner counts.
size_t unit_state_bytes(const StateUnit& unit, StateFormat format);

// Non-owning view of one unit's state (the ParamStore hands these out). master: fp32 or
// bf16 per format.master; m, v: moment_bytes each; m_scale, v_scale: scale_count floats each
// (null unless int8 moments).
struct UnitStateView {
  StateFormat format;
  const UnitStateLayout* layout = nullptr;
  void* master = nullptr;
  void* m = nullptr;
  void* v = nullptr;
  float* m_scale = nullptr;
  float* v_scale = nullptr;
  uint64_t rounding_seed = 0;  // stochastic rounding stream (bf16 master)
  int32_t unit = 0;
};

// The int8 maps and their midpoints (map[k] + map[k + 1]) * 0.5f (255 used, [255] = +inf),
// for kernels and the GPU's constant memory. is_v: the unsigned v map; else the signed m map.
const float* int8_map(bool is_v);        // 256 entries, ascending
const float* int8_midpoints(bool is_v);  // 256 entries, ascending
// The code of zero in a map (the m map's zero sits at 127, the v map's at 0).
constexpr int kInt8ZeroCodeM = 127;

// The per-call key of the stochastic rounding hash for (seed, unit, step); the per-element
// noise is stochastic_round_noise(key, index in unit), 16 bits. Shared with the GPU kernel.
uint32_t stochastic_round_key(uint64_t seed, int32_t unit, int64_t step);
uint32_t stochastic_round_noise(uint32_t key, uint32_t index);
// x rounded to bf16 with the given 16-bit noise (see above); NaN -> quiet NaN.
uint16_t stochastic_round_bf16(float x, uint32_t noise);

}  // namespace sf
