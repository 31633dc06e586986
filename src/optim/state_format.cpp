// State formats (state_format.h): names, the byte layout of a unit, the int8 maps and the
// stochastic rounding hash.
#include "optim/state_format.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace sf {

const char* moment_format_name(MomentFormat f) {
  switch (f) {
    case MomentFormat::f32: return "fp32";
    case MomentFormat::bf16: return "bf16";
    case MomentFormat::int8: return "int8";
  }
  return "?";
}
const char* master_format_name(MasterFormat f) {
  switch (f) {
    case MasterFormat::f32: return "fp32";
    case MasterFormat::bf16: return "bf16";
  }
  return "?";
}
std::optional<MomentFormat> parse_moment_format(std::string_view s) {
  if (s == "fp32") return MomentFormat::f32;
  if (s == "bf16") return MomentFormat::bf16;
  if (s == "int8") return MomentFormat::int8;
  return std::nullopt;
}
std::optional<MasterFormat> parse_master_format(std::string_view s) {
  if (s == "fp32") return MasterFormat::f32;
  if (s == "bf16") return MasterFormat::bf16;
  return std::nullopt;
}

namespace {

constexpr size_t kMomentAlign = 64;  // int8 units: each range's moments start on a cache line

size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

// Blocks of a range on its grid (state_format.h).
int64_t range_blocks(const ParamRange& r) {
  if (r.numel == 0) return 0;
  if (r.row > 0) return r.numel / r.row * ((r.row + kStateBlock - 1) / kStateBlock);
  return (r.offset + r.numel - 1) / kStateBlock - r.offset / kStateBlock + 1;
}

}  // namespace

UnitStateLayout unit_state_layout(const StateUnit& unit, StateFormat format) {
  check_param_ranges(unit.ranges, unit.numel, "unit_state_layout");
  SF_CHECK(unit.numel < (int64_t(1) << 32), "unit_state_layout: unit of ", unit.numel,
           " elements; the stochastic rounding index is 32-bit (split the unit)");
  UnitStateLayout L;
  L.format = format;
  L.numel = unit.numel;
  L.master_bytes = size_t(unit.numel) * (format.master == MasterFormat::f32 ? 4 : 2);
  const size_t dense_size = format.moments == MomentFormat::bf16 ? 2 : 4;
  size_t packed = 0;
  for (const ParamRange& r : unit.ranges) {
    SF_CHECK(r.row >= 0 && (r.row == 0 || r.numel % r.row == 0), "unit_state_layout: range at ",
             r.offset, " of ", r.numel, " elements is not a whole number of rows of ", r.row);
    RangeStateLayout s;
    s.offset = r.offset;
    s.numel = r.numel;
    s.row = r.row;
    s.decay = r.decay;
    if (format.moments != MomentFormat::int8) {
      s.moments = format.moments;
      s.moment_offset = size_t(r.offset) * dense_size;
    } else {
      s.moments = r.numel < kInt8MinNumel ? MomentFormat::f32 : MomentFormat::int8;
      packed = align_up(packed, kMomentAlign);
      s.moment_offset = packed;
      packed += size_t(r.numel) * (s.moments == MomentFormat::int8 ? 1 : 4);
      if (s.moments == MomentFormat::int8) {
        s.scale_offset = L.scale_count;
        s.scale_count = range_blocks(r);
        L.scale_count += s.scale_count;
      }
    }
    L.ranges.push_back(s);
  }
  L.moment_bytes = format.moments == MomentFormat::int8 ? align_up(packed, kMomentAlign)
                                                        : size_t(unit.numel) * dense_size;
  return L;
}

size_t unit_state_bytes(const StateUnit& unit, StateFormat format) {
  const UnitStateLayout L = unit_state_layout(unit, format);
  return L.master_bytes + 2 * L.moment_bytes + 2 * size_t(L.scale_count) * sizeof(float);
}

namespace {

// 2^(-i/8) for i = 0..7, rounded to fp32: the maps are defined by these bits (hex literals,
// so no libm's exp2 can change a checkpoint's meaning).
constexpr float kEighthOctave[8] = {0x1.000000p+0f, 0x1.d5818ep-1f, 0x1.ae89fap-1f,
                                    0x1.8ace54p-1f, 0x1.6a09e6p-1f, 0x1.4bfdaep-1f,
                                    0x1.306fe0p-1f, 0x1.172b84p-1f};
float neg_eighth_power(int k) { return std::ldexp(kEighthOctave[k % 8], -(k / 8)); }

struct Int8Maps {
  float map[2][256], mid[2][256];
  Int8Maps() {
    // m: -2^0 .. -2^(-126/8), 0, 2^(-127/8) .. 2^0.
    for (int k = 0; k <= 126; ++k) map[0][k] = -neg_eighth_power(k);
    map[0][kInt8ZeroCodeM] = 0.0f;
    for (int k = 0; k <= 127; ++k) map[0][255 - k] = neg_eighth_power(k);
    // v: 0, 2^(-254/8) .. 2^0.
    map[1][0] = 0.0f;
    for (int k = 0; k <= 254; ++k) map[1][255 - k] = neg_eighth_power(k);
    for (int t = 0; t < 2; ++t) {
      for (int k = 0; k < 255; ++k) mid[t][k] = (map[t][k] + map[t][k + 1]) * 0.5f;
      mid[t][255] = std::numeric_limits<float>::infinity();
    }
  }
};
const Int8Maps& int8_maps() {
  static const Int8Maps maps;
  return maps;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace

const float* int8_map(bool is_v) { return int8_maps().map[is_v ? 1 : 0]; }
const float* int8_midpoints(bool is_v) { return int8_maps().mid[is_v ? 1 : 0]; }

uint32_t stochastic_round_key(uint64_t seed, int32_t unit, int64_t step) {
  const uint64_t h = splitmix64(seed ^ splitmix64(uint64_t(uint32_t(unit)) ^
                                                  splitmix64(uint64_t(step))));
  return uint32_t(h ^ (h >> 32));
}

// A 32-bit avalanche (multiply-xorshift) of the element index mixed with the key; only
// 32-bit integer multiplies and shifts, which AVX2 (mullo_epi32) and CUDA have.
uint32_t stochastic_round_noise(uint32_t key, uint32_t index) {
  uint32_t h = (index * 0x9e3779b9u) ^ key;
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h >> 16;
}

uint16_t stochastic_round_bf16(float x, uint32_t noise) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  return uint16_t((u + noise) >> 16);  // carries into the magnitude: |x| rounds up or down
}

}  // namespace sf
