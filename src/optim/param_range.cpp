// Validation of parameter ranges (param_range.h).
#include "optim/param_range.h"

#include <algorithm>

#include "core/error.h"

namespace sf {

void check_param_ranges(std::span<const ParamRange> ranges, int64_t n, const char* who) {
  SF_CHECK(n >= 0, who, ": negative element count ", n);
  int64_t prev_end = 0;
  for (const ParamRange& r : ranges) {
    SF_CHECK(r.offset >= prev_end && r.numel >= 0 && r.offset + r.numel <= n, who,
             ": parameter range [", r.offset, ", ", r.offset + r.numel,
             ") overlaps the previous one (ending at ", prev_end,
             "), is unsorted or lies outside the buffer of ", n, " elements");
    prev_end = r.offset + r.numel;
  }
}

}  // namespace sf

namespace sf {

std::vector<ParamRange> clip_ranges(std::span<const ParamRange> ranges, int64_t off, int64_t len) {
  std::vector<ParamRange> out;
  for (const ParamRange& r : ranges) {
    const int64_t b = std::max(r.offset, off), e = std::min(r.offset + r.numel, off + len);
    if (b < e) out.push_back({b - off, e - b, r.decay});
  }
  return out;
}

}  // namespace sf
