// Learning-rate schedules, step for step those of transformers' Trainer / TRL
// (get_constant_schedule_with_warmup, get_linear_schedule_with_warmup,
// get_cosine_schedule_with_warmup, get_cosine_with_min_lr_schedule_with_warmup): optimizer
// step s (1-based) runs at lr * lambda(s - 1), with k = s - 1 and W = warmup_steps,
// N = total_steps:
//   warmup   k < W: k / W          (step 1 runs at lr 0, step W + 1 is the first at the peak)
//   constant k >= W: 1
//   linear   k >= W: f = max(0, (N - k) / max(1, N - W))
//   cosine   k >= W: f = 0.5 * (1 + cos(pi * (k - W) / max(1, N - W)))
// and for linear and cosine lambda = f * (1 - min_lr_ratio) + min_lr_ratio (transformers'
// min_lr_rate; linear-to-a-minimum is our extension, the same formula). The decay reaches its
// minimum at k = N, one past the last step, so step N still learns. Steps beyond N stay at the
// minimum (transformers' cosine would rise again there; a run never gets that far).
// tests/data/lr_schedule/vectors.json holds transformers' values (scripts/gen_lr_schedule_vectors.py).
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

  // The lr of 1-based optimizer step `step` (>= 1): a pure function of the step, so a resumed
  // run continues the same sequence.
  double at(int64_t step) const;
  static Kind parse_kind(const std::string& s);  // "constant" | "cosine" | "linear"
  static const char* kind_name(Kind k);
};

}  // namespace sf
