// Learning-rate schedules: linear warmup (step s <= warmup_steps runs at lr * s / warmup_steps),
// then cosine / linear decay from lr towards min_lr_ratio * lr over the remaining steps (the
// first of them at lr, the last one decay step short of the minimum), or constant. Step
// numbers are 1-based optimizer steps.
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
  static const char* kind_name(Kind k);
};

}  // namespace sf
