// `plan --gpus N`: the one-GPU plan of one rank (its share of the batch) turned into the
// prediction for N data-parallel GPUs of one host, by docs/MULTI_GPU.md's model ("Memory and
// time model"). Pure: numbers in, numbers out; nothing is allocated or measured.
//
// - device, per GPU: the rank's plan + NCCL's buffers;
// - host: the lines one copy serves (state, the GPU path's streamed homes, the state loader's unit) once,
//   every other host line (rings, stages, activation store, CUDA runtime) once per rank;
// - step: the rank's step (compute and PCIe per GPU; the host AdamW, DRAM-bound, takes the
//   same wall time split over the ranks) + the gradient exchange the backward cannot hide:
//   per layer a reduce-scatter of its f32 gradient (an all-reduce, twice the bytes, for units
//   whose AdamW runs on every GPU), exposed where it outlasts that layer's backward, layer 0's
//   in full, and the embedding rows' all-gather at the end of the backward.
#pragma once
#include <string>

#include "engine/planner.h"

namespace sf {

enum class GpuLink : uint8_t { nvlink, pcie };

struct MultiGpuRequest {
  int gpus = 1;
  GpuLink link = GpuLink::nvlink;
  // NCCL's device buffers and its communicator per rank (channels x buffer size, NCCL's
  // defaults on 8 GPUs come to ~0.3-0.5 GiB): reserved from each GPU's budget.
  size_t nccl_device_bytes = size_t(512) << 20;
  // The one-GPU run the speedup is over: its plan for the same per-GPU batch (which may
  // speculate, where a rank's plan runs the deferred update). Unset (0): the rank's plan.
  double one_gpu_step_seconds = 0;
};

// Effective bus bandwidth of a reduce-scatter per GPU: NVLink 4 (H100/H200 HGX, 450 GB/s per
// direction) at ~2/3 efficiency, PCIe 5 x16 through the host (~64 GB/s raw) at ~1/3.
double gpu_link_bytes_per_s(GpuLink link);
const char* gpu_link_name(GpuLink link);
GpuLink parse_gpu_link(const std::string& s);  // "nvlink" | "pcie"; Error naming --gpu-link

// Whether a host memory line is one copy per host (shared by the ranks) or one per rank.
bool host_line_shared(const MemoryLine& line);
// The host bytes each rank may plan with so that one shared copy + N ranks fit host_budget:
// shared + (host_budget - shared) / gpus (0 when the shared part alone does not fit).
size_t rank_host_budget(const Plan& rank_plan, size_t host_budget, int gpus);

struct MultiGpuPlan {
  int gpus = 1;
  GpuLink link = GpuLink::nvlink;
  size_t device_bytes_per_gpu = 0;
  size_t host_shared_bytes = 0, host_rank_bytes = 0, host_bytes = 0;
  double exchange_layer_seconds = 0;  // one layer's gradient exchange
  double exposed_exchange_seconds = 0;
  double step_seconds = 0, clipped_step_seconds = 0;
  double tokens_per_second = 0;       // all GPUs together
  double one_gpu_step_seconds = 0;    // the request's, else the rank plan's
  double speedup = 0;                 // over that one-GPU run
  bool fits = false;
  std::string advice;                 // when it does not fit
};

// rank_plan: the plan of one rank for its tokens per step (micro-batch x accumulation);
// host_budget: the whole host's; device_budget: one GPU's.
MultiGpuPlan predict_multi_gpu(const ModelConfig& cfg, const Plan& rank_plan, double rank_tokens_per_step,
                               size_t host_budget, size_t device_budget, const MultiGpuRequest& req);

std::string describe_multi_gpu(const MultiGpuPlan& m, const Plan& rank_plan);

}  // namespace sf
