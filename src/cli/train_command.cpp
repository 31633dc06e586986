// slideformer train: flags and a config file -> TrainOptions -> run_training, with SIGINT /
// SIGTERM turned into "finish the step, save a checkpoint, exit" (a second one exits at once).
//
// Config file (cli/config_file.h): `--config run.toml` or `--config run.yaml`, keys are the
// long flag names; flags given on the command line win over the file. `--print-config` prints
// the effective settings in TOML form and exits.
//
// Data parallel (docs/MULTI_GPU.md, "Launch"): `--gpus N` starts N ranks of this same command
// (dist::launch_ranks, which sets WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and
// waits for them: the first that fails stops the others, and its rank and exit are the
// launcher's error. A process that finds those variables set (ours, or torchrun's) is one rank:
// rank 0 makes the run id and the communicator's shared memory and sends the id to the others
// over the TCP bootstrap. On the host backend the ranks talk through a ShmCommunicator. Rank 0
// alone prints; every rank's error is prefixed "rank r: ".
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <span>
#include <cstring>
#include <functional>
#include <iomanip>
#include <iostream>
#include <set>
#include <sstream>
#include <vector>

#include "cli/commands.h"
#include "cli/config_file.h"
#include "cli/common.h"
#include "core/error.h"
#include "data/data_source.h"
#include "dist/env_launch.h"
#include "dist/rank_launcher.h"
#include "dist/shm_communicator.h"
#include "dist/tcp_bootstrap.h"
#if SF_DIST_CUDA
#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.h"
#include "dist/cuda/nccl_communicator.h"
#endif
#include "model/model_presets.h"
#include "report/progress.h"
#include "text/chat_template.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace sf::cli {

namespace {

// ---- signals ------------------------------------------------------------------------------

std::atomic<int> g_stop_signal{0};  // the first SIGINT/SIGTERM received (0: none)

void write_stderr(const char* s) {
  ssize_t r = ::write(STDERR_FILENO, s, std::strlen(s));
  (void)r;
}

extern "C" void on_stop_signal(int sig) {
  int expected = 0;
  if (g_stop_signal.compare_exchange_strong(expected, sig)) {
    write_stderr("\nslideformer: stopping after this step and saving a checkpoint "
                 "(press Ctrl-C again to quit at once)\n");
    return;
  }
  // Second signal: leave now. Checkpoints are renamed into place only when complete, so the
  // previous one stays intact; the temporary is removed by the next run.
  write_stderr("\nslideformer: quitting without saving; the previous checkpoint is intact\n");
  ::_exit(128 + sig);
}

// The launcher's stop (dist::kRankStopSignal): a stop request like the first Ctrl-C, but never
// the second one that quits at once (a rank that also got the SIGTERM itself still saves).
extern "C" void on_launcher_stop_signal(int sig) {
  int expected = 0;
  if (g_stop_signal.compare_exchange_strong(expected, sig))
    write_stderr("\nslideformer: the launcher stopped; stopping after this step and saving a checkpoint\n");
}

class StopSignals {
 public:
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;  // file writes of a checkpoint in progress continue
    ::sigaction(SIGINT, &sa, &old_int_);
    ::sigaction(SIGTERM, &sa, &old_term_);
    sa.sa_handler = on_launcher_stop_signal;
    ::sigaction(dist::kRankStopSignal, &sa, &old_launcher_);
  }
  ~StopSignals() {
    ::sigaction(SIGINT, &old_int_, nullptr);
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(dist::kRankStopSignal, &old_launcher_, nullptr);
  }

 private:
  struct sigaction old_int_ {}, old_term_ {}, old_launcher_ {};
};

// A rank of `--gpus N`: the stop comes when the launcher dies too (a kill -9 of it included),
// so that no rank trains on without it; one whose launcher is already gone stops now.
void stop_with_the_launcher() {
  const char* pid = std::getenv(dist::kLauncherPidVariable);
  if (pid == nullptr) return;  // not our launcher's (torchrun's, Slurm's: theirs to stop)
  ::prctl(PR_SET_PDEATHSIG, dist::kRankStopSignal);
  if (::getppid() != pid_t(std::atoll(pid))) ::raise(dist::kRankStopSignal);
}

// The tests' launcher faults: until the stop they cause has reached this rank, so that the
// ranks stop after this step however loaded the machine is (an event, not a time; the bound
// only keeps a broken launcher from hanging the test).
void wait_for_the_launchers_stop() {
  for (int i = 0; i < 6000 && g_stop_signal.load() == 0; ++i) ::usleep(10000);
}

// ---- test hooks (SF_TEST_FAULT) --------------------------------------------------------------
// Comma-separated "<action>@<point>": at hook point <point> (see train/checkpoint.h), action
// kill (SIGKILL: a crash), sigint / sigint2 (one or two Ctrl-C), sigterm, term-parent /
// kill-parent (SIGTERM / SIGKILL to this rank's launcher), or fail (a write error, as on a full
// disk). For the tests of tests/train; harmless when unset.
FaultHook fault_hook_from_env() {
  const char* env = std::getenv("SF_TEST_FAULT");
  if (!env || !*env) return {};
  std::vector<std::pair<std::string, std::string>> rules;
  std::stringstream ss(env);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto at = item.find('@');
    if (at != std::string::npos) rules.push_back({item.substr(0, at), item.substr(at + 1)});
  }
  return [rules](std::string_view point) {
    for (auto& [action, where] : rules) {
      if (where != point) continue;
      if (action == "kill") ::raise(SIGKILL);
      if (action == "sigint") ::raise(SIGINT);
      if (action == "sigint2") ::raise(SIGINT), ::raise(SIGINT);
      if (action == "sigterm") ::raise(SIGTERM);
      if (action == "term-parent" || action == "kill-parent") {  // a rank's launcher stopped / killed
        ::kill(::getppid(), action == "term-parent" ? SIGTERM : SIGKILL);
        wait_for_the_launchers_stop();
      }
      if (action == "sigbus") ::raise(SIGBUS);  // as a failing mapped file would
      if (action == "fail")
        SF_FAIL(io, "simulated write failure at ", point, " (No space left on device)");
    }
  };
}

// ---- data parallel --------------------------------------------------------------------------

// This process's command line, for the ranks: /proc/self/cmdline, the program as /proc/self/exe.
std::vector<std::string> self_argv() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> argv;
  for (std::string a; std::getline(f, a, '\0');) argv.push_back(a);
  SF_REQUIRE(!argv.empty(), "--gpus: cannot read this process's command line (/proc/self/cmdline)");
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) argv[0] = exe.string();
  return argv;
}

// The parent of `--gpus N`: the ranks run, this waits; a failed rank is the run's error. A
// Ctrl-C reaches the ranks too (one process group): they stop after the same step and rank 0
// saves, so the parent ignores it (the ranks set their own handlers) rather than die first.
void launch_the_ranks(int n) {
  dist::RankLaunch l;
  l.argv = self_argv();
  l.world_size = n;
  struct sigaction ignore {}, old_int {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  ::sigaction(SIGINT, &ignore, &old_int);
  dist::LaunchResult r;
  try {
    r = dist::launch_ranks(l);
  } catch (...) {
    ::sigaction(SIGINT, &old_int, nullptr);
    throw;
  }
  ::sigaction(SIGINT, &old_int, nullptr);
  if (r.failed_rank < 0 && r.stop_signal != 0) {
    std::cerr << "slideformer: --gpus " << n << ": " << r.message << "\n" << std::flush;
    throw CLI::RuntimeError(r.exit_code);
  }
  if (r.failed_rank < 0) return;
  std::cerr << "slideformer: error: --gpus " << n << ": " << r.message << "\n" << std::flush;
  throw CLI::RuntimeError(r.exit_code != 0 ? r.exit_code : 1);
}

// Per-rank bytes of the communicator's region: calls larger than this go in pieces.
constexpr size_t kCommCapacity = size_t(16) << 20;

// One rank's communicator: rank 0 creates the region under a new run id and sends the id to the
// others through the bootstrap (also the run's first barrier); once all have mapped it, rank 0
// removes the name.
std::unique_ptr<dist::Communicator> connect_ranks(const dist::LaunchEnv& env, dist::Timeout timeout,
                                                  std::string& run_id) {
  const size_t bytes = dist::ShmCommunicator::region_bytes(env.world_size, kCommCapacity);
  std::optional<dist::SharedRegion> region;
  if (env.rank == 0) {
    run_id = dist::new_run_id();
    region.emplace(dist::SharedRegion::create(dist::shared_region_name(run_id, "comm"), bytes));
    dist::ShmCommunicator::init(region->data(), env.world_size, kCommCapacity);
  }
  const std::vector<std::byte> blob =
      dist::tcp_bootstrap(env, std::as_bytes(std::span<const char>(run_id.data(), run_id.size())), timeout);
  if (env.rank != 0) {
    run_id.assign(reinterpret_cast<const char*>(blob.data()), blob.size());
    region.emplace(dist::SharedRegion::open(dist::shared_region_name(run_id, "comm"), bytes));
  }
  auto comm = std::make_unique<dist::ShmCommunicator>(std::move(*region), env.rank, env.world_size, timeout);
  comm->barrier();
  if (env.rank == 0) comm->unlink();
  return comm;
}

// A GPU rank sees only its GPU, LOCAL_RANK's of those visible (CUDA_VISIBLE_DEVICES, or all),
// as device 0: set before CUDA starts in this process.
void see_only_local_gpu(int local_rank) {
  std::vector<std::string> visible;
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v && *v) {
    std::stringstream ss(v);
    for (std::string d; std::getline(ss, d, ',');) visible.push_back(d);
    SF_REQUIRE(local_rank < int(visible.size()), "LOCAL_RANK=", local_rank, " but CUDA_VISIBLE_DEVICES=", v,
               " shows ", visible.size(), " GPU(s); start at most that many ranks per host");
  }
  const std::string mine = visible.empty() ? std::to_string(local_rank) : visible[size_t(local_rank)];
  ::setenv("CUDA_VISIBLE_DEVICES", mine.c_str(), 1);
}

#if SF_DIST_CUDA
// A GPU rank's NCCL communicator: rank 0 makes the run id and NCCL's unique id and sends both
// through the bootstrap; the device form of the reduce-scatter goes to the trainer.
std::unique_ptr<dist::Communicator> connect_nccl(const dist::LaunchEnv& env, dist::Timeout timeout, TrainOptions& o) {
  const dist::NcclLibrary& nccl = dist::NcclLibrary::process();
  std::vector<std::byte> blob;
  dist::NcclUniqueId id;
  if (env.rank == 0) {
    o.run_id = dist::new_run_id();
    id = nccl.unique_id();
    blob.resize(o.run_id.size() + id.bytes.size());
    std::memcpy(blob.data(), o.run_id.data(), o.run_id.size());
    std::memcpy(blob.data() + o.run_id.size(), id.bytes.data(), id.bytes.size());
  }
  blob = dist::tcp_bootstrap(env, blob, timeout);
  SF_REQUIRE(blob.size() > id.bytes.size(), "the bootstrap's blob is too short for a run id and NCCL's id");
  const size_t id_at = blob.size() - id.bytes.size();
  o.run_id.assign(reinterpret_cast<const char*>(blob.data()), id_at);
  std::memcpy(id.bytes.data(), blob.data() + id_at, id.bytes.size());
  auto comm = std::make_unique<dist::NcclCommunicator>(nccl, id, env.world_size, env.rank, 0, timeout);
  dist::NcclCommunicator* c = comm.get();
  o.device_reduce_scatter = [c](float* data, size_t shard, Stream& s) {
    c->reduce_scatter_sum_device(data, data + size_t(c->rank()) * shard, shard,
                                 reinterpret_cast<cudaStream_t>(CudaBackend::cuda_stream(s)));
  };
  return comm;
}
#endif

// This rank's communicator: NCCL for GPU ranks (CUDA builds, a GPU, not --backend host), else
// the host ranks' ShmCommunicator.
std::unique_ptr<dist::Communicator> connect(const dist::LaunchEnv& env, TrainOptions& o) {
  const dist::Timeout timeout(int64_t(o.dist_timeout_s) * 1000);
  if (o.backend != "host") see_only_local_gpu(env.local_rank);
#if SF_DIST_CUDA
  if (o.backend == "cuda" || (o.backend == "auto" && CudaBackend::device_count() > 0))
    return connect_nccl(env, timeout, o);
#endif
  return connect_ranks(env, timeout, o.run_id);
}

// Runs `train` as one rank of env's group, its errors prefixed "rank r: ".
TrainResult run_as_rank(TrainOptions& o, const dist::LaunchEnv& env) {
  try {
    std::unique_ptr<dist::Communicator> comm = connect(env, o);
    o.comm = comm.get();
    static std::ostream discard(nullptr);  // ranks other than 0 print only their errors
    TrainResult r = run_training(o, env.rank == 0 ? std::cout : discard);
    o.comm = nullptr;  // it goes with this scope
    o.device_reduce_scatter = nullptr;
    return r;
  } catch (const Error& e) {
    o.comm = nullptr;
    o.device_reduce_scatter = nullptr;
    const std::string prefix = cat("rank ", env.rank, ": ");
    if (std::string_view(e.what()).starts_with(prefix)) throw;  // said by the communicator already
    throw Error(e.kind(), prefix + e.what());
  }
}

// ---- flags -------------------------------------------------------------------------------

std::string toml_value(const std::string& s) {
  std::string q = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}
// --data for --print-config: a string, or an array of several files.
std::string data_toml_value(const std::vector<std::string>& v) {
  if (v.size() <= 1) return toml_value(v.empty() ? std::string() : v[0]);
  std::string s = "[";
  for (auto& d : v) s += (s.size() > 1 ? ", " : "") + toml_value(d);
  return s + "]";
}

template <class T>
std::string toml_value(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_same_v<T, fs::path>) {
    return toml_value(v.string());
  } else if constexpr (std::is_floating_point_v<T>) {
    // The shortest decimal that reads back as the same T (0.9f prints as 0.9).
    std::string s;
    for (int prec = 1; prec <= 17; ++prec) {
      std::ostringstream os;
      os << std::setprecision(prec) << double(v);
      s = os.str();
      if (T(std::strtod(s.c_str(), nullptr)) == v) break;
    }
    if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
    return s;
  } else {
    std::ostringstream os;
    os << v;
    return os.str();
  }
}

struct Flags {
  CLI::App* cmd = nullptr;
  std::vector<std::pair<std::string, std::function<std::string()>>> shown;  // for --print-config

  // `alias`: a second spelling (Hugging Face's TrainingArguments name); the first is the one
  // --print-config and the checkpoint's settings use.
  template <class T>
  CLI::Option* add(const std::string& name, T& var, const std::string& help,
                   const std::string& alias = "") {
    shown.push_back({name, [&var] { return toml_value(var); }});
    return cmd->add_option("--" + name + (alias.empty() ? "" : ",--" + alias), var, help);
  }
};

// Full fine-tuning defaults (docs/TRAINING.md, "Learning rate": TRL's SFTTrainer and the
// full fine-tuning recipes of torchtune and Axolotl train at 2e-5; a 3% warmup as the
// Alpaca/Vicuna recipes that TRL's examples follow).
constexpr double kDefaultFullFineTuneLr = 2e-5;
constexpr double kDefaultWarmupRatio = 0.03;

// --print-config writes one of each pair of exclusive options (the one in force), so that the
// file reads back; --resume only when resuming.
bool printed_in_config(const std::string& name, const TrainOptions& o) {
  if (name == "resume") return !o.resume.empty();
  if (name == "steps") return o.epochs == 0;
  if (name == "epochs") return o.epochs > 0;
  if (name == "warmup-steps") return o.warmup_ratio == 0;
  if (name == "warmup-ratio") return o.warmup_ratio > 0;
  return true;
}

}  // namespace

void add_train_command(CLI::App& app) {
  struct State {
    TrainOptions o;
    std::string schedule = "cosine", dtype = "auto", progress = "auto", config;
    std::string optimizer_state = "fp32", master_weights = "fp32";
    std::vector<std::string> data;  // --data values (joined into o.tokens_file)
    bool print_config = false, quiet = false, tensorboard = true;
    Flags flags;
  };
  auto st = std::make_shared<State>();
  TrainOptions& o = st->o;
  auto* cmd = app.add_subcommand("train", "fine-tune every parameter of a model");
  cmd->option_defaults()->always_capture_default();  // --help shows every default
  Flags& f = st->flags;
  f.cmd = cmd;
  cmd->add_option("--config", st->config,
                  "read options from a TOML/INI or YAML (.yaml, .yml) file (keys: these flags without --, "
                  "with - or _); flags win");
  cmd->add_flag("--print-config", st->print_config,
                "print the effective options in config-file form and exit");
  f.add("model", o.model_dir, "Hugging Face model directory (default: the bundled example)");
  {
    // --data and its older name --tokens: one option (the first name is what
    // explicit_options and --print-config use; a config file may use either key).
    // Repeated, it mixes files (FILE:WEIGHT); TrainOptions holds the values joined by '\n'.
    f.shown.push_back({"data", [st] { return data_toml_value(st->data); }});
    cmd->add_option("--data,--tokens", st->data,
                    "training data, repeatable: a dataset (.jsonl/.json records: text, "
                    "prompt/completion, messages, ShareGPT, Alpaca; .txt plain text) or a token "
                    "file (llm.c .bin or raw uint32 .bin/.tokens/.u32/.tok); several files mix, "
                    "FILE:WEIGHT sets each file's share of rows; --tokens is the same option");
  }
  f.add("data-format", o.data_format,
        "auto (detected from the file and its first record), text, prompt_completion, messages, "
        "sharegpt, chat_prompt_completion, alpaca, plain_text or tokens");
  {
    std::string names;
    for (auto& n : chat_format_names()) names += (names.empty() ? "" : ", ") + n;
    f.add("chat-format", o.chat_format,
          "messages: auto (the chat_template of the model's tokenizer_config.json) or " + names);
  }
  f.add("chat-date", o.chat_date,
        "messages with a Llama 3.2+ template: the \"Today Date\" rendered, e.g. \"26 Jul 2024\" "
        "(empty: today; recorded for resume)");
  f.add("overflow", o.overflow,
        "a JSONL sample longer than --seq-len: truncate, split (pieces of --seq-len), drop, or "
        "auto (split for text, truncate for prompt/completion and messages)");
  f.shown.push_back({"skip-bad-lines", [&o] { return toml_value(o.skip_bad_lines); }});
  cmd->add_flag("--skip-bad-lines", o.skip_bad_lines,
                "skip and count malformed JSONL lines instead of stopping at the first one");
  f.add("eval-file", o.eval_file,
        "separate evaluation data (JSONL, same format rules) instead of --eval-fraction");
  f.add("out", o.out_dir, "output directory: checkpoint-<step>/, latest, metrics.jsonl, loss.png");
  f.add("example-size", o.example_size, "model shape for the bundled example");
  f.add("steps", o.steps, "optimizer steps (bundled example: 50); or --epochs");
  f.add("epochs", o.epochs,
        "passes over the training data instead of --steps (fractions allowed): the steps are "
        "ceil(epochs x training rows / (batch-size x grad-accum)); 0: use --steps",
        "num-train-epochs");
  f.add("batch-size", o.batch_size, "sequences per micro-batch (bundled example: 8)",
        "per-device-train-batch-size");
  f.add("seq-len", o.seq_len, "tokens per sequence (bundled example: 64)", "max-seq-length");
  f.add("grad-accum", o.grad_accum, "micro-batches per optimizer step",
        "gradient-accumulation-steps");
  f.add("lr", o.schedule.lr,
        "peak learning rate (full fine-tuning default, as TRL's SFTTrainer; bundled example: "
        "3e-3)",
        "learning-rate")
      ->default_val(kDefaultFullFineTuneLr);
  f.add("lr-schedule", st->schedule, "constant, cosine or linear (after warmup)");
  f.add("warmup-steps", o.schedule.warmup_steps,
        "linear warmup steps W, as transformers counts them: step 1 at lr 0, step W+1 at the "
        "peak (bundled example: 5); or --warmup-ratio");
  f.add("warmup-ratio", o.warmup_ratio,
        "warmup as a share of the steps, in [0, 1): ceil(ratio x steps) warmup steps (with "
        "--model and no --warmup-steps: 0.03)");
  f.add("min-lr-ratio", o.schedule.min_lr_ratio, "final lr / peak lr");
  f.add("weight-decay", o.hyper.weight_decay, "decoupled weight decay (not on norms/biases)");
  f.add("beta1", o.hyper.beta1, "AdamW beta1");
  f.add("beta2", o.hyper.beta2, "AdamW beta2");
  f.add("adam-eps", o.hyper.eps, "AdamW epsilon");
  f.add("max-grad-norm", o.hyper.max_grad_norm, "global-norm clipping (0: off)")->default_val(1.0);
  f.add("seed", o.seed, "seed for initialisation, data order and the bf16 master's rounding");
  f.add("optimizer-state", st->optimizer_state, kOptimizerStateHelp);
  f.add("master-weights", st->master_weights, kMasterWeightsHelp);
  f.add("gpus", o.gpus,
        "data parallel: train on N ranks (one per GPU; with --backend host, N CPU processes), "
        "started here; --batch-size stays the global batch (divisible by N)");
  f.add("dist-timeout", o.dist_timeout_s,
        "data parallel: seconds a rank waits for the others before it stops the run naming them");
  f.shown.push_back({"deterministic", [&o] { return toml_value(o.deterministic); }});
  cmd->add_flag("--deterministic", o.deterministic,
                "the same bits on every run of these settings, on the GPU too (attention backwards "
                "without atomics: slower from 2K tokens per sequence on Hopper); a resumed run then "
                "equals the uninterrupted one");
  f.shown.push_back({"shuffle", [&o] { return toml_value(o.shuffle); }});
  cmd->add_flag("--shuffle,!--no-shuffle", o.shuffle,
                "train on the rows of the data in a seeded random order, new every epoch "
                "(default; --no-shuffle: in file order)");
  f.add("eval-every", o.eval_every, "steps between evaluations (0: at the end; bundled example: 10)");
  f.add("eval-fraction", o.eval_fraction,
        "share of the data held out for eval (token file: its tail; JSONL: whole samples chosen "
        "by content hash); ignored with --eval-file");
  f.add("eval-batches", o.eval_batches, "held-out batches per evaluation");
  f.add("save-every", o.save_every, "steps between checkpoints (0: only at the end)");
  f.add("keep-checkpoints", o.keep_checkpoints, "keep only the newest K checkpoints (0: all)");
  f.add("resume", o.resume,
        "continue from a checkpoint: a checkpoint-<step> directory, an output directory, or "
        "auto (<out>/latest); alone: auto")
      ->expected(0, 1)
      ->default_str("auto");
  cmd->add_flag("--overwrite", o.overwrite,
                "start afresh in an --out that holds an earlier run's checkpoints (deletes them)");
  f.add("log-every", o.log_every, "steps between log lines when stdout is not a terminal");
  f.add("progress", st->progress, "auto (a status bar on a terminal, else lines), bar, lines, none");
  f.add("backend", o.backend, "auto, host or cuda");
  f.add("engine", o.engine, "auto, resident or sliding");
  f.add("device-adamw-layers", o.device_adamw_layers,
        "sliding window: the first layers whose AdamW runs on the GPU (auto or a count)");
  f.add("checkpoint-every", o.checkpoint_every, kCheckpointEveryHelp);
  f.add("gpu-memory", o.gpu_memory, "device memory budget, e.g. 24GiB");
  f.add("host-memory", o.host_memory, "host memory budget, e.g. 100GiB");
  f.add("optimizer-dir", o.optimizer_dir,
        "a directory on a fast disk (NVMe) for the AdamW moments when RAM is short");
  f.add("dtype", st->dtype, "dtype of the saved weights: auto (the model's torch_dtype), bf16, f16, f32");
  cmd->add_flag("--quiet", st->quiet, "no progress output (same as --progress none)");
  f.shown.push_back({"tensorboard", [st] { return toml_value(st->tensorboard); }});
  cmd->add_flag("--tensorboard,!--no-tensorboard", st->tensorboard,
                "write TensorBoard event files under <out>/tensorboard/ (default; "
                "--no-tensorboard: none)");

  cmd->callback([st, cmd] {
    TrainOptions& o = st->o;
    if (!st->config.empty()) apply_config_file(cmd, st->config);
    if (!st->data.empty()) o.tokens_file = join_data_values(st->data);
    for (CLI::Option* opt : cmd->get_options())
      if (opt->count() > 0 && !opt->get_lnames().empty())
        o.explicit_options.insert(opt->get_lnames().front());
    auto given = [&](const char* k) { return o.explicit_options.count(k) > 0; };

    if (o.model_dir.empty()) {
      // The bundled example: a tiny model from scratch on 2 CPU cores in well under a minute.
      if (!given("steps") && !given("epochs")) o.steps = 50;
      if (!given("batch-size")) o.batch_size = 8;
      if (!given("seq-len")) o.seq_len = 64;
      if (!given("lr")) o.schedule.lr = 3e-3;
      // 5 of its 50 steps; with --epochs (steps not known yet) the same share.
      if (!given("warmup-steps") && !given("warmup-ratio")) {
        if (given("epochs")) o.warmup_ratio = 0.1;
        else o.schedule.warmup_steps = std::min<int64_t>(5, o.steps / 4);
      }
      if (!given("eval-every")) o.eval_every = 10;
      // The demo's default output is scratch: running it again starts it again.
      if (!given("out") && !given("overwrite")) o.overwrite = true;
      o.examples_dir = examples_dir();
    } else if (!given("warmup-steps") && !given("warmup-ratio")) {
      o.warmup_ratio = kDefaultWarmupRatio;  // full fine-tuning: a short warmup by default
    }
    SF_REQUIRE(!(given("overwrite") && given("resume")),
               "--overwrite and --resume contradict each other; pass one of them");
    o.schedule.kind = LrSchedule::parse_kind(st->schedule);
    o.state_format = parse_state_format(st->optimizer_state, st->master_weights);
    o.schedule.total_steps = o.steps;
    if (st->dtype != "auto") {
      try {
        o.save_dtype = parse_save_dtype(st->dtype);
      } catch (const Error&) {
        SF_FAIL(input, "--dtype \"", st->dtype,
                "\" is unknown; use auto (the model's own dtype), bf16, f16 or f32");
      }
    }
    const bool tty = ::isatty(STDOUT_FILENO);
    SF_REQUIRE(st->progress == "auto" || st->progress == "bar" || st->progress == "lines" ||
                   st->progress == "none",
               "--progress \"", st->progress, "\" is unknown; use auto, bar, lines or none");
    if (st->quiet || st->progress == "none") o.progress = TrainOptions::Progress::quiet;
    else if (st->progress == "bar") o.progress = TrainOptions::Progress::bar;
    else if (st->progress == "lines") o.progress = TrainOptions::Progress::lines;
    else if (st->progress == "auto")
      o.progress = tty ? TrainOptions::Progress::bar : TrainOptions::Progress::lines;
    else
      SF_FAIL(input, "--progress \"", st->progress, "\" is unknown; use auto, bar, lines or none");
    o.columns = terminal_columns(STDOUT_FILENO);
    o.tensorboard = st->tensorboard ? TensorBoardLog::on : TensorBoardLog::off;
    validate_train_options(o);

    if (st->print_config) {
      std::cout << "# slideformer train options (pass back with --config FILE)\n";
      for (auto& [name, show] : st->flags.shown)
        if (printed_in_config(name, o)) std::cout << name << " = " << show() << "\n";
      return;
    }

    const dist::LaunchEnv env = dist::launch_from_env();
    SF_REQUIRE(!env.from_env || !given("gpus") || o.gpus == env.world_size, "--gpus ", o.gpus,
               " and WORLD_SIZE=", env.world_size, " disagree: start the ranks with --gpus, or with a "
               "launcher that sets WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, not both");
    if (o.gpus > 1 && !env.from_env) return launch_the_ranks(o.gpus);

    StopSignals signals;
    if (env.from_env) stop_with_the_launcher();
    o.stop_requested = [] { return g_stop_signal.load() != 0; };
    o.fault = fault_hook_from_env();
    TrainResult r = env.from_env && env.world_size > 1 ? run_as_rank(o, env) : run_training(o, std::cout);
    if (r.stopped && env.rank != 0) throw CLI::RuntimeError(128 + (g_stop_signal.load() ? g_stop_signal.load() : SIGINT));
    if (r.stopped) {
      const int sig = g_stop_signal.load();
      std::cout << "stopped at step " << r.end_step << " of " << r.total_steps;
      if (!r.checkpoint.empty()) {
        std::cout << "; checkpoint " << r.checkpoint.string() << "\n"
                  << "resume with: slideformer train --out " << o.out_dir.string()
                  << " --resume auto\n";
      } else {
        std::cout << "; nothing to save yet\n";
      }
      std::cout << std::flush;
      throw CLI::RuntimeError(128 + (sig ? sig : SIGINT));
    }
  });
}

}  // namespace sf::cli
