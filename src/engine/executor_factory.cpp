#include "engine/executor_factory.h"

#include <cstdlib>
#include <filesystem>

#include "backend/host/host_backend.h"
#include "core/error.h"
#include "optim/param_store.h"
#include "engine/device_resident_executor.h"
#include "engine/hardware_probe.h"
#include "engine/multi_gpu_plan.h"
#include "engine/resident_executor.h"
#include "engine/sliding_executor.h"
#if SF_WITH_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cudnn_attention.h"
#endif

namespace sf {

namespace {

// Keeps the backend alive as long as the executor that uses it.
template <class Exec>
class Owning final : public StepExecutor {
 public:
  template <class... A>
  Owning(std::unique_ptr<Backend> be, A&&... a)
      : be_(std::move(be)), exec_(*be_, std::forward<A>(a)...) {}
  StepStats train_step(std::span<const Batch> m, const OptimHyper& h) override {
    return exec_.train_step(m, h);
  }
  double eval_loss_sum(const Batch& b) override { return exec_.eval_loss_sum(b); }
  ParamStore& params() override { return exec_.params(); }
  void params_changed() override { exec_.params_changed(); }
  const char* name() const override { return exec_.name(); }
  size_t device_peak_bytes() const override { return be_->peak_bytes_in_use(); }
  size_t device_bytes_in_use() const override { return be_->bytes_in_use(); }
  size_t device_used_bytes() const override { return be_->device_used_bytes(); }
  std::string one_off_costs() const override { return be_->one_off_costs(); }

 private:
  std::unique_ptr<Backend> be_;
  Exec exec_;
};

bool cuda_available() {
#if SF_WITH_CUDA
  return CudaBackend::device_count() > 0;
#else
  return false;
#endif
}

constexpr size_t kGiB = size_t(1) << 30;

// --backend: the backend and its compute dtype (auto: CUDA when a device is visible).
void choose_backend(const ExecutorRequest& req, PlannedRun& r) {
  if (req.backend == "cuda" || (req.backend == "auto" && cuda_available())) {
    SF_REQUIRE(cuda_available() || (req.plan_only && !req.gpu_memory.empty()), "--backend cuda: ",
#if SF_WITH_CUDA
               "no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
#else
               "this build has no CUDA backend (rebuild with nvcc installed)"
#endif
    );
    r.backend = BackendKind::cuda;
    r.compute_dtype = DType::bf16;
    r.backend_reason = req.backend == "cuda" ? (cuda_available() ? "--backend cuda"
                                                                 : "--backend cuda; no CUDA device here")
                                             : "auto: a CUDA device was found";
  } else {
    SF_REQUIRE(req.backend == "host" || req.backend == "auto", "--backend \"", req.backend,
               "\" is unknown; use auto, host or cuda");
    r.backend = BackendKind::host;
    r.compute_dtype = DType::f32;
#if SF_WITH_CUDA
    r.backend_reason = req.backend == "host" ? "--backend host" : "auto: no CUDA device found";
#else
    r.backend_reason = req.backend == "host" ? "--backend host"
                                             : "auto: this build has no CUDA backend";
#endif
    if (!req.gpu_memory.empty())
      r.note = cat("note: --gpu-memory ", req.gpu_memory, " does not apply: this runs on the host "
                   "backend (", r.backend_reason, "), whose budget is --host-memory");
  }
}

// --host-memory, or by default the free RAM less what the OS keeps; the RAM beyond the
// budget is the page cache's.
void set_host_budget(const ExecutorRequest& req, Budget& b) {
  size_t avail = host_available_bytes();
  // Leave a tenth of the free RAM (at least 2 GiB) to the OS and page cache: being refused
  // here beats being killed by the OOM killer hours later.
  size_t host_default = avail > 0 ? avail - std::max(avail / 10, std::min(avail / 2, 2 * kGiB)) : 0;
  b.host_bytes = req.host_memory.empty() ? host_default : parse_bytes(req.host_memory, "--host-memory");
  b.page_cache_bytes = avail > b.host_bytes ? avail - b.host_bytes : 0;
}

// --disk-speed "7GB/s": bytes per second read and written together.
double parse_disk_speed(const std::string& s) {
  const bool per_s = s.size() > 2 && s.compare(s.size() - 2, 2, "/s") == 0;
  SF_REQUIRE(per_s, "--disk-speed \"", s, "\" is not a rate; write e.g. 7GB/s (read + write together)");
  const double rate = double(parse_bytes(s.substr(0, s.size() - 2), "--disk-speed"));
  SF_REQUIRE(rate > 0, "--disk-speed ", s, " must be more than 0");
  return rate;
}

// --optimizer-dir: where the AdamW moments may go, and the bytes free there (--disk-free's
// for a disk that is not this machine's: then the directory need not exist).
void set_optimizer_dir(const ExecutorRequest& req, Budget& b) {
  SF_REQUIRE(!req.optimizer_dir.empty() || (req.disk_speed.empty() && req.disk_free.empty()),
             req.disk_speed.empty() ? "--disk-free" : "--disk-speed",
             " describes --optimizer-dir's disk; add --optimizer-dir DIR (where the AdamW moments would go)");
  if (req.optimizer_dir.empty()) return;
  b.moments_dir = req.optimizer_dir;
  if (!req.disk_free.empty()) {
    b.moments_dir_free = parse_bytes(req.disk_free, "--disk-free");
    return;
  }
  std::error_code ec;
  SF_REQUIRE(std::filesystem::is_directory(req.optimizer_dir, ec), "--optimizer-dir ",
             req.optimizer_dir, " is not a directory; create it on a fast local disk (an NVMe SSD)");
  b.moments_dir_free = disk_free_bytes(req.optimizer_dir);
}

// The host backend's device is the host budget (one pool); a GPU's is --gpu-memory, or by
// default its free memory less the CUDA context and a margin.
void set_device_budget(const ExecutorRequest& req, BackendKind backend, Budget& b) {
  if (backend == BackendKind::host) {
    b.unified = true;
    b.device_bytes = b.host_bytes;
    return;
  }
  b.device_bytes = req.gpu_memory.empty() ? 0 : parse_bytes(req.gpu_memory, "--gpu-memory");
#if SF_WITH_CUDA
  size_t free_b = 0, total_b = 0;
  cudaSetDevice(0);
  if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) free_b = 0;
  size_t dev_default = free_b;
  dev_default = dev_default > kGiB ? dev_default - kGiB : 0;  // CUDA context and margin
  if (req.gpu_memory.empty()) b.device_bytes = dev_default;
#endif
}

#if SF_WITH_CUDA
// The attention implementation the backend will run (cudnn_attention.h) sets the rate: the
// H200's forward + backward at 8K and longer, FLOPs counted as HardwareModel counts them:
// slideformer's kernels 275 TFLOP/s (the default), cuDNN's forward with its atomic backward
// 530, cuDNN's forward with our deterministic backward 350 (14th session, docs/BENCHMARKS.md).
// Split (slideformer's forward, cuDNN's backward) is planned at cuDNN's figures: the backward,
// most of the time, is cuDNN's with its workspace; the forward runs 1.01-1.16x cuDNN's at D 128
// from 8K tokens but 0.74-0.98x at D 64 and 0.83-0.93x below 8K (H100, docs/BENCHMARKS.md),
// so the plan is a few percent optimistic there. Returns the implementation in words, for the plan's hardware line.
std::string set_attention_rate(HardwareModel& hw) {
  const cuda::AttentionImpl impl = cuda::attention_impl();
  if (impl == cuda::AttentionImpl::native) return "attention: slideformer's kernels";
  const bool det = cuda::attention_deterministic();
  hw.attention_flops = det ? 350e12 : 530e12;
  hw.attention_workspace = !det;
  hw.attention_flops_no_workspace = det ? 0 : 350e12;
  if (impl == cuda::AttentionImpl::split)
    return det ? "attention: slideformer's forward, cuDNN's deterministic backward where it has "
                 "one, else slideformer's"
               : "attention: slideformer's forward, cuDNN's backward";
  return det ? "attention: cuDNN forward, slideformer's deterministic backward" : "attention: cuDNN";
}
#endif

HardwareModel hardware_for(BackendKind backend, StateFormat state_format) {
  HardwareModel hw = backend == BackendKind::host ? HardwareModel::host_default()
                                                  : HardwareModel::device_default(state_format);
#if SF_WITH_CUDA
  // The GPU figures are the H200's; with the GPU at hand, measure it and rescale them.
  if (backend == BackendKind::cuda && cuda_available()) {
    const std::string attention = set_attention_rate(hw);
    try {
      CudaBackend probe_be(0);
      hw = scale_to_device(hw, probe_device(probe_be));
    } catch (const Error& e) {
      // E.g. a GPU too full for the probe's ~0.8 GB: plan with the H200's figures, say so.
      hw.source = cat("the H200 test machine's GPU figures (the GPU probe failed: ", e.what(), ")");
    }
    hw.source += "; " + attention;
  }
#endif
  return hw;
}

// --engine: the planner's choice, resident only, or a sliding window only.
enum class EngineChoice { automatic, resident, sliding };

EngineChoice parse_engine(const std::string& engine) {
  SF_REQUIRE(engine == "auto" || engine == "resident" || engine == "sliding",
             "--engine \"", engine, "\" is unknown; use auto, resident or sliding");
  return engine == "resident" ? EngineChoice::resident
         : engine == "sliding" ? EngineChoice::sliding
                               : EngineChoice::automatic;
}

// --device-adamw-layers: -1 for auto (the planner's choice), else a count >= 0.
int parse_device_adamw_layers(const std::string& s) {
  if (s == "auto") return -1;
  int n = -1;
  size_t used = 0;
  try {
    n = std::stoi(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  SF_REQUIRE(used == s.size() && n >= 0, "--device-adamw-layers \"", s,
             "\" is not valid; use auto or a number of layers (0: every layer's AdamW on the host)");
  return n;
}

// --checkpoint-every: 0 for auto (the planner's choice), else 1, 2 or 3.
int parse_checkpoint_every(const std::string& s) {
  if (s == "auto") return 0;
  SF_REQUIRE(s == "1" || s == "2" || s == "3", "--checkpoint-every \"", s,
             "\" is not valid; use auto, or 1, 2 or 3 (save every layer's input, every 2nd's or every 3rd's; "
             "the backward replays the others)");
  return s[0] - '0';
}

// A rank's plan: the deferred update (its memory is within the speculative plan's), and the
// rank's ShardedUpdate buffers in the table and the budget.
void count_data_parallel(const ModelConfig& cfg, int world, PlannedRun& r) {
  r.plan.engine.speculation = EngineConfig::Speculation::off;
  r.plan.engine.next_units = -1;
  r.plan.engine.data_parallel_world = world;
  std::vector<int64_t> numels;
  for (const Unit& u : ModelLayout::build(cfg).units) numels.push_back(u.numel);
  const size_t bytes = ShardedUpdate::host_bytes(numels, world, r.compute_dtype != DType::f32);
  r.plan.lines.push_back({cat("data parallel: reduced gradient slices + send buffer (", world, " ranks)"), bytes});
  r.plan.host_bytes += bytes;
  const size_t need = r.plan.host_bytes + (r.budget.unified ? r.plan.device_bytes : 0);
  if (r.plan.fits && need > r.budget.host_bytes) {
    r.plan.fits = false;
    r.plan.advice = cat("with ", world, " ranks each needs ", need >> 20, " MiB of host memory (the data-parallel "
                        "buffers included), over --host-memory's ", r.budget.host_bytes >> 20, " MiB; raise "
                        "--host-memory or train with fewer --gpus");
  }
}

}  // namespace

PlannedRun plan_run(const ModelConfig& cfg, const ExecutorRequest& req) {
#if SF_WITH_CUDA
  if (req.deterministic) cuda::set_attention_deterministic(true);  // before the rate is chosen
#endif
  PlannedRun r;
  r.plan_request = req.step;
  r.plan_request.checkpoint_every = parse_checkpoint_every(req.checkpoint_every);
  choose_backend(req, r);
  set_host_budget(req, r.budget);
  set_optimizer_dir(req, r.budget);
  set_device_budget(req, r.backend, r.budget);
  HardwareModel hw = hardware_for(r.backend, req.step.state_format);
  const EngineChoice engine = parse_engine(req.engine);
  const int dev_adamw = parse_device_adamw_layers(req.device_adamw_layers);
  const bool ranks = req.data_parallel && req.data_parallel->active();
  SF_REQUIRE(!(ranks && engine == EngineChoice::resident), "--engine resident: data parallel (--gpus ",
             req.data_parallel ? req.data_parallel->world() : 1, ") runs the sliding window; use --engine auto");
  SF_REQUIRE(!(engine == EngineChoice::resident && r.plan_request.checkpoint_every > 1), "--checkpoint-every ",
             r.plan_request.checkpoint_every, ": only the sliding window saves fewer layers' inputs (--engine resident "
             "keeps every layer's); use --engine auto or sliding, or --checkpoint-every auto");
  if (ranks) r.plan_request.data_parallel_ranks = req.data_parallel->world();
  const bool several = r.plan_request.data_parallel_ranks > 1;  // a run's ranks, or plan --gpus N
  const bool allow_resident = engine != EngineChoice::sliding && !ranks && !several;
  // Several ranks: every gradient waits for the global norm (the plans that apply each as it
  // lands are not built for several ranks).
  if (ranks || several) r.plan_request.clipping = true;
  r.plan = make_plan(cfg, r.plan_request, r.budget, r.compute_dtype, hw, allow_resident, dev_adamw);
  if (!req.disk_speed.empty()) {  // a disk elsewhere: its rate as given, for every candidate
    hw.disk_bytes_per_s = parse_disk_speed(req.disk_speed);
    hw.source += cat("; --disk-speed ", req.disk_speed, " assumed");
    r.plan = make_plan(cfg, r.plan_request, r.budget, r.compute_dtype, hw, allow_resident, dev_adamw);
  } else if (r.plan.disk_bytes > 0) {
    // State on disk: the disk's speed bounds the optimizer (streamed: its reads and writes;
    // cached: its writes). Measure it, plan again.
    hw.disk_bytes_per_s = probe_disk(req.optimizer_dir);
    r.plan = make_plan(cfg, r.plan_request, r.budget, r.compute_dtype, hw, allow_resident, dev_adamw);
  }
  if (ranks && req.data_parallel->world() > 1 && r.plan.fits) {
    // One host for all ranks: the state is one shared copy, each rank's own buffers get a
    // 1/N share of the rest, so that the N ranks together stay within the budget.
    r.budget.host_bytes = rank_host_budget(r.plan, r.budget.host_bytes, req.data_parallel->world());
    r.plan = make_plan(cfg, r.plan_request, r.budget, r.compute_dtype, hw, allow_resident, dev_adamw);
  }
  if (ranks) count_data_parallel(cfg, req.data_parallel->world(), r);
#if SF_WITH_CUDA
  if (r.plan.attention_without_workspace) cuda::set_attention_deterministic(true);
#endif
  if (engine == EngineChoice::resident && r.plan.mode != Plan::Mode::resident)
    SF_FAIL(input, "--engine resident: the model does not fit in device memory; use --engine auto");
  return r;
}

namespace {
BackendDecorator& host_decorator() {
  static BackendDecorator d;
  return d;
}
}  // namespace

void set_host_backend_decorator(BackendDecorator d) { host_decorator() = std::move(d); }

std::unique_ptr<StepExecutor> make_executor(const ModelConfig& cfg, const ExecutorRequest& req) {
  return make_executor(cfg, req, plan_run(cfg, req));
}

std::unique_ptr<StepExecutor> make_executor(const ModelConfig& cfg, const ExecutorRequest& req,
                                            const PlannedRun& r) {
  SF_REQUIRE(r.plan.fits, "this run does not fit: ", r.plan.advice,
             " (`slideformer plan` shows the whole memory table)");
  std::unique_ptr<Backend> be;
  if (r.backend == BackendKind::host) {
    be = std::make_unique<HostBackend>();
    if (host_decorator()) be = host_decorator()(std::move(be));
  } else {
#if SF_WITH_CUDA
    be = std::make_unique<CudaBackend>(0, r.budget.device_bytes);
#endif
  }
  const int64_t max_tokens = req.step.micro_tokens;
  if (r.plan.mode == Plan::Mode::resident && r.backend == BackendKind::host)
    return std::make_unique<Owning<ResidentExecutor>>(std::move(be), cfg, max_tokens,
                                                      r.plan.keep_activations,
                                                      r.plan.engine.head_chunk_rows,
                                                      r.plan.engine.state_format);
  if (r.plan.mode == Plan::Mode::resident)
    return std::make_unique<Owning<DeviceResidentExecutor>>(std::move(be), cfg, max_tokens,
                                                            r.plan.keep_activations,
                                                            r.plan.engine.head_chunk_rows,
                                                      r.plan.engine.state_format);
  if (req.data_parallel && req.data_parallel->active())
    return std::make_unique<Owning<SlidingWindowExecutor>>(std::move(be), cfg, r.plan.engine, EngineTestModes{},
                                                           *req.data_parallel);
  return std::make_unique<Owning<SlidingWindowExecutor>>(std::move(be), cfg, r.plan.engine);
}

}  // namespace sf
