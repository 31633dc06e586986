// Helpers shared by the subcommands.
#pragma once
#include <filesystem>
#include <string>

#include <CLI/CLI.hpp>

#include "core/dtype.h"
#include "engine/executor_factory.h"

namespace sf::cli {

// Where the bundled example lives: the source tree this binary was built from, or an
// "examples" directory beside the binary or above it. Error(input) when neither exists.
std::filesystem::path examples_dir();
// --dtype values: bf16 (bfloat16), f16 (float16), f32 (float32).
DType parse_save_dtype(const std::string& s);

// --optimizer-state and --master-weights as a StateFormat; Error(input) naming the flag and
// the accepted values for anything else.
StateFormat parse_state_format(const std::string& optimizer_state, const std::string& master_weights);
// Their help texts (train, bench and plan say the same).
extern const char* const kOptimizerStateHelp;
extern const char* const kMasterWeightsHelp;
extern const char* const kCheckpointEveryHelp;

// "backend    host (auto: no CUDA device found)\n" plus the plan's note line, if any.
std::string backend_lines(const PlannedRun& r);

// The batch shape and execution flags shared by plan, bench and eval. resolve() turns them
// into req.step.
struct RunFlags {
  int batch_size = 8, seq_len = 1024, grad_accum = 1;
  std::string optimizer_state = "fp32", master_weights = "fp32";
  ExecutorRequest req;
  void add_to(CLI::App* cmd, bool with_accum = true);
  // --optimizer-state and --master-weights (bench and plan; eval trains nothing).
  void add_state_format_to(CLI::App* cmd);
  // --deterministic (bench and plan; eval and generate run no backward).
  void add_deterministic_to(CLI::App* cmd);
  // --checkpoint-every (bench and plan: a training step's layer inputs).
  void add_checkpoint_every_to(CLI::App* cmd);
  void check() const;
  // Checks the values (sizes, --gpu-memory with --backend host, the state format), then sets
  // req.step.
  void resolve() {
    check();
    req.step.micro_tokens = int64_t(batch_size) * seq_len;
    req.step.grad_accum = grad_accum;
    req.step.max_seq_len = seq_len;
    req.step.state_format = parse_state_format(optimizer_state, master_weights);
  }
};

}  // namespace sf::cli
