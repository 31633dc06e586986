// The training loop: data, learning-rate schedule, step execution, logging, evaluation and
// saving. Execution strategy (resident or sliding window) and backend are chosen here from
// the options; everything below is the library's.
#pragma once
#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <string>
#include <vector>

#include "engine/step_executor.h"
#include "train/lr_schedule.h"

namespace sf {

struct TrainOptions {
  std::filesystem::path model_dir;    // HF model directory; empty: the bundled example
  std::string example_size = "tiny";  // preset randomly initialised for the bundled example
  std::filesystem::path tokens_file;  // uint32 token stream; empty with no model: bundled
  std::filesystem::path out_dir = "slideformer-out";
  std::filesystem::path examples_dir;  // where the bundled example lives

  int64_t steps = 200;
  int batch_size = 8;   // sequences per micro-batch
  int seq_len = 256;
  int grad_accum = 1;   // micro-batches per optimizer step
  LrSchedule schedule;
  OptimHyper hyper;
  uint64_t seed = 1234;
  double eval_fraction = 0.05;  // tail of the token stream held out for evaluation
  int64_t eval_every = 0;       // steps; 0: only at the end
  int eval_batches = 4;
  std::string backend = "auto";  // auto | host | cuda
  std::string engine = "auto";   // auto | resident | sliding (the planner decides on auto)
  std::string gpu_memory;        // budget, e.g. "24GiB"; empty: the device's free memory
  std::string host_memory;       // budget; empty: available RAM minus a margin
  DType save_dtype = DType::bf16;
  bool quiet = false;
};

struct TrainResult {
  std::vector<double> losses;       // training loss per step
  std::vector<double> eval_losses;  // at each evaluation
  double tokens_per_second = 0;
};

TrainResult run_training(const TrainOptions& opt, std::ostream& log);

}  // namespace sf
