// Training checkpoints: <out>/checkpoint-<step>/ holds
//   config.json, model*.safetensors (+ index), tokenizer files,  a Hugging Face model directory
//   generation_config.json, README.md (train/model_card.h)
//   resume/master.safetensors                                    master weights (fp32 or bf16)
//   resume/adam_m.safetensors, resume/adam_v.safetensors         AdamW moments (fp32, bf16 or
//                                                                int8 codes + scales)
//   trainer_state.json                                           step, RNG, data position,
//                                                                schedule, settings, metrics
// The resume files hold the ParamStore's buffers per layout unit ("embedding", "layers.<i>",
// "head") in its state format, exactly as stored (train/resume_state.h), so a resume is
// bit-exact in every format. The HF weights are written from the master: a bf16 master
// saved as bf16 (the usual model dtype) bit for bit.
//
// A checkpoint is written whole into "checkpoint-<step>.tmp.<pid>", every file fsynced, then
// renamed into place; only then is <out>/latest (one line: the directory name) replaced
// atomically. A process killed at any moment leaves every earlier checkpoint intact; a
// failed write (full disk) removes the temporary and throws Error(io). Readers trust a
// "checkpoint-<step>" directory only when its trainer_state.json parses.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "optim/param_store.h"
#include "io/model_config.h"
#include "model/param_layout.h"
#include "train/model_dir.h"
#include "train/resume_state.h"  // load_resume_tensors

namespace sf {

// Called at named points: "checkpoint:model-written:<step>", "checkpoint:before-rename:<step>",
// "checkpoint:before-latest:<step>" during a save, "step:<n>" after each training step. Tests
// use it to simulate a crash, a signal or a failed write there.
using FaultHook = std::function<void(std::string_view point)>;

struct CheckpointContents {
  const ModelConfig* config = nullptr;
  const ModelLayout* layout = nullptr;
  const ParamStore* store = nullptr;
  nlohmann::json trainer_state;  // written as trainer_state.json
  SaveModelOptions model;        // dtype of the HF weights, shard size, tokenizer source
};

std::filesystem::path checkpoint_path(const std::filesystem::path& out, int64_t step);

// Writes <out>/checkpoint-<step> and points <out>/latest at it. Returns the directory.
std::filesystem::path save_checkpoint(const std::filesystem::path& out, int64_t step,
                                      const CheckpointContents& c, const FaultHook& fault = {});

struct CheckpointRef {
  std::filesystem::path dir;
  int64_t step = 0;
};
// Complete checkpoints under `out` (a directory named checkpoint-<step> with a parseable
// trainer_state.json), oldest first. Temporaries of interrupted saves are never listed.
std::vector<CheckpointRef> list_checkpoints(const std::filesystem::path& out);
// The checkpoint <out>/latest names when it is complete, else the newest complete one;
// nullopt when there is none. `note` (optional) receives why latest was not used.
std::optional<CheckpointRef> find_latest_checkpoint(const std::filesystem::path& out,
                                                    std::string* note = nullptr);
// Deletes all but the newest `keep` complete checkpoints (keep <= 0: none), never the one
// named `protect`. Each is renamed aside before removal so that a half-deleted directory
// is never mistaken for a checkpoint.
void prune_checkpoints(const std::filesystem::path& out, int keep,
                       const std::filesystem::path& protect);
// Removes leftovers of interrupted saves/prunes (checkpoint-*.tmp.*, *.old.*, *.deleting.*).
// Call only while holding the output directory's lock.
void remove_checkpoint_temporaries(const std::filesystem::path& out);

// trainer_state.json of a checkpoint directory; Error(input) naming the file when missing
// or malformed.
nlohmann::json read_trainer_state(const std::filesystem::path& dir);

// An exclusive lock on <out>/.lock (flock), held for the object's lifetime, so that two runs
// never write into one output directory. Throws Error(input) when another process holds it.
class OutDirLock {
 public:
  explicit OutDirLock(const std::filesystem::path& out);
  ~OutDirLock();
  OutDirLock(const OutDirLock&) = delete;
  OutDirLock& operator=(const OutDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace sf
