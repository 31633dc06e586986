// The N-GPU prediction from one rank's plan (contract and model in multi_gpu_plan.h).
#include "engine/multi_gpu_plan.h"

#include <algorithm>
#include <cstdio>
#include <string_view>

#include "core/error.h"
#include "model/param_layout.h"

namespace sf {

namespace {

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string fixed(double x, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, x);
  return buf;
}

// Seconds to exchange a gradient of n f32 elements: a reduce-scatter moves (N-1)/N of it per
// GPU; an all-reduce (a reduce-scatter + an all-gather) twice that.
double exchange_seconds(double n, int gpus, bool all_reduce, double link) {
  const double bytes = 4.0 * n * double(gpus - 1) / double(gpus);
  return (all_reduce ? 2.0 : 1.0) * bytes / link;
}

// Whether unit u's AdamW runs on every GPU (its state on the device): then each GPU needs the
// whole reduced gradient (an all-reduce), not its slice.
bool adamw_on_device(const Plan& p, int layer) {
  // A resident plan on a GPU is the device-resident executor: every unit's state is there.
  return p.mode == Plan::Mode::resident || layer < p.engine.device_adamw_layers;
}

// The exchange the backward does not hide (contract: the header's "step").
double exposed_exchange(const ModelConfig& cfg, const Plan& p, double rank_tokens, int gpus, double link,
                        double& layer_seconds) {
  const ModelLayout l = ModelLayout::build(cfg);
  const int L = l.n_layers;
  // The backward's share of the compute without its recompute (2 of 3 forward-equivalents):
  // a lower bound of each layer's backward, so the exposed time is not underestimated.
  const double bwd_layer = L > 0 ? p.compute_seconds * 2.0 / 3.0 / L : 0.0;
  double exposed = 0;
  layer_seconds = 0;
  for (int k = 0; k < L; ++k) {
    const double s = exchange_seconds(double(l.layer(k).numel), gpus, adamw_on_device(p, k), link);
    layer_seconds = std::max(layer_seconds, s);
    // Layer 0's is the backward's last: its update (and the next step) waits for all of it.
    exposed += k == 0 ? s : std::max(0.0, s - bwd_layer);
  }
  // The head's dense [V, C] gradient (tied or not) and final norm, next to layer L-1's backward.
  const double head = double(cfg.vocab_size) * double(cfg.hidden_size) + double(l.head().numel);
  exposed += std::max(0.0, exchange_seconds(head, gpus, p.mode == Plan::Mode::resident, link) - bwd_layer);
  // The embedding's rows of every rank's tokens, gathered after the backward (f32 rows).
  const double rows = std::min(rank_tokens, double(cfg.vocab_size));
  exposed += 4.0 * rows * double(cfg.hidden_size) * double(gpus - 1) / link;
  return exposed;
}

}  // namespace

double gpu_link_bytes_per_s(GpuLink link) { return link == GpuLink::nvlink ? 300e9 : 20e9; }
const char* gpu_link_name(GpuLink link) { return link == GpuLink::nvlink ? "NVLink" : "PCIe"; }

GpuLink parse_gpu_link(const std::string& s) {
  if (s == "nvlink") return GpuLink::nvlink;
  if (s == "pcie") return GpuLink::pcie;
  SF_FAIL(input, "--gpu-link \"", s, "\" is not a link; use nvlink (HGX/NVSwitch machines) or pcie "
          "(GPUs that reach each other only through the host)");
}

bool host_line_shared(const MemoryLine& line) {
  if (line.device || line.disk) return false;
  // The training state (ParamStore, master and moments in any format, in the ranks' shared
  // memory), the GPU path's streamed homes (window_buffers.h, Tier::host_shared) and the one
  // unit that local rank 0 alone loads the state through. The `next` buffers and the f32
  // path's homes (a rank's own gradients) are each rank's.
  for (std::string_view p : {"fp32 master +", "bf16 master +", "fp32 master", "bf16 master", "AdamW m, v",
                             "f32 weights of one unit (loading", "weights/gradient homes (streamed, one copy"})
    if (starts_with(line.what, p) && line.what.find("stage") == std::string::npos) return true;
  return false;
}

namespace {
void host_split(const Plan& p, size_t& shared, size_t& rank) {
  shared = rank = 0;
  for (const MemoryLine& m : p.lines)
    if (!m.device && !m.disk) (host_line_shared(m) ? shared : rank) += m.bytes;
}
}  // namespace

size_t rank_host_budget(const Plan& rank_plan, size_t host_budget, int gpus) {
  SF_CHECK(gpus >= 1, "rank_host_budget: ", gpus, " GPUs");
  size_t shared = 0, rank = 0;
  host_split(rank_plan, shared, rank);
  return host_budget < shared ? 0 : shared + (host_budget - shared) / size_t(gpus);
}

MultiGpuPlan predict_multi_gpu(const ModelConfig& cfg, const Plan& p, double rank_tokens_per_step,
                               size_t host_budget, size_t device_budget, const MultiGpuRequest& req) {
  SF_CHECK(req.gpus >= 1, "predict_multi_gpu: ", req.gpus, " GPUs");
  MultiGpuPlan m;
  m.gpus = req.gpus;
  m.link = req.link;
  const bool several = req.gpus > 1;
  m.device_bytes_per_gpu = p.device_bytes + (several ? req.nccl_device_bytes : 0);
  host_split(p, m.host_shared_bytes, m.host_rank_bytes);
  m.host_bytes = m.host_shared_bytes + size_t(req.gpus) * m.host_rank_bytes;
  const double link = gpu_link_bytes_per_s(req.link);
  m.exposed_exchange_seconds =
      several ? exposed_exchange(cfg, p, rank_tokens_per_step, req.gpus, link, m.exchange_layer_seconds) : 0.0;
  m.step_seconds = p.step_seconds + m.exposed_exchange_seconds;
  m.clipped_step_seconds = p.clipped_step_seconds + m.exposed_exchange_seconds;
  m.tokens_per_second = m.step_seconds > 0 ? double(req.gpus) * rank_tokens_per_step / m.step_seconds : 0.0;
  m.one_gpu_step_seconds = req.one_gpu_step_seconds > 0 ? req.one_gpu_step_seconds : p.step_seconds;
  m.speedup = m.step_seconds > 0 ? double(req.gpus) * m.one_gpu_step_seconds / m.step_seconds : 0.0;
  m.fits = p.fits && m.device_bytes_per_gpu <= device_budget && m.host_bytes <= host_budget;
  if (!p.fits)
    m.advice = cat("each rank's plan (", rank_tokens_per_step, " tokens per step) does not fit: ", p.advice,
                   " (sizes there are per GPU: --batch-size is ", req.gpus, " times that)");
  else if (m.device_bytes_per_gpu > device_budget)
    m.advice = cat("each GPU needs ", format_bytes(m.device_bytes_per_gpu), " (NCCL's ",
                   format_bytes(req.nccl_device_bytes), " included) of ", format_bytes(device_budget),
                   ": raise --gpu-memory or lower --batch-size");
  else if (m.host_bytes > host_budget)
    m.advice = cat("the host needs ", format_bytes(m.host_bytes), " (one shared copy of ",
                   format_bytes(m.host_shared_bytes), " + ", req.gpus, " ranks x ", format_bytes(m.host_rank_bytes),
                   ") of ", format_bytes(host_budget), ": raise --host-memory, use fewer --gpus or a "
                   "compact state (--optimizer-state int8)");
  return m;
}

std::string describe_multi_gpu(const MultiGpuPlan& m, const Plan& p) {
  std::string s = cat("\ngpus       ", m.gpus, " data-parallel ranks over ", gpu_link_name(m.link), " (",
                      fixed(gpu_link_bytes_per_s(m.link) / 1e9, 0), " GB/s assumed); the plan above is each rank's\n");
  s += cat("memory     per GPU ", format_bytes(m.device_bytes_per_gpu), "; host ", format_bytes(m.host_bytes),
           " = one shared copy ", format_bytes(m.host_shared_bytes), " + ", m.gpus, " x ",
           format_bytes(m.host_rank_bytes), " per rank\n");
  s += cat("exchange   ", fixed(m.exchange_layer_seconds * 1e3, 1), " ms per layer's gradient, ",
           fixed(m.exposed_exchange_seconds * 1e3, 1), " ms per step not hidden by the backward\n");
  s += cat("predicted  step ", fixed(m.step_seconds, 3), " s (one GPU alone: ", fixed(m.one_gpu_step_seconds, 3),
           " s", m.one_gpu_step_seconds != p.step_seconds ? ", its own plan" : "", "), ",
           fixed(m.tokens_per_second, 0), " tokens/s on ", m.gpus, " GPUs = ", fixed(m.speedup, 2),
           "x one GPU at the same per-GPU batch\n");
  s += cat("clipped    ", fixed(m.clipped_step_seconds, 3), " s per clipped step\n");
  s += cat("fits       ", m.fits ? std::string("yes") : cat("no: ", m.advice), "\n");
  return s;
}

}  // namespace sf
