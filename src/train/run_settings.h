// The options a checkpoint records (trainer_state.json "settings") and how a resumed run takes
// them back. Five kinds, each a table in run_settings.cpp:
//   fixed settings  shape the computation of a step (batch, AdamW, seed, split): always
//                   taken from the checkpoint; giving another value is an error
//   schedule        the learning-rate schedule (lr, kind, warmup, minimum) and the run's
//                   length (--steps / --epochs): taken from the checkpoint unless given again;
//                   a new value is allowed with a warning naming both values, and recorded
//   state format    how the training state is stored (--optimizer-state, --master-weights):
//                   taken from the checkpoint unless given again; a new value converts the
//                   checkpoint's state as it loads, with a note, and is recorded
//   data settings   how the data file is read: taken from the checkpoint unless given again;
//                   compared through the data identity, not here
//   run settings    how the run is carried out (cadence, budgets, backend): taken from the
//                   checkpoint unless given again, then the new value wins
#pragma once
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/train_options.h"

namespace sf {

// Every recorded setting of `o`, keyed by its flag name without "--".
nlohmann::json settings_json(const TrainOptions& o);

// The options a run resumed from the checkpoint `ckpt` uses: the checkpoint's settings
// `saved` except those named in opt.explicit_options. Error(input) naming the flag when a
// given fixed setting differs, or naming the file when a fixed setting is missing; `notes`
// receives what the user should know (a changed schedule or length); `schedule_changes` the
// schedule settings given with a new value, {flag: {"from": saved, "to": given}} ({}: none).
TrainOptions settings_for_resume(const TrainOptions& opt, const nlohmann::json& saved,
                                 const std::filesystem::path& ckpt,
                                 std::vector<std::string>& notes,
                                 nlohmann::json& schedule_changes);

}  // namespace sf
