#include "engine/executor_factory.h"

#include <cstdlib>
#include <filesystem>

#include "backend/host/host_backend.h"
#include "backend/threaded_streams_backend.h"
#include "core/error.h"
#include "optim/param_store.h"
#include "engine/device_resident_executor.h"
#include "engine/hardware_probe.h"
#include "engine/resident_executor.h"
#include "engine/sliding_executor.h"
#if SF_WITH_CUDA
#include <cuda_runtime_api.h>

#include "backend/cuda/cuda_backend.h"
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

}  // namespace

PlannedRun plan_run(const ModelConfig& cfg, const ExecutorRequest& req) {
  PlannedRun r;
  r.plan_request = req.step;
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
  size_t avail = host_available_bytes();
  // Leave a tenth of the free RAM (at least 2 GiB) to the OS and page cache: being refused
  // here beats being killed by the OOM killer hours later.
  size_t host_default = avail > 0 ? avail - std::max(avail / 10, std::min(avail / 2, 2 * kGiB)) : 0;
  r.budget.host_bytes = req.host_memory.empty() ? host_default
                                                : parse_bytes(req.host_memory, "--host-memory");
  r.budget.page_cache_bytes = avail > r.budget.host_bytes ? avail - r.budget.host_bytes : 0;
  if (!req.optimizer_dir.empty()) {
    std::error_code ec;
    SF_REQUIRE(std::filesystem::is_directory(req.optimizer_dir, ec), "--optimizer-dir ",
               req.optimizer_dir, " is not a directory; create it on a fast local disk (an NVMe SSD)");
    r.budget.moments_dir = req.optimizer_dir;
    r.budget.moments_dir_free = disk_free_bytes(req.optimizer_dir);
  }
  if (r.backend == BackendKind::host) {
    r.budget.unified = true;
    r.budget.device_bytes = r.budget.host_bytes;
  } else {
    r.budget.device_bytes = req.gpu_memory.empty() ? 0 : parse_bytes(req.gpu_memory, "--gpu-memory");
#if SF_WITH_CUDA
    size_t free_b = 0, total_b = 0;
    cudaSetDevice(0);
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) free_b = 0;
    size_t dev_default = free_b;
    dev_default = dev_default > kGiB ? dev_default - kGiB : 0;  // CUDA context and margin
    if (req.gpu_memory.empty()) r.budget.device_bytes = dev_default;
#endif
  }
  HardwareModel hw = r.backend == BackendKind::host ? HardwareModel::host_default()
                                                    : HardwareModel::device_default();
#if SF_WITH_CUDA
  // The GPU figures are the H200's; with the GPU at hand, measure it and rescale them.
  if (r.backend == BackendKind::cuda && cuda_available()) {
    try {
      CudaBackend probe_be(0);
      hw = scale_to_device(hw, probe_device(probe_be));
    } catch (const Error& e) {
      // E.g. a GPU too full for the probe's ~0.8 GB: plan with the H200's figures, say so.
      hw.source = cat("the H200 test machine's GPU figures (the GPU probe failed: ", e.what(), ")");
    }
  }
#endif
  SF_REQUIRE(req.engine == "auto" || req.engine == "resident" || req.engine == "sliding",
             "--engine \"", req.engine, "\" is unknown; use auto, resident or sliding");
  int dev_adamw = -1;
  if (req.device_adamw_layers != "auto") {
    size_t used = 0;
    try {
      dev_adamw = std::stoi(req.device_adamw_layers, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SF_REQUIRE(used == req.device_adamw_layers.size() && dev_adamw >= 0,
               "--device-adamw-layers \"", req.device_adamw_layers,
               "\" is not valid; use auto or a number of layers (0: every layer's AdamW on the host)");
  }
  r.plan = make_plan(cfg, req.step, r.budget, r.compute_dtype, hw, req.engine != "sliding",
                     dev_adamw);
  if (r.plan.engine.moments_streamed) {
    // The moments stream from disk: its speed is the optimizer's now. Measure it, plan again.
    hw.disk_bytes_per_s = probe_disk(req.optimizer_dir);
    r.plan = make_plan(cfg, req.step, r.budget, r.compute_dtype, hw, req.engine != "sliding",
                       dev_adamw);
  }
  if (req.engine == "resident" && r.plan.mode != Plan::Mode::resident)
    SF_FAIL(input, "--engine resident: the model does not fit in device memory; use --engine auto");
  return r;
}

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
    // Tests only: the host backend with lazy threaded streams, so that the CLI's runs check
    // the engine's and the trainer's stream ordering (backend/threaded_streams_backend.h).
    if (const char* lazy = std::getenv("SF_TEST_LAZY_STREAMS"); lazy && *lazy == '1') {
      ThreadedStreamsBackend::Options o;
      o.lazy = true;
      be = std::make_unique<ThreadedStreamsBackend>(std::move(be), o);
    }
  } else {
#if SF_WITH_CUDA
    be = std::make_unique<CudaBackend>(0, r.budget.device_bytes);
#endif
  }
  const int64_t max_tokens = req.step.micro_tokens;
  if (r.plan.mode == Plan::Mode::resident && r.backend == BackendKind::host)
    return std::make_unique<Owning<ResidentExecutor>>(std::move(be), cfg, max_tokens,
                                                      r.plan.keep_activations,
                                                      r.plan.engine.head_chunk_rows);
  if (r.plan.mode == Plan::Mode::resident)
    return std::make_unique<Owning<DeviceResidentExecutor>>(std::move(be), cfg, max_tokens,
                                                            r.plan.keep_activations,
                                                            r.plan.engine.head_chunk_rows);
  return std::make_unique<Owning<SlidingWindowExecutor>>(std::move(be), cfg, r.plan.engine);
}

}  // namespace sf
