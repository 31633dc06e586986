// ParamRange: one parameter group inside a flat per-unit buffer, as the optimizer sees it.
// sf_optim does not depend on sf_model; the caller builds these from a unit's ParamSlots:
//     for (const ParamSlot& s : unit.params) ranges.push_back({s.offset, s.numel(), s.decay});
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace sf {

// Elements [offset, offset + numel) of the buffer, with or without weight decay. Elements
// outside every range (alignment padding) are neither read nor written.
struct ParamRange {
  int64_t offset = 0;
  int64_t numel = 0;
  bool decay = true;  // false: norms and biases (weight_decay treated as 0)
  // > 0: the range is numel / row rows of `row` elements (the embedding table, updated in
  // runs of whole rows); compact int8 state cuts each row into blocks from its own start
  // (optim/state_format.h). 0: one flat range.
  int64_t row = 0;
};

// One unit's flat fp32 buffer as the optimizer's state sees it: its length and its ranges.
struct StateUnit {
  int64_t numel = 0;
  std::vector<ParamRange> ranges;
};

// Throws Error(internal) unless the ranges are sorted by offset, disjoint and inside [0, n).
void check_param_ranges(std::span<const ParamRange> ranges, int64_t n, const char* who);

// The parts of `ranges` inside the window [off, off + len), shifted so the window starts at
// element 0: for working on a piece of a flat buffer.
std::vector<ParamRange> clip_ranges(std::span<const ParamRange> ranges, int64_t off, int64_t len);

}  // namespace sf
