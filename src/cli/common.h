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

// "backend    host (auto: no CUDA device found)\n" plus the plan's note line, if any.
std::string backend_lines(const PlannedRun& r);

// The batch shape and execution flags shared by plan, bench and eval. resolve() turns them
// into req.step.
struct RunFlags {
  int batch_size = 8, seq_len = 1024, grad_accum = 1;
  ExecutorRequest req;
  void add_to(CLI::App* cmd, bool with_accum = true);
  void check() const;
  // Checks the values (sizes, --gpu-memory with --backend host), then sets req.step.
  void resolve() {
    check();
    req.step.micro_tokens = int64_t(batch_size) * seq_len;
    req.step.grad_accum = grad_accum;
    req.step.max_seq_len = seq_len;
  }
};

}  // namespace sf::cli
