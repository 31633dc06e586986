// Checkpointer (see checkpointer.h): bookkeeping around save_checkpoint / prune_checkpoints.
#include "train/checkpointer.h"

#include <utility>

#include "core/error.h"

namespace sf {

namespace fs = std::filesystem;

Checkpointer::Checkpointer(fs::path out, int keep, FaultHook fault, fs::path resumed_from,
                           int64_t start_step)
    : out_(std::move(out)),
      keep_(keep),
      fault_(std::move(fault)),
      newest_(std::move(resumed_from)),
      last_saved_(start_step) {}

std::string Checkpointer::what_survives() const {
  return newest_.empty() ? std::string("no checkpoint was saved yet")
                         : "the previous checkpoint " + newest_.string() + " is intact";
}

void Checkpointer::write(int64_t step, const CheckpointContents& c) {
  newest_ = save_checkpoint(out_, step, c, fault_);
  last_saved_ = step;
}

void Checkpointer::rotate() const { prune_checkpoints(out_, keep_, newest_); }

std::vector<CheckpointRef> earlier_run_checkpoints(const fs::path& out, bool overwrite) {
  std::vector<CheckpointRef> earlier = list_checkpoints(out);
  SF_REQUIRE(earlier.empty() || overwrite, out.string(),
             " holds checkpoints of an earlier run (newest: ",
             earlier.empty() ? std::string() : earlier.back().dir.filename().string(),
             "); pass --resume to continue it, --overwrite to delete them and start again, or "
             "another --out");
  return earlier;
}

}  // namespace sf
