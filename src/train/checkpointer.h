// The trainer's checkpoint policy, on top of the atomic checkpoint writer (train/checkpoint.h):
// which checkpoint is the run's newest (the one that survives a failed write), up to which
// step the run is on disk, writing checkpoint-<step> and then keeping only the newest
// --keep-checkpoints. Also a fresh run's refusal to mix its checkpoints with an earlier run's.
// Owns no files beyond what save_checkpoint and prune_checkpoints write and delete.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "train/checkpoint.h"

namespace sf {

class Checkpointer {
 public:
  Checkpointer() = default;
  // Checkpoints go to `out`; `keep` <= 0 keeps all. `resumed_from`: the checkpoint the run
  // resumed from, whose step `start_step` is already on disk (empty: a fresh run, step 0).
  Checkpointer(std::filesystem::path out, int keep, FaultHook fault,
               std::filesystem::path resumed_from, int64_t start_step);

  // The run's newest checkpoint: written, else resumed from (empty: none yet).
  const std::filesystem::path& newest() const { return newest_; }
  // Whether a checkpoint holds the run at `step` (or later).
  bool on_disk(int64_t step) const { return step <= last_saved_; }
  // For error messages: what is left on disk when a write fails now.
  std::string what_survives() const;

  // Writes <out>/checkpoint-<step> and points <out>/latest at it, then it is newest(); a
  // failed write throws save_checkpoint's Error(io) and leaves newest() as it was.
  void write(int64_t step, const CheckpointContents& c);
  // Deletes all but the newest `keep` checkpoints, never newest().
  void rotate() const;

 private:
  std::filesystem::path out_;
  int keep_ = 0;
  FaultHook fault_;
  std::filesystem::path newest_;
  int64_t last_saved_ = 0;
};

// A fresh run in `out`: the checkpoints an earlier run left there, oldest first. Error(input)
// when there are any and `overwrite` is false (the run must not mix with them).
std::vector<CheckpointRef> earlier_run_checkpoints(const std::filesystem::path& out,
                                                   bool overwrite);

}  // namespace sf
