// Helpers for the trainer tests: a tiny model directory and token file on disk, options for a
// fast host run, bitwise comparison of checkpoint tensors, running the CLI binary.
#pragma once
#include <gtest/gtest.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "data/token_file.h"
#include "data_pipeline/dataset_test_util.h"  // make_tokens
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "model/model_init.h"
#include "test_util.h"
#include "train/model_dir.h"
#include "train/trainer.h"

extern char** environ;

namespace sf::test {

namespace fs = std::filesystem;

// A qwen3 model of tiny_config shape (vocab 53, hidden 32, 2 layers), random weights.
inline fs::path make_tiny_model(const fs::path& dir, Arch arch = Arch::qwen3, uint64_t seed = 7) {
  ModelConfig cfg = tiny_config(arch);
  ModelLayout layout = ModelLayout::build(cfg);
  auto params = init_params(layout, seed);
  std::vector<const float*> w;
  for (auto& p : params) w.push_back(p.data());
  SaveModelOptions so;
  so.dtype = DType::f32;
  save_model_dir(dir, cfg, layout, w, so);
  return dir;
}

// A run small enough for a few milliseconds per step on the host backend that still
// exercises gradient accumulation, warmup + cosine decay, clipping, weight decay,
// evaluation and an epoch wrap within 6 steps.
inline TrainOptions tiny_run(const fs::path& model, const fs::path& tokens, const fs::path& out) {
  TrainOptions o;
  o.model_dir = model;
  o.tokens_file = tokens;
  o.out_dir = out;
  o.steps = 6;
  o.batch_size = 2;
  o.seq_len = 16;
  o.grad_accum = 2;
  o.schedule.lr = 1e-2;
  o.schedule.warmup_steps = 2;
  o.schedule.kind = LrSchedule::Kind::cosine;
  o.schedule.min_lr_ratio = 0.1;
  o.hyper.weight_decay = 0.1f;
  o.hyper.max_grad_norm = 1.0f;
  o.eval_fraction = 0.1;
  o.eval_every = 2;
  o.eval_batches = 2;
  o.backend = "host";
  o.progress = TrainOptions::Progress::quiet;
  return o;
}

inline std::string file_bytes(const fs::path& p) { return read_file(p); }

// Every tensor of the two safetensors files is bitwise equal (names, shapes, bytes).
inline void expect_same_tensors(const fs::path& a, const fs::path& b) {
  SafetensorsFile fa(a), fb(b);
  ASSERT_EQ(fa.tensors().size(), fb.tensors().size()) << a << " vs " << b;
  for (auto& t : fa.tensors()) {
    const TensorInfo* u = fb.find(t.name);
    ASSERT_NE(u, nullptr) << t.name << " missing from " << b;
    ASSERT_EQ(t.bytes(), u->bytes()) << t.name;
    EXPECT_EQ(0, std::memcmp(fa.view().raw(t), fb.view().raw(*u), t.bytes()))
        << "tensor " << t.name << " differs between " << a << " and " << b;
  }
}

// Runs training for `o` and stops after `stop_after` steps, through the trainer's stop hook
// (as Ctrl-C does).
inline TrainResult run_stopping(TrainOptions o, int64_t stop_after) {
  auto flag = std::make_shared<bool>(false);
  o.fault = [flag, stop_after](std::string_view p) {
    if (p == "step:" + std::to_string(stop_after)) *flag = true;
  };
  o.stop_requested = [flag] { return *flag; };
  std::ostringstream log;
  return run_training(o, log);
}

struct CliResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
  std::string output;  // stdout and stderr together
};

inline fs::path cli_binary() { return fs::path(SF_BINARY_DIR) / "bin" / "slideformer"; }

// Runs the slideformer binary with `args`, extra environment `env` ("K=V"), output captured.
inline CliResult run_cli(const std::vector<std::string>& args,
                         const std::vector<std::string>& env = {}) {
  CliResult r;
  static int counter = 0;
  const fs::path log = fs::temp_directory_path() /
                       ("sf-cli-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::vector<std::string> argv_s = {cli_binary().string()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s = env;
  for (char** e = environ; *e; ++e) env_s.push_back(*e);
  std::vector<char*> envp;
  for (auto& s : env_s) envp.push_back(s.data());
  envp.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    r.output = "posix_spawn failed: " + std::string(std::strerror(rc));
    return r;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  std::ifstream f(log);
  std::stringstream ss;
  ss << f.rdbuf();
  r.output = ss.str();
  std::error_code ec;
  fs::remove(log, ec);
  return r;
}

}  // namespace sf::test
