// What a training run is asked to do (TrainOptions) and what it reports back (TrainResult),
// and the check of the options' values. Plain data: nothing here reads files or trains; the
// trainer (train/trainer.h) carries the options out, train/run_settings.h records them in a
// checkpoint and takes them back on resume.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "engine/step_executor.h"
#include "optim/state_format.h"
#include "train/checkpoint.h"
#include "train/lr_schedule.h"
#include "train/metrics_log.h"

namespace sf {

class Stream;

struct TrainOptions {
  // --- what is trained on what (recorded in checkpoints)
  std::filesystem::path model_dir;    // HF model directory; empty: the bundled example
  std::string example_size = "tiny";  // preset randomly initialised for the bundled example
  // Training data (--data / --tokens): a token file (llm.c .bin or raw uint32) or a dataset
  // (data/sample_set.h formats; tokenized with the model's tokenizer); a repeated --data is
  // held as its FILE[:WEIGHT] values joined by '\n' (data/data_source.h parse_data_inputs).
  // Empty with no model: the bundled token file.
  std::filesystem::path tokens_file;
  std::filesystem::path examples_dir;  // where the bundled example lives
  // How a JSONL dataset is read (data/data_source.h DataRequest); recorded in checkpoints and
  // taken from there on resume unless given. chat_date is recorded as rendered (today's date
  // when empty), so that a resumed run renders the same text.
  std::string data_format = "auto";  // auto or a data_format_names() entry (data/data_source.h)
  std::string chat_format = "auto";  // auto: the tokenizer's chat_template; or chatml, llama3, ...
  std::string chat_date;             // Llama 3.2+ "Today Date", e.g. "26 Jul 2024"
  std::string overflow = "auto";     // auto | truncate | split | drop
  bool skip_bad_lines = false;
  std::filesystem::path eval_file;   // separate evaluation data instead of eval_fraction

  // --- how (recorded in checkpoints)
  int64_t steps = 200;
  // Passes over the training data (HF num_train_epochs; fractions allowed); 0: train `steps`
  // steps. When positive, the trainer derives `steps` from the data once it is open
  // (epoch_steps); --steps and --epochs are exclusive.
  double epochs = 0;
  int batch_size = 8;   // sequences per micro-batch
  int seq_len = 256;
  int grad_accum = 1;   // micro-batches per optimizer step
  LrSchedule schedule;  // total_steps is always taken from `steps`
  // Warmup as a share of the run (HF warmup_ratio), in [0, 1); 0: schedule.warmup_steps. When
  // positive, warmup_steps = ceil(warmup_ratio * steps), as transformers computes it; it is
  // exclusive with --warmup-steps.
  double warmup_ratio = 0;
  OptimHyper hyper;     // lr is the schedule's
  uint64_t seed = 1234;
  bool shuffle = true;          // training rows in a seeded order, reshuffled every epoch
  // Every run of the same settings gives the same bits on the GPU too (ExecutorRequest::
  // deterministic): slower attention backwards from 2K tokens per sequence on Hopper.
  bool deterministic = false;
  // How the host training state is stored (--optimizer-state, --master-weights; fp32 both by
  // default). On resume the checkpoint's unless given; another one converts the checkpoint's
  // state with a note (train/run_settings.h).
  StateFormat state_format;
  double eval_fraction = 0.05;  // share held out for evaluation (token file: the tail)
  int eval_batches = 4;         // held-out batches per evaluation (batch_size rows each)

  // --- where and how often (free to change on resume)
  std::filesystem::path out_dir = "slideformer-out";
  int64_t eval_every = 0;       // steps; 0: only at the end
  int64_t save_every = 0;       // steps; 0: only at the end (and when stopped)
  int keep_checkpoints = 0;     // keep the newest K checkpoints; 0: keep all
  std::string resume;           // "": fresh run; "auto": <out>'s latest if any; or a path
  bool overwrite = false;       // a fresh run may replace an earlier run's checkpoints in out_dir
  int64_t log_every = 10;       // plain-log lines (not on a terminal)
  std::string backend = "auto";  // auto | host | cuda
  std::string engine = "auto";   // auto | resident | sliding (the planner decides on auto)
  std::string device_adamw_layers = "auto";  // sliding window: the first layers' AdamW on the GPU
  std::string checkpoint_every = "auto";     // sliding window: every how many layers' inputs are saved
  std::string gpu_memory;        // budget, e.g. "24GiB"; empty: the device's free memory
  std::string host_memory;       // budget; empty: available RAM minus a margin
  std::string optimizer_dir;     // AdamW moments on this disk when RAM is short; empty: none
  std::optional<DType> save_dtype;  // of the saved HF weights; empty: the model's torch_dtype
  TensorBoardLog tensorboard = TensorBoardLog::on;  // <out>/tensorboard/ event files
  enum class Progress { bar, lines, quiet } progress = Progress::lines;
  int columns = 0;  // terminal width for the bar (0: 100)

  // --- data parallel (docs/MULTI_GPU.md; not recorded: a run may resume with another N)
  int gpus = 1;              // --gpus N: ranks of this run (the CLI starts them); 1: one process
  int dist_timeout_s = 600;  // --dist-timeout: the longest a rank waits for the others
  // Set in each rank of a data-parallel run (not flags): its communicator (null: one rank) and
  // the run id every rank has (names of the shared memory). --batch-size stays the GLOBAL
  // batch: each rank trains on rows rank, rank + N, ... of each one.
  dist::Communicator* comm = nullptr;
  std::string run_id;
  // GPU ranks (NCCL): the device form of the gradients' reduce-scatter (DataParallel's).
  std::function<void(float* data, size_t shard, Stream& stream)> device_reduce_scatter;
  int rank() const { return comm ? comm->rank() : 0; }
  int world() const { return comm ? comm->world_size() : 1; }

  // Names of options the user set (flag names without "--", e.g. "lr", "batch-size").
  std::set<std::string> explicit_options;
  // Polled before and after every step: true stops the run after a checkpoint.
  std::function<bool()> stop_requested;
  FaultHook fault;  // tests: called at named points (checkpoint saves, "step:<n>")
};

struct TrainResult {
  int64_t start_step = 0;           // the step resumed from (0: a fresh run)
  int64_t end_step = 0;             // the last step done
  int64_t total_steps = 0;          // the run's --steps (derived from --epochs where given)
  std::vector<double> losses;       // training loss of steps start_step+1 .. end_step
  std::vector<int64_t> eval_steps;  // evaluations of this invocation
  std::vector<double> eval_losses;
  double tokens_per_second = 0;
  bool stopped = false;             // stop_requested ended the run early
  std::filesystem::path checkpoint;  // the run's newest checkpoint: written, else resumed from
};

// Checks the options; Error(input) naming the flag and what to pass instead. Checks that need
// the step count (warmup within the run) wait for resolve_step_count when epochs are given.
void validate_train_options(const TrainOptions& opt);

// Optimizer steps that cover `epochs` passes over `rows_per_epoch` training rows, each step
// taking batch_size x grad_accum rows: ceil(epochs x rows / rows per step), at least 1.
int64_t epoch_steps(double epochs, int64_t rows_per_epoch, int batch_size, int grad_accum);

// Settles the step count and the warmup: `steps` from `epochs` (when positive) and
// `rows_per_epoch`, schedule.total_steps = steps, schedule.warmup_steps from warmup_ratio (when
// positive); then checks that the warmup fits in the run. Error(input) naming the flags.
void resolve_step_count(TrainOptions& opt, int64_t rows_per_epoch);

// Peak learning rates above this are suspicious for full fine-tuning of a pretrained model
// (the usual ones are 1e-5 to 5e-5; LoRA's 1e-4 to 3e-4): the trainer warns.
inline constexpr double kSuspiciousFullFineTuneLr = 1e-3;

}  // namespace sf
