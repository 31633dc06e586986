// trainer_state.json, the part of a checkpoint that is not tensors: where the run stands
// (step, optimizer step, tokens seen, time, RNG state, data stream position), the schedule,
// the settings (train/run_settings.h), the schedule changes made on resume, the model's shape
// and the metrics history so far.
// Written whole with every checkpoint (trainer_state_json); read back once when a run resumes
// (ResumePoint), and found from a --resume argument (resolve_resume).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/model_config.h"
#include "model/param_layout.h"
#include "optim/state_format.h"
#include "train/train_options.h"

namespace sf {

inline constexpr int kTrainerStateVersion = 1;

// SplitMix64: the trainer's RNG. Nothing in a step draws from it today; it advances once per
// step so that a stochastic feature added later (dropout, sampling) resumes exactly too.
struct TrainerRng {
  uint64_t state = 0;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

// ParamStore::rounding_seed of a run with this --seed (the bf16 master's stochastic rounding
// stream; mixed, so it is not the data order's seed).
uint64_t state_rounding_seed(uint64_t run_seed);

// Where a run stands after `step` steps.
struct RunPosition {
  int64_t step = 0;
  int64_t optimizer_step = 0;   // ParamStore::step (AdamW's bias correction)
  int64_t tokens_seen = 0;      // over the whole run, resumed sessions included
  double elapsed_seconds = 0;   // likewise
  uint64_t rng_state = 0;
  StateFormat state_format;     // ParamStore::format() (as the resume files hold it)
  uint64_t rounding_seed = 0;   // ParamStore::rounding_seed
};

// The model's shape as a checkpoint records it (compared on resume by model_mismatch).
nlohmann::json model_json(const ModelConfig& c, const ModelLayout& layout);
// Empty when `now` (model_json of the model at hand) matches the checkpoint's `saved`; else
// a sentence naming the first field that differs.
std::string model_mismatch(const nlohmann::json& saved, const nlohmann::json& now);

// The whole trainer_state.json of a checkpoint at `at`. `schedule_changes`: an array of
// {"step": resumed at, "changes": {flag: {"from", "to"}}}, one per resume that changed the
// learning-rate schedule or the run's length, oldest first.
nlohmann::json trainer_state_json(const RunPosition& at, const TrainOptions& opt,
                                  const nlohmann::json& data_identity,
                                  const nlohmann::json& data_state, const nlohmann::json& model,
                                  const nlohmann::json& schedule_changes,
                                  const std::vector<nlohmann::json>& metrics);

// The checkpoint a run resumes from. Fields are read when asked for, so that a damaged
// state fails where it is used.
class ResumePoint {
 public:
  // dir/trainer_state.json; Error(input) naming the file unless it is a slideformer trainer
  // state of kTrainerStateVersion.
  static ResumePoint read(const std::filesystem::path& dir);

  const std::filesystem::path& dir() const { return dir_; }
  const nlohmann::json& settings() const { return state_.at("settings"); }
  const nlohmann::json& model() const { return state_.at("model"); }
  const nlohmann::json& data_identity() const { return state_.at("data").at("identity"); }
  const nlohmann::json& data_state() const { return state_.at("data").at("state"); }
  int64_t step() const;
  int64_t optimizer_step() const;
  uint64_t rng_state() const;
  double elapsed_seconds() const;  // 0 when not recorded
  int64_t tokens_seen() const;     // 0 when not recorded
  // ParamStore::rounding_seed; state_rounding_seed of the run's seed when not recorded (a
  // checkpoint before compact formats: its master was fp32, nothing was rounded).
  uint64_t rounding_seed() const;
  std::vector<nlohmann::json> metrics() const;
  nlohmann::json schedule_changes() const;  // [] when none (or not recorded)

 private:
  std::filesystem::path dir_;
  nlohmann::json state_;
};

// The checkpoint directory --resume `arg` names: "auto" is out's latest (empty path when out
// has none), else a checkpoint directory or an output directory holding one (Error(input)
// when it is neither). `note` receives why <out>/latest was not used, if it was not.
std::filesystem::path resolve_resume(const std::string& arg, const std::filesystem::path& out,
                                     std::string* note);

}  // namespace sf
