// LrSchedule::at: transformers' schedules, step for step (the formulas are in lr_schedule.h).
#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace sf {

double LrSchedule::at(int64_t step) const {
  SF_REQUIRE(step >= 1, "LrSchedule::at: optimizer steps are 1-based, got step ", step);
  // transformers' LambdaLR evaluates its lambda at k = 0 for the first optimizer step. Each
  // expression keeps transformers' order of operations, so the values agree to the last bit.
  const int64_t k = step - 1;
  if (k < warmup_steps) return lr * (double(k) / double(warmup_steps));
  if (kind == Kind::constant) return lr;
  const double span = double(std::max<int64_t>(1, total_steps - warmup_steps));
  double f;
  if (kind == Kind::linear) {
    f = std::max(0.0, double(total_steps - k) / span);
  } else {
    const double pi = 3.14159265358979323846;
    const double progress = std::min(1.0, double(k - warmup_steps) / span);  // hold the minimum
    f = 0.5 * (1.0 + std::cos(pi * progress));
  }
  return lr * std::max(0.0, f * (1.0 - min_lr_ratio) + min_lr_ratio);
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
