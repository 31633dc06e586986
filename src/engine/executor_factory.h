// Picks the backend ("auto": CUDA when built with it and a GPU is present, else host), plans
// the step within the memory budgets, and returns a ready StepExecutor owning its backend.
// Refuses (Error(input) with the planner's advice) before allocating anything when the plan
// does not fit.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "backend/backend.h"  // BackendKind
#include "engine/data_parallel.h"
#include "engine/planner.h"
#include "engine/step_executor.h"

namespace sf {

struct ExecutorRequest {
  std::string backend = "auto";  // auto | host | cuda
  std::string engine = "auto";   // auto | resident | sliding
  // Sliding window: how many of the first layers run AdamW on the device ("auto" or a count).
  std::string device_adamw_layers = "auto";
  // Sliding window: every how many layers' inputs are saved for the backward ("auto" or 1-3;
  // StepRequest::checkpoint_every). Parsed by plan_run into the plan's request.
  std::string checkpoint_every = "auto";
  StepRequest step;
  std::string gpu_memory;   // empty: the device's memory minus a margin
  std::string host_memory;  // empty: available RAM minus a margin
  // A directory on a fast disk for the AdamW moments when RAM is short (empty: none).
  std::string optimizer_dir;
  // `plan` for a disk that is not this machine's (e.g. "7GB/s", "2TB"): its read + write rate
  // instead of measuring it, its free bytes instead of asking the filesystem (then
  // optimizer_dir need not exist here). Empty: measured.
  std::string disk_speed, disk_free;
  bool plan_only = false;   // planning for a CUDA machine without its GPU (needs gpu_memory)
  // Attention backwards that give the same bits every call (cudnn_attention.h; the host
  // backend always does): runs repeat, and a resumed run is the uninterrupted one bit for bit.
  // false: the fastest backward (cuDNN's, accumulating with atomics, on Hopper) unless
  // SF_ATTN_DETERMINISTIC=1.
  bool deterministic = false;
  // Data parallel (data_parallel.h): this executor is one rank of data_parallel->world() (null:
  // one rank). step.micro_tokens is then the rank's share. The ranks run the sliding window
  // with the deferred update (plan_run plans it so: no resident engine, no speculation, every
  // gradient kept for the norm); the executor refuses what is not built for several ranks.
  const DataParallel* data_parallel = nullptr;
};

// Resolves the backend kind and budgets and makes the plan (no allocation).
struct PlannedRun {
  BackendKind backend = BackendKind::host;
  // Why this backend, e.g. "auto: no CUDA device found" or "--backend host".
  std::string backend_reason;
  // A request value the chosen backend does not use (--gpu-memory on the host backend), said
  // in one line; empty when none.
  std::string note;
  Budget budget;
  Plan plan;
  StepRequest plan_request;
  DType compute_dtype = DType::f32;
};
PlannedRun plan_run(const ModelConfig& cfg, const ExecutorRequest& req);

std::unique_ptr<StepExecutor> make_executor(const ModelConfig& cfg, const ExecutorRequest& req);

// Wraps the host backend of every later make_executor (null: none). The CLI installs one for
// its tests (cli/test_hooks.h); the library itself never does.
using BackendDecorator = std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>)>;
void set_host_backend_decorator(BackendDecorator decorator);
// The same with a plan already made by plan_run(cfg, req) (e.g. after printing it).
std::unique_ptr<StepExecutor> make_executor(const ModelConfig& cfg, const ExecutorRequest& req,
                                            const PlannedRun& planned);

}  // namespace sf
