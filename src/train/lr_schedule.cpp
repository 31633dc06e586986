#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace sf {

double LrSchedule::at(int64_t step) const {
  if (warmup_steps > 0 && step <= warmup_steps) return lr * double(step) / double(warmup_steps);
  if (kind == Kind::constant) return lr;
  // The first step after warmup runs at the peak, the last one just above min_lr (no step
  // is wasted at lr 0); steps beyond total_steps stay at min_lr.
  int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  double progress = std::clamp(double(step - warmup_steps - 1) / double(decay_steps), 0.0, 1.0);
  double min_lr = lr * min_lr_ratio;
  if (kind == Kind::linear) return min_lr + (lr - min_lr) * (1.0 - progress);
  const double pi = 3.14159265358979323846;
  return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(pi * progress));
}

const char* LrSchedule::kind_name(Kind k) {
  switch (k) {
    case Kind::constant: return "constant";
    case Kind::cosine: return "cosine";
    case Kind::linear: return "linear";
  }
  return "?";
}

LrSchedule::Kind LrSchedule::parse_kind(const std::string& s) {
  if (s == "constant") return Kind::constant;
  if (s == "cosine") return Kind::cosine;
  if (s == "linear") return Kind::linear;
  SF_FAIL(input, "--lr-schedule \"", s, "\" is unknown; use constant, cosine or linear");
}

}  // namespace sf
