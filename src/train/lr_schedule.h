// Learning-rate schedules: linear warmup from 0, then cosine / linear decay to
// min_lr_ratio * lr, or constant. Step numbers are 1-based optimizer steps.
#pragma once
#include <cstdint>
#include <string>

namespace sf {

struct LrSchedule {
  enum class Kind { constant, cosine, linear } kind = Kind::cosine;
  double lr = 1e-5;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.0;

  double at(int64_t step) const;
  static Kind parse_kind(const std::string& s);  // "constant" | "cosine" | "linear"
};

}  // namespace sf
