// The training loop: data (data/data_source.h), learning-rate schedule, step execution,
// evaluation, progress display, metrics log (train/metrics_log.h: <out>/metrics.jsonl, one
// JSON object per step, with metrics.csv and TensorBoard event files beside it, rewritten from
// the checkpoint on resume, then appended; the loss plot <out>/loss.png), checkpoints (train/checkpointer.h) every save_every steps, at the end and
// when a stop is requested, and exact resume from a checkpoint (train/trainer_state.h).
//
// Exact resume: a run resumed from checkpoint-k computes the same losses and ends with the
// same weights (bit for bit, for a deterministic backend such as host) as the uninterrupted
// run, because the checkpoint holds everything a step depends on: fp32 master weights, AdamW
// m and v and step count, the data stream position, the RNG state, the schedule and every
// setting that shapes the computation. Settings recorded in the checkpoint win over the
// options unless an option is named in `explicit_options` (the user set it), in which case a
// different value is an error naming the flag, except the learning-rate schedule and the
// run's length (--steps / --epochs), which may change with a warning and are recorded
// (train/run_settings.h). A diverged step (non-finite loss, gradient norm 0) ends the run with
// Error(input) before anything is saved.
//
// Data parallel (TrainOptions::comm set: one rank of N, docs/MULTI_GPU.md): every rank runs
// this loop over rows rank, rank + N, ... of each global batch, with one training state in
// shared memory (SharedTrainingState). Rank 0 alone locks and writes the output directory
// (metrics, plot, checkpoints, the model), evaluates and initialises or loads the state; the
// others only train. The stop request is decided together after each step, so every rank stops
// after the same one.
#pragma once
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/data_source.h"
#include "engine/executor_factory.h"
#include "engine/step_executor.h"
#include "io/model_config.h"
#include "model/param_layout.h"
#include "report/progress.h"
#include "train/checkpoint.h"
#include "train/checkpointer.h"
#include "train/metrics_log.h"
#include "train/train_options.h"
#include "train/trainer_state.h"

namespace sf {

// Trains as `opt` says, writing into opt.out_dir; progress and messages go to `log`.
// Error(input) for bad options, data or checkpoints, Error(io) when a write fails.
TrainResult run_training(const TrainOptions& opt, std::ostream& log);

// Where a run's model, tokenizer and training data come from: the bundled example (a preset
// randomly initialised, the bundled token file) or a Hugging Face model directory.
struct ModelSource {
  ModelConfig config;
  std::filesystem::path weights_dir;    // empty: random init
  std::filesystem::path tokenizer_dir;  // copied next to saved weights
  std::filesystem::path tokens;
};
ModelSource resolve_model_source(const TrainOptions& opt);
// The data request a run makes for its options and model (what the training batches come from).
DataRequest data_request(const TrainOptions& opt, const ModelSource& src);

// One training run from start to end; run_training is Trainer(opt, log).run().
class Trainer {
 public:
  // Checks the options, creates and locks opt.out_dir (for the trainer's lifetime) and settles
  // where the run starts: the checkpoint opt.resume names (whose settings then apply) or a
  // fresh start (refused when out_dir holds an earlier run's checkpoints, unless overwrite).
  Trainer(const TrainOptions& opt, std::ostream& log);
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Loads the model and data, trains up to opt.steps or until a stop is requested, saves.
  TrainResult run();

 private:
  // Why a checkpoint is written (printed with it).
  enum class SaveReason { periodic, stopped, final };
  // What one optimizer step did, for its metrics record and the progress line.
  struct StepReport {
    StepStats stats;
    double lr = 0;
    double seconds = 0;  // wall time of the step
    double flops = 0;    // model FLOPs of the step
  };

  TrainResult run_steps();  // run() less the data-parallel error handling
  // ---- start and set-up, in this order
  void resolve_start(const TrainOptions& requested);
  bool already_done();  // the run's length is reached (said so); sets result_.total_steps
  void set_up();
  void load_model();
  void open_data();
  void build_executor();
  void restore_run_position();
  void open_logs();
  void announce();
  void announce_schedule();
  // ---- the loop
  bool primary() const { return opt_.rank() == 0; }  // rank 0 (or the only one)
  bool stop_requested() const;
  Batch next_rows();  // this rank's rows of the next global batch
  void evaluate_at_start();
  void one_step();
  StepReport train_step();
  nlohmann::json step_record(const StepReport& r) const;
  std::string divergence(const StepReport& r) const;
  void warn_if_not_finite(const StepReport& r);
  double evaluate_if_due(nlohmann::json& record);
  double evaluate();
  void show_progress(const StepReport& r);
  // ---- logs, checkpoints and the end
  void record(const nlohmann::json& m);
  void save(SaveReason why);
  CheckpointContents checkpoint_contents();
  void refresh_plot();
  TrainResult finish();
  // Error(io) for a failed write: `what`, what survives on disk, and how to go on.
  [[noreturn]] void fail_io(const std::string& what);
  void say(const std::string& line) { progress_.message(line); }
  const ModelConfig& cfg() const { return src_.config; }
  double session_seconds() const;

  // Declared in the order they are needed; destroyed in reverse, the lock last.
  std::filesystem::path out_;
  std::optional<OutDirLock> lock_;  // rank 0 only
  ProgressDisplay progress_;
  TrainOptions opt_;                    // in force: the checkpoint's settings on resume
  std::optional<ResumePoint> resume_;   // empty: a fresh run
  std::vector<CheckpointRef> earlier_;  // fresh run: an earlier run's, deleted after set-up
  Checkpointer checkpointer_;
  TrainResult result_;
  nlohmann::json schedule_changes_ = nlohmann::json::array();  // trainer_state.json's

  ModelSource src_;
  ModelLayout layout_;
  nlohmann::json model_record_;  // model_json of the model, recorded in each checkpoint
  DataSource data_;
  PlannedRun planned_;
  std::unique_ptr<SharedTrainingState> shared_state_;  // data parallel: the ranks' one state
  DataParallel dp_;
  std::unique_ptr<StepExecutor> exec_;
  MetricsLog metrics_;

  TrainerRng rng_;
  int64_t rows_per_epoch_ = 0;       // training rows per pass (measured with --epochs)
  int64_t step_ = 0;                 // steps done (of the whole run)
  int64_t tokens_seen_ = 0;          // of the whole run
  double elapsed_before_ = 0;        // seconds of the run's earlier sessions
  std::chrono::steady_clock::time_point session_start_;
  int64_t session_tokens_ = 0;       // trained in this session
  double session_step_seconds_ = 0;  // of this session's steps alone
  std::vector<Batch> micro_;         // the micro-batches of the current step
};

}  // namespace sf
