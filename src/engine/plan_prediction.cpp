// The step-time prediction: the FLOPs of a step (projections, causal attention, the LM head,
// the backward's recompute, less the attention of kept-attention layers), HardwareModel::attention_rate, and predict, which turns a plan's
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

// HBM bytes per second a memory-bound kernel moves (the H200: ~4.8 TB/s peak).
constexpr double kDeviceBytesPerS = 3.5e12;

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

namespace {

// The step's shape as the prediction counts it.
struct StepShape {
  double T = 0;    // tokens per optimizer step
  double ctx = 0;  // causal: average keys per query
  double L = 0;    // layers
};

StepShape step_shape(const ModelLayout& l, const StepRequest& req) {
  StepShape s;
  s.T = double(req.micro_tokens) * req.grad_accum;
  s.ctx = (double(req.max_seq_len) + 1) / 2;
  s.L = double(l.n_layers);
  return s;
}

double lm_head_fwd_flops(const ModelConfig& c, double T) {
  return 2 * double(c.vocab_size) * double(c.hidden_size) * T;
}

// 6 N T + causal attention (no recompute): what "model TFLOP/s" counts.
double model_flops_per_step(const ModelConfig& cfg, const StepShape& s) {
  return 3 * (layer_fwd_flops(cfg, s.ctx) * s.T * s.L + lm_head_fwd_flops(cfg, s.T));
}

// GEMMs over few tokens run below the sustained rate (fixed costs per layer visit):
// about 2/3 of it at 1K tokens per chunk, 97% at 16K.
double gemm_efficiency_at(double chunk) { return chunk / (chunk + 512.0); }

double gemm_efficiency(const StepRequest& req, const Plan& p) {
  const double chunk = p.mode == Plan::Mode::sliding && p.engine.max_chunk_tokens > 0
                           ? double(p.engine.max_chunk_tokens) : double(req.micro_tokens);
  return gemm_efficiency_at(chunk);
}

// What the backward reruns of the layers' forward: every layer's (projections and attention)
// unless a resident plan keeps every layer's activations; a window's kept-attention layers
// rerun their projections but not their attention; and the whole forward of a layer below
// each one whose input was not saved (its replay, EngineConfig::checkpoint_every).
struct Recomputed {
  double layers = 0, attention_layers = 0, replayed = 0;
};

Recomputed recomputed_of(const Plan& p, double L) {
  if (p.mode == Plan::Mode::resident) return p.keep_activations ? Recomputed{0, 0} : Recomputed{L, L};
  const double kept = std::min(double(p.engine.kept_attention_layers), L);
  return {L, L - kept, L - double(p.engine.n_saved_inputs(int(L)))};
}

// Seconds of GPU compute per optimizer step.
struct ComputeTimes {
  double fwd_s = 0, bwd_s = 0, head_s = 0;
  double total() const { return fwd_s + bwd_s + head_s; }
};

ComputeTimes compute_times(const ModelConfig& cfg, const StepShape& s, const HardwareModel& hw,
                           double gemm_eff, Recomputed rec) {
  // One layer's forward: projections at the GEMM rate, attention at its own (much lower).
  const double fwd_s1 = layer_proj_flops(cfg) * s.T / gemm_eff / hw.device_flops,
               att_s1 = layer_attn_flops(cfg, s.ctx) * s.T / hw.attention_rate(s.ctx);
  // Backward: twice the projections and 2.5x the attention (+ the recompute: the forward
  // without the down projection, and without the attention where it is kept). Against the
  // H200 (bench_cuda_layer, 8B layer at 32K tokens): forward 24.4 ms measured / 25.8
  // predicted, backward 69.3 / 71.6 with recompute, 50.4 / 52.3 without (counting the whole
  // forward again predicted 78.1).
  const double rec_s1 = fwd_s1 * layer_recompute_proj_flops(cfg) / layer_proj_flops(cfg);
  ComputeTimes c;
  c.fwd_s = (fwd_s1 + att_s1) * s.L;
  c.bwd_s = (2 * fwd_s1 + 2.5 * att_s1) * s.L + rec_s1 * rec.layers + att_s1 * rec.attention_layers +
            (fwd_s1 + att_s1) * rec.replayed;
  c.head_s = 3 * lm_head_fwd_flops(cfg, s.T) / hw.device_flops;
  return c;
}

// What the CPU optimizer updates: every parameter but the device-AdamW layers'.
double host_adamw_params(const ModelLayout& l, const Plan& p) {
  double host_params = double(l.total_numel());
  if (p.mode == Plan::Mode::sliding)
    for (int k = 0; k < p.engine.device_adamw_layers; ++k) host_params -= double(l.layer(k).numel);
  return host_params;
}

struct AdamWRate {
  double params_per_s = 0;
  bool disk_bound = false;  // the moments' disk, not the CPU, sets it
};

// State on disk that the page cache cannot hold (streamed): the sweep goes at the disk's
// pace when that is slower than the CPU's (none of it counted as cached: a cyclic sweep
// larger than the cache gets no hits from an LRU), its bytes read and written. Cached, the
// reads hit the page cache but every byte the sweep rewrites still goes to the disk: the
// kernel throttles the writer to the disk's pace once the dirty pages pass its limit (a
// tenth to a fifth of RAM), so the bytes written once bound it (measured on the H200
// machine: a 48 GiB file rewritten each step, its sweep took ~22 s at the disk's ~2.3 GB/s).
// With only some units on disk, the disk reads the next of them while the CPU updates the
// units in RAM: the sweep takes the longer of the CPU's time for all and the disk's.
AdamWRate host_adamw_rate(const HardwareModel& hw, const Plan& p, double host_params) {
  AdamWRate r{hw.adamw_params_per_s, false};
  if (p.mode == Plan::Mode::sliding && p.disk_bytes > 0) {
    const double passes = p.engine.moments_streamed ? 2.0 : 1.0;
    const double disk_s = passes * double(p.disk_bytes) / hw.disk_bytes_per_s;
    const double cpu_s = host_params / hw.adamw_params_per_s;
    r.disk_bound = disk_s > cpu_s;
    if (r.disk_bound) r.params_per_s = host_params / disk_s;
  }
  return r;
}

void predict_resident(const HardwareModel& hw, double adam_s, Plan& p) {
  p.transfer_seconds = 0;
  // Host AdamW for the fp32 reference; on a GPU the update is a memory-bound device sweep.
  const bool host_adam = hw.device_flops <= 100e12;
  p.optimizer_seconds = host_adam ? adam_s : 0.0;
  p.step_seconds = p.compute_seconds + p.optimizer_seconds;
  p.clipped_step_seconds = p.step_seconds;
  p.bound = p.optimizer_seconds > 0.05 * p.step_seconds ? Plan::Bound::cpu_optimizer
                                                        : Plan::Bound::gpu_compute;
}

// Seconds per optimizer step over PCIe of a sliding window: the streamed layers' weights in
// the forward and (beyond the slots) again in the backward, the host-stored activations and
// kept attention (out in the forward, back in the backward; a replayed segment's first input
// comes back twice: for the replay, then for its backward) and the streamed layers' gradients.
struct TransferTimes {
  double w_fwd = 0, w_bwd = 0, acts = 0, grads = 0;
  double total() const { return w_fwd + w_bwd + 2 * acts + grads; }
};

TransferTimes transfer_times(const ModelConfig& cfg, const ModelLayout& l, double T,
                             const HardwareModel& hw, const EngineConfig& e) {
  const double L = double(l.n_layers), C = double(cfg.hidden_size);
  const double es = double(dtype_size(DType::bf16));
  // From an fp32 master the weights cross PCIe in fp32 (cast on the device), from a bf16 one
  // as they are; gradients in the compute dtype.
  const double w_es = e.from_master() ? (e.bf16_master() ? 2.0 : 4.0) : es;
  const double layer_bytes = double(max_layer_numel(l)) * w_es;
  const double grad_bytes = double(max_layer_numel(l)) * es;
  const double streamed = L - double(plan_internal::resident_layer_count(l.n_layers, e));
  double host_act_layers = 0, replay_fetches = 0;  // host-stored inputs: saved, fetched for a replay
  for (int k = 0; k < l.n_layers; ++k) {
    if (!e.saves_input(k) || e.act_on_device(k)) continue;
    ++host_act_layers;
    replay_fetches += k + 1 < l.n_layers && !e.saves_input(k + 1);
  }
  TransferTimes x;
  x.w_fwd = streamed * layer_bytes / hw.h2d_bytes_per_s;
  x.w_bwd = (std::max(0.0, streamed - e.n_slots) * layer_bytes + replay_fetches * T * C * es) / hw.h2d_bytes_per_s;
  // A host-kept layer's att [T, Q] and lse [Hq, T] f32.
  const double host_kept_layers = e.kept_attention_on_device ? 0.0 : std::min(double(e.kept_attention_layers), L);
  const double kept_bytes = T * (double(cfg.q_dim()) * es + double(cfg.num_attention_heads) * 4);
  x.acts = (host_act_layers * T * C * es + host_kept_layers * kept_bytes) / hw.h2d_bytes_per_s;
  x.grads = streamed * grad_bytes / hw.d2h_bytes_per_s;
  return x;
}

// Parameters of the units whose host AdamW may run during the backward (speculation).
double speculated_params(const ModelLayout& l, const EngineConfig& e) {
  double spec_params = 0;
  if (e.speculative())
    for (int u = 0; u < int(l.units.size()); ++u)
      if ((u == 0 && e.state_format.is_fp32()) || e.has_next(u, int(l.units.size())))
        spec_params += double(l.units[size_t(u)].numel);
  return spec_params;
}

// Seconds of host AdamW per step: all of it, the part that runs during the backward, and
// layer 0's, a gap between steps.
struct OptimizerTimes {
  double adam_s = 0, in_bwd = 0, boundary = 0;
};

// Time beyond the compute, by cause; the larger one names the bound when it is >= 5%.
Plan::Bound sliding_bound(const ComputeTimes& c, const TransferTimes& x, const OptimizerTimes& o,
                          double step_seconds) {
  const double over_opt = std::max(0.0, o.adam_s - o.in_bwd - std::max(c.fwd_s, x.w_fwd + x.acts)) +
                          o.boundary;
  const double over_xfer = std::max(0.0, x.w_fwd + x.acts - std::max(c.fwd_s, o.adam_s - o.in_bwd)) +
                           std::max(0.0, std::max(x.w_bwd + x.acts, x.grads) - c.bwd_s);
  return std::max(over_opt, over_xfer) < 0.05 * step_seconds ? Plan::Bound::gpu_compute
         : over_opt >= over_xfer                             ? Plan::Bound::cpu_optimizer
                                                             : Plan::Bound::transfers;
}

// Landing: the optimizer's share that runs in the backward is paid only where it outlasts
// the backward's compute and transfers; layer 0's and the touched rows' follow it in full.
Plan::Bound landing_bound(const ComputeTimes& c, const TransferTimes& x, const OptimizerTimes& o,
                          double step_seconds) {
  const double bwd_xfer = std::max(x.w_bwd + x.acts, x.grads);
  const double over_opt = std::max(0.0, o.in_bwd - std::max(c.bwd_s, bwd_xfer)) + o.boundary;
  const double over_xfer = std::max(0.0, x.w_fwd + x.acts - c.fwd_s) +
                           std::max(0.0, bwd_xfer - std::max(c.bwd_s, o.in_bwd));
  return std::max(over_opt, over_xfer) < 0.05 * step_seconds ? Plan::Bound::gpu_compute
         : over_opt >= over_xfer                             ? Plan::Bound::cpu_optimizer
                                                             : Plan::Bound::transfers;
}

// Each gradient applied as it lands: the layers' and the head's AdamW (and the untouched
// embedding rows') run during the backward, which cannot outrun them by more than the ring's
// two layers; layer 0's and the touched embedding rows' follow it, before the next forward.
void predict_landing(const ModelConfig& cfg, const ModelLayout& l, const ComputeTimes& c,
                     const TransferTimes& x, double adamw_rate, double adam_s, double step_tokens,
                     Plan& p) {
  p.transfer_seconds = x.total();
  OptimizerTimes o;
  o.adam_s = adam_s;
  const double touched = std::min(step_tokens, double(cfg.vocab_size)) * double(cfg.hidden_size);
  o.boundary = (double(l.layer(0).numel) + touched) / adamw_rate;
  o.in_bwd = std::max(0.0, adam_s - o.boundary);
  const double bwd_phase = std::max({c.bwd_s, x.w_bwd + x.acts, x.grads, o.in_bwd});
  const double fwd_phase = std::max(c.fwd_s, x.w_fwd + x.acts);
  p.step_seconds = fwd_phase + c.head_s + bwd_phase + o.boundary;
  p.clipped_step_seconds = p.step_seconds;  // such a plan never clips
  p.bound = landing_bound(c, x, o, p.step_seconds);
}

void predict_sliding(const ModelLayout& l, const ComputeTimes& c, const TransferTimes& x,
                     double adamw_rate, double adam_s, Plan& p) {
  p.transfer_seconds = x.total();
  // The optimizer runs during the backward for the units it may speculate (at most as
  // long as the backward lasts); the rest is pipelined into the next forward.
  const double bwd_phase = std::max({c.bwd_s, x.w_bwd + x.acts, x.grads});
  OptimizerTimes o;
  o.adam_s = adam_s;
  o.in_bwd = std::min(speculated_params(l, p.engine) / adamw_rate, bwd_phase);
  const double fwd_phase = std::max({c.fwd_s, x.w_fwd + x.acts, o.adam_s - o.in_bwd});
  // Layer 0's gradient is the backward's last and the next forward needs it first: its
  // host AdamW (which can only start then) is a gap between steps; on the device ~0.
  o.boundary = p.engine.device_adamw_layers > 0 ? 0.0 : double(l.layer(0).numel) / adamw_rate;
  p.step_seconds = fwd_phase + c.head_s + bwd_phase + o.boundary;
  // Clipped: nothing speculated, so every host unit's AdamW is pipelined into the next
  // forward (8B batch 32 on the H200: 4.07-4.14 s measured against 3.2 s unclipped).
  p.clipped_step_seconds = std::max({c.fwd_s, x.w_fwd + x.acts, o.adam_s}) + c.head_s + bwd_phase +
                           o.boundary;
  p.bound = sliding_bound(c, x, o, p.step_seconds);
}

}  // namespace

namespace plan_internal {

double kept_attention_share(const ModelConfig& cfg, const StepRequest& req, const HardwareModel& hw) {
  const StepShape s = step_shape(ModelLayout::build(cfg), req);
  const double eff = gemm_efficiency_at(double(req.micro_tokens));  // a chunk of the whole micro-batch
  const ComputeTimes all = compute_times(cfg, s, hw, eff, {s.L, s.L});
  const ComputeTimes kept = compute_times(cfg, s, hw, eff, {s.L, 0});
  return all.total() > 0 ? 1.0 - kept.total() / all.total() : 0.0;
}

void predict(const ModelConfig& cfg, const StepRequest& req, const HardwareModel& hw, Plan& p) {
  p.hw = hw;
  const ModelLayout l = ModelLayout::build(cfg);
  const StepShape s = step_shape(l, req);
  p.model_flops_per_step = model_flops_per_step(cfg, s);
  ComputeTimes c = compute_times(cfg, s, hw, gemm_efficiency(req, p), recomputed_of(p, s.L));
  // One layer gradient buffer: each layer's backward first waits for the previous layer's
  // cast (f32 read, bf16 written, at the HBM rate).
  if (p.mode == Plan::Mode::sliding && p.engine.layer_grad_buffers == 1)
    c.bwd_s += s.L * double(max_layer_numel(l)) * 6 / kDeviceBytesPerS;
  const double host_params = host_adamw_params(l, p);
  const AdamWRate rate = host_adamw_rate(hw, p, host_params);
  p.optimizer_disk_bound = rate.disk_bound;
  const double adam_s = host_params / rate.params_per_s;
  p.optimizer_seconds = adam_s;
  p.compute_seconds = c.total();
  if (p.mode == Plan::Mode::resident)
    predict_resident(hw, adam_s, p);
  else if (p.engine.from_master())
    predict_landing(cfg, l, c, transfer_times(cfg, l, s.T, hw, p.engine), rate.params_per_s, adam_s, s.T, p);
  else
    predict_sliding(l, c, transfer_times(cfg, l, s.T, hw, p.engine), rate.params_per_s, adam_s, p);
  p.tokens_per_second = s.T / p.step_seconds;
}

}  // namespace plan_internal

}  // namespace sf
