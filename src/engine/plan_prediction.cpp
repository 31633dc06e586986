// The step-time prediction: the FLOPs of a step (projections, causal attention, the LM head,
// the backward's recompute), HardwareModel::attention_rate, and predict, which turns a plan's
// mode, engine settings and the hardware figures into its predicted step (compute, transfers
// over PCIe, the host AdamW and how they overlap) and names what bounds it. Reads the plan's
// settings; overwrites only its prediction fields.
#include <algorithm>
#include <cmath>

#include "engine/plan_internal.h"
#include "model/param_layout.h"

namespace sf {

namespace {

int64_t max_layer_numel(const ModelLayout& l) {
  int64_t m = 0;
  for (int k = 0; k < l.n_layers; ++k) m = std::max(m, l.layer(k).numel);
  return m;
}

// AdamW reads and writes m and v: 16 bytes of the moments' file per parameter and step.
constexpr double kMomentBytesPerParam = 16;

// Forward FLOPs of one token through one layer's projections, and through its attention
// to `ctx` keys on average.
double layer_proj_flops(const ModelConfig& c) {
  double C = double(c.hidden_size), Q = double(c.q_dim()), KV = double(c.kv_dim()),
         F = double(c.intermediate_size);
  return 2 * (C * (Q + 2 * KV) + Q * C + 3 * C * F);
}
// The backward's recompute reruns the forward up to the SwiGLU: every projection but the
// down projection, whose output the backward does not need (model/recipes.h).
double layer_recompute_proj_flops(const ModelConfig& c) {
  return layer_proj_flops(c) - 2 * double(c.intermediate_size) * double(c.hidden_size);
}
double layer_attn_flops(const ModelConfig& c, double ctx) { return 4 * double(c.q_dim()) * ctx; }
double layer_fwd_flops(const ModelConfig& c, double ctx) {
  return layer_proj_flops(c) + layer_attn_flops(c, ctx);
}

}  // namespace

double HardwareModel::attention_rate(double ctx) const {
  // Points (log2 of the sequence length, fraction): (10, 0.75), (12, 0.95), (13, 1).
  const double x = std::log2(std::max(2.0 * ctx, 1.0));
  double f = 1.0;
  if (x <= 10) f = 0.75;
  else if (x <= 12) f = 0.75 + (x - 10) * 0.10;
  else if (x <= 13) f = 0.95 + (x - 12) * 0.05;
  return attention_flops * f;
}

namespace plan_internal {

void predict(const ModelConfig& cfg, const StepRequest& req, const HardwareModel& hw, Plan& p) {
  p.hw = hw;
  ModelLayout l = ModelLayout::build(cfg);
  const double T = double(req.micro_tokens) * req.grad_accum;
  const double ctx = (double(req.max_seq_len) + 1) / 2;  // causal: average keys per query
  const double L = double(l.n_layers), V = double(cfg.vocab_size), C = double(cfg.hidden_size);
  // GEMMs over few tokens run below the sustained rate (fixed costs per layer visit):
  // about 2/3 of it at 1K tokens per chunk, 97% at 16K.
  const double chunk = p.mode == Plan::Mode::sliding && p.engine.max_chunk_tokens > 0
                           ? double(p.engine.max_chunk_tokens) : double(req.micro_tokens);
  const double eff = chunk / (chunk + 512.0);
  // One layer's forward: projections at the GEMM rate, attention at its own (much lower).
  const double fwd_s1 = layer_proj_flops(cfg) * T / eff / hw.device_flops,
               att_s1 = layer_attn_flops(cfg, ctx) * T / hw.attention_rate(ctx);
  const double head = 2 * V * C * T;
  p.model_flops_per_step = 3 * (layer_fwd_flops(cfg, ctx) * T * L + head);
  const double fwd_s = (fwd_s1 + att_s1) * L;
  const bool recompute = !(p.mode == Plan::Mode::resident && p.keep_activations);
  // Backward: twice the projections and 2.5x the attention (+ the recompute: the forward
  // without the down projection). Against the H200 (bench_cuda_layer, 8B layer at 32K
  // tokens): forward 24.4 ms measured / 25.8 predicted, backward 69.3 / 71.6 with recompute,
  // 50.4 / 52.3 without (counting the whole forward again predicted 78.1).
  const double rec_s1 = fwd_s1 * layer_recompute_proj_flops(cfg) / layer_proj_flops(cfg);
  const double bwd_s = (2 * fwd_s1 + 2.5 * att_s1 + (recompute ? rec_s1 + att_s1 : 0.0)) * L;
  const double head_s = 3 * head / hw.device_flops;
  double host_params = double(l.total_numel());  // what the CPU optimizer updates
  if (p.mode == Plan::Mode::sliding)
    for (int k = 0; k < p.engine.device_adamw_layers; ++k) host_params -= double(l.layer(k).numel);
  // Moments on disk that the page cache cannot hold: the sweep goes at the disk's pace when
  // that is slower than the CPU's (none of them counted as cached: a cyclic sweep larger
  // than the cache gets no hits from an LRU).
  double adamw_rate = hw.adamw_params_per_s;
  p.optimizer_disk_bound = false;
  if (p.mode == Plan::Mode::sliding && p.engine.moments_streamed) {
    const double disk_rate = hw.disk_bytes_per_s / kMomentBytesPerParam;
    p.optimizer_disk_bound = disk_rate < adamw_rate;
    adamw_rate = std::min(adamw_rate, disk_rate);
  }
  const double adam_s = host_params / adamw_rate;
  p.optimizer_seconds = adam_s;
  p.compute_seconds = fwd_s + bwd_s + head_s;
  if (p.mode == Plan::Mode::resident) {
    p.transfer_seconds = 0;
    // Host AdamW for the fp32 reference; on a GPU the update is a memory-bound device sweep.
    const bool host_adam = hw.device_flops <= 100e12;
    p.optimizer_seconds = host_adam ? adam_s : 0.0;
    p.step_seconds = p.compute_seconds + p.optimizer_seconds;
    p.clipped_step_seconds = p.step_seconds;
    p.bound = p.optimizer_seconds > 0.05 * p.step_seconds ? Plan::Bound::cpu_optimizer
                                                          : Plan::Bound::gpu_compute;
  } else {
    const double es = double(dtype_size(DType::bf16));
    double layer_bytes = double(max_layer_numel(l)) * es;
    const double streamed = L - double(resident_layer_count(l.n_layers, p.engine));
    double w_fwd = streamed * layer_bytes / hw.h2d_bytes_per_s;
    double w_bwd = std::max(0.0, streamed - p.engine.n_slots) * layer_bytes / hw.h2d_bytes_per_s;
    const double host_act_layers = L - double(p.engine.n_device_act_layers(l.n_layers));
    double acts = host_act_layers * T * C * es / hw.h2d_bytes_per_s;
    double grads = streamed * layer_bytes / hw.d2h_bytes_per_s;
    p.transfer_seconds = w_fwd + w_bwd + 2 * acts + grads;
    // The optimizer runs during the backward for the units it may speculate (at most as
    // long as the backward lasts); the rest is pipelined into the next forward.
    double spec_params = 0;
    if (p.engine.speculative())
      for (int u = 0; u < int(l.units.size()); ++u)
        if (u == 0 || p.engine.has_next(u, int(l.units.size())))
          spec_params += double(l.units[size_t(u)].numel);
    const double bwd_phase = std::max({bwd_s, w_bwd + acts, grads});
    const double in_bwd = std::min(spec_params / adamw_rate, bwd_phase);
    const double fwd_phase = std::max({fwd_s, w_fwd + acts, adam_s - in_bwd});
    // Layer 0's gradient is the backward's last and the next forward needs it first: its
    // host AdamW (which can only start then) is a gap between steps; on the device ~0.
    const double boundary = p.engine.device_adamw_layers > 0
                                ? 0.0 : double(l.layer(0).numel) / adamw_rate;
    p.step_seconds = fwd_phase + head_s + bwd_phase + boundary;
    // Clipped: nothing speculated, so every host unit's AdamW is pipelined into the next
    // forward (8B batch 32 on the H200: 4.07-4.14 s measured against 3.2 s unclipped).
    p.clipped_step_seconds = std::max({fwd_s, w_fwd + acts, adam_s}) + head_s + bwd_phase +
                             boundary;
    // Time beyond the compute, by cause; the larger one names the bound when it is >= 5%.
    const double over_opt = std::max(0.0, adam_s - in_bwd - std::max(fwd_s, w_fwd + acts)) + boundary;
    const double over_xfer = std::max(0.0, w_fwd + acts - std::max(fwd_s, adam_s - in_bwd)) +
                             std::max(0.0, std::max(w_bwd + acts, grads) - bwd_s);
    p.bound = std::max(over_opt, over_xfer) < 0.05 * p.step_seconds ? Plan::Bound::gpu_compute
              : over_opt >= over_xfer                                ? Plan::Bound::cpu_optimizer
                                                                     : Plan::Bound::transfers;
  }
  p.tokens_per_second = T / p.step_seconds;
}

}  // namespace plan_internal

}  // namespace sf
