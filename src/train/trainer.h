// The training loop: data (data/data_source.h), learning-rate schedule, step execution,
// evaluation, progress display, metrics log (<out>/metrics.jsonl, one JSON object per step,
// rewritten from the checkpoint on resume, then appended), loss plot (<out>/loss.png),
// checkpoints (train/checkpoint.h) every save_every steps, at the end and when a stop is
// requested, and exact resume from a checkpoint.
//
// Exact resume: a run resumed from checkpoint-k computes the same losses and ends with the
// same weights (bit for bit, for a deterministic backend such as host) as the uninterrupted
// run, because the checkpoint holds everything a step depends on: fp32 master weights, AdamW
// m and v and step count, the data stream position, the RNG state, the schedule and every
// setting that shapes the computation. Settings recorded in the checkpoint win over the
// options unless an option is named in `explicit_options` (the user set it), in which case a
// different value is an error naming the flag; --steps may change (it re-shapes the schedule).
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "train/train_options.h"

namespace sf {

TrainResult run_training(const TrainOptions& opt, std::ostream& log);

}  // namespace sf
