#include "engine/planner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "backend/host/host_backend.h"
#include "core/error.h"
#include "core/stopwatch.h"
#include "core/thread_pool.h"
#include "engine/embedding_grad.h"  // EmbeddingGrad::max_rows
#include "optim/param_store.h"
#include "engine/window_buffers.h"
#include "model/device_batch.h"
#include "model/recipes.h"
#include "optim/adamw.h"

namespace sf {

namespace {

size_t dev_round(size_t b) { return (std::max<size_t>(b, 1) + 255) / 256 * 256; }

// cuBLASLt + reduction workspaces the CUDA backend creates per stream that computes.
constexpr size_t kBackendWorkspace = (size_t(32) << 20) + (size_t(8) << 20);

// Layers whose home is on the device: the last resident_layers and the first
// device_adamw_layers (which may overlap).
int resident_layer_count(int n_layers, const EngineConfig& ec) {
  return ec.resident_layers + std::min(ec.device_adamw_layers, n_layers - ec.resident_layers);
}

int64_t max_layer_numel(const ModelLayout& l) {
  int64_t m = 0;
  for (int k = 0; k < l.n_layers; ++k) m = std::max(m, l.layer(k).numel);
  return m;
}

void total(Plan& p) {
  p.device_bytes = p.host_bytes = p.disk_bytes = 0;
  for (auto& l : p.lines) (l.disk ? p.disk_bytes : l.device ? p.device_bytes : p.host_bytes) += l.bytes;
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

// A host-backend step's FLOPs (as predict() counts them) run at this share of the probe's
// fp32 GEMM rate. On the 2-core dev box: tiny preset 4 x 256 2,264 tokens/s measured vs 1,972
// predicted, small preset 2 x 512 387 vs 436 (the 0.5 used before predicted 2-3x too slow).
constexpr double kHostStepShareOfGemm = 1.0;

HardwareModel HardwareModel::host_default() {
  HardwareModel hw;
  HostBackend be;
  const int64_t n = 512;
  std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), c(size_t(n * n));
  Mat A(a.data(), DType::f32, n, n), B(b.data(), DType::f32, n, n), Cm(c.data(), DType::f32, n, n);
  be.gemm(be.default_stream(), Cm, A, Trans::no, B, Trans::yes, 1.f, 0.f);  // warm up
  auto t0 = std::chrono::steady_clock::now();
  const int reps = 4;
  for (int i = 0; i < reps; ++i) be.gemm(be.default_stream(), Cm, A, Trans::no, B, Trans::yes, 1.f, 0.f);
  double s = seconds_since(t0);
  const double gemm = reps * 2.0 * double(n * n * n) / std::max(s, 1e-9);
  hw.device_flops = kHostStepShareOfGemm * gemm;
  hw.attention_flops = hw.device_flops;
  hw.h2d_bytes_per_s = hw.d2h_bytes_per_s = 10e9;  // memcpy on the host
  hw.adamw_params_per_s = 0.4e9 * double(host_pool().size());
  hw.source = cat("measured on this host: fp32 GEMM ", int(gemm / 1e9), " GFLOP/s");
  return hw;
}

HardwareModel HardwareModel::device_default() {
  HardwareModel hw;
  // The engine's optimizer pool: every core but one. 32M parameters, bf16 gradient in and
  // bf16 weights out as in training; the best of three sweeps after a warm-up.
  ThreadPool pool(std::max(1, host_pool().size() - 1));
  const int64_t n = int64_t(1) << 25;
  std::vector<float> p(size_t(n), 0.01f), m(size_t(n), 0.f), v(size_t(n), 0.f);
  std::vector<uint16_t> g(size_t(n), f32_to_bf16(1e-3f));
  std::vector<uint16_t> out(static_cast<size_t>(n));
  AdamWStep st;
  st.lr = 1e-5f;
  double best = 1e9;
  for (int rep = 0; rep < 4; ++rep) {
    st.step = rep + 1;
    const auto t0 = std::chrono::steady_clock::now();
    adamw_update(p.data(), m.data(), v.data(), g.data(), out.data(), n, st, &pool);
    const double sec = seconds_since(t0);
    if (rep > 0) best = std::min(best, sec);
  }
  hw.adamw_params_per_s = double(n) / std::max(best, 1e-6);
  return hw;
}

std::vector<MemoryLine> sliding_memory(const ModelConfig& cfg, const EngineConfig& ec, DType cd) {
  ModelLayout l = ModelLayout::build(cfg);
  std::vector<MemoryLine> m;
  size_t state = 0;
  for (const Unit& u : l.units) state += 3 * size_t(u.numel) * 4;
  if (ec.moments_dir.empty()) {
    m.push_back({"fp32 master + AdamW m, v", state, false});
  } else {
    m.push_back({"fp32 master", state / 3, false});
    m.push_back({"AdamW m, v (a file in --optimizer-dir)", moments_file_bytes(state_units(l)), false, true});
  }
  // The buffers, one line per label in the list's order, host lines first.
  std::vector<MemoryLine> dev;
  for (const BufferSpec& s : window_buffer_specs(cfg, ec, cd)) {
    const bool on_device = s.tier == Tier::device;
    std::vector<MemoryLine>& to = on_device ? dev : m;
    auto it = std::find_if(to.begin(), to.end(), [&](const MemoryLine& x) { return x.what == s.line; });
    if (it == to.end()) it = to.insert(to.end(), MemoryLine{s.line, 0, on_device});
    it->bytes += tier_bytes(s);
  }
  m.insert(m.end(), dev.begin(), dev.end());
  // Streams that run compute ops: compute, grads (casts and norms, EngineConfig::grads_stream;
  // counted either way), update (device AdamW).
  m.push_back({"backend workspaces", 3 * kBackendWorkspace, true});
  return m;
}

int64_t head_chunk_rows_for(const ModelConfig& cfg, int64_t T, DType cd) {
  const int64_t base = std::min<int64_t>(256, std::max<int64_t>(1, T));
  if (cd == DType::f32) return base;
  const size_t layer = layer_acts_bytes(cfg, T, cd);
  for (int64_t r = 4096; r > 256; r /= 2)
    if (r <= T && head_acts_bytes(cfg, T, cd, r) <= layer) return r;
  return base;
}

std::vector<MemoryLine> resident_memory(const ModelConfig& cfg, int64_t T, DType cd, bool keep,
                                        int64_t head_rows) {
  // The fp32 master and AdamW moments live on the device when the compute dtype is reduced
  // (CUDA: DeviceResidentExecutor), on the host for the fp32 reference (ResidentExecutor).
  const bool state_on_device = cd != DType::f32;
  ModelLayout l = ModelLayout::build(cfg);
  const size_t es = dtype_size(cd), C = size_t(cfg.hidden_size);
  size_t w = 0, g = 0, state = 0, dev_state = 0, host_g = 0;
  for (auto& u : l.units) {
    w += dev_round(size_t(u.numel) * es);
    g += dev_round(size_t(u.numel) * 4);
    state += 3 * size_t(u.numel) * 4;
    dev_state += 3 * dev_round(size_t(u.numel) * 4);
    host_g += size_t(u.numel) * 4;
  }
  size_t x = size_t(T) * C * es;
  int64_t rows = std::min<int64_t>(head_rows, T);
  std::vector<MemoryLine> m = {
      {state_on_device ? "fp32 master + AdamW m, v (checkpoint copy)" : "fp32 master + AdamW m, v",
       state, false}};
  if (state_on_device) m.push_back({"fp32 master + AdamW m, v", dev_state, true});
  else m.push_back({"gradient copy (f32)", host_g, false});
  for (MemoryLine line : std::vector<MemoryLine>{
           {"weights (compute dtype)", w, true},
           {"gradients (f32)", g, true},
           {"layer inputs + activation gradient", dev_round(x * size_t(l.n_layers + 1)) + dev_round(x), true},
           keep ? MemoryLine{cat("kept activations (", l.n_layers, " layers) + head scratch"),
                             size_t(l.n_layers) * dev_round(layer_acts_bytes(cfg, T, cd)) +
                                 dev_round(head_acts_bytes(cfg, T, cd, rows)),
                             true}
                : MemoryLine{"layer/head scratch",
                             dev_round(std::max(layer_acts_bytes(cfg, T, cd), head_acts_bytes(cfg, T, cd, rows))),
                             true},
           {"batch inputs + loss", dev_round(DeviceBatch::storage_bytes(cfg, T)) + dev_round(4) * 2, true},
           {"backend workspaces", kBackendWorkspace, true}})
    m.push_back(line);
  return m;
}

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

// Bytes beyond the budgets, summed over the tiers: the candidate that misses by least is
// the one the refusal describes (the smallest total needed once described a device-store
// window 8 GiB over when a host-store one was 0.2 GiB over).
size_t overshoot(const Budget& b, const Plan& p) {
  auto over = [](size_t need, size_t have) { return need > have ? need - have : 0; };
  const size_t disk = over(p.disk_bytes, b.moments_dir_free);
  if (b.unified) return over(p.device_bytes + p.host_bytes, b.host_bytes) + disk;
  return over(p.device_bytes, b.device_bytes) + over(p.host_bytes, b.host_bytes) + disk;
}

bool fits(const Budget& b, const Plan& p) {
  if (p.disk_bytes > b.moments_dir_free) return false;
  if (b.unified) return p.device_bytes + p.host_bytes <= b.host_bytes;
  return p.device_bytes <= b.device_bytes && p.host_bytes <= b.host_bytes;
}

// Overlap the optimizer with the backward (speculative update) with "next" buffers for as
// many units as the host budget holds (first layers first, see EngineConfig::next_units);
// off when not even one fits (a reduced compute dtype needs them).
void choose_speculation(const ModelConfig& cfg, const Budget& budget, DType cd, Plan& p) {
  const int n_units = cfg.num_hidden_layers + 2;
  auto with = [&](EngineConfig::Speculation sp, int next_units) {
    p.engine.speculation = sp;
    p.engine.next_units = next_units;
    p.lines = sliding_memory(cfg, p.engine, cd);
    total(p);
    return fits(budget, p);
  };
  if (with(EngineConfig::Speculation::always, -1)) return;
  int lo = 0, hi = n_units - 1;  // most units with a next buffer that still fit
  while (lo < hi) {
    int mid = (lo + hi + 1) / 2;
    if (with(EngineConfig::Speculation::always, mid)) lo = mid;
    else hi = mid - 1;
  }
  if (lo > 0 || cd == DType::f32) with(EngineConfig::Speculation::always, lo);
  else with(EngineConfig::Speculation::off, -1);
}

}  // namespace

namespace {
Plan plan_step(const ModelConfig& cfg, const StepRequest& req, const Budget& budget, DType cd,
               const HardwareModel& hw, bool allow_resident, int device_adamw_layers,
               bool suggest_batch);
}  // namespace

Plan make_plan(const ModelConfig& cfg, const StepRequest& req, const Budget& budget, DType cd,
               const HardwareModel& hw, bool allow_resident, int device_adamw_layers) {
  return plan_step(cfg, req, budget, cd, hw, allow_resident, device_adamw_layers, true);
}

namespace {

// make_plan; suggest_batch: when nothing fits, search the largest batch that does (not in
// the search's own plans).
Plan plan_step(const ModelConfig& cfg, const StepRequest& req, const Budget& budget, DType cd,
               const HardwareModel& hw, bool allow_resident, int device_adamw_layers,
               bool suggest_batch) {
  SF_REQUIRE(req.micro_tokens > 0 && req.grad_accum > 0, "plan: empty batch");
  SF_REQUIRE(device_adamw_layers <= 0 || cd != DType::f32,
             "AdamW on the device for some layers needs a GPU backend (the host reference "
             "computes in fp32 and keeps all state in host memory)");
  SF_REQUIRE(device_adamw_layers <= cfg.num_hidden_layers,
             "--device-adamw-layers ", device_adamw_layers, " is more than the model's ",
             cfg.num_hidden_layers, " layers");
  Plan best;
  // 1. Everything resident, if it fits: no transfers at all; every layer's activations kept
  //    (no recompute) if that fits too.
  //    The larger LM-head chunk first (with kept activations its scratch is its own).
  const int64_t head_rows = head_chunk_rows_for(cfg, req.micro_tokens, cd);
  for (auto [keep, rows] : {std::pair{true, head_rows}, std::pair{true, int64_t(256)},
                            std::pair{false, head_rows}}) {
    Plan res;
    res.mode = Plan::Mode::resident;
    res.keep_activations = keep;
    res.engine.head_chunk_rows = rows;
    res.lines = resident_memory(cfg, req.micro_tokens, cd, keep, rows);
    total(res);
    res.fits = fits(budget, res);
    if (res.fits && allow_resident) {
      predict(cfg, req, hw, res);
      return res;
    }
  }
  // 2. Sliding window. Candidates: activation store on the device, on the host, or split
  //    (as many layers on the device as fit); 3 or 2 slots; chunks from the whole
  //    micro-batch halved down to the longest sequence. For each that fits, as many layers'
  //    homes resident as the device budget allows (no transfers for those; the head's home
  //    is resident with a reduced-precision compute dtype), and the speculative update with
  //    as many "next" buffers as the host holds. The fastest predicted candidate wins.
  const bool head_res = cd != DType::f32;
  Plan chosen;
  // Resident homes move bytes from the host to the device: take as many as the device
  // holds, then ask whether the host holds the rest.
  auto device_fits = [&](const Plan& q) {
    return budget.unified ? fits(budget, q) : q.device_bytes <= budget.device_bytes;
  };
  auto consider = [&](Plan p) {
    if (device_fits(p)) {
      int lo = 0, hi = int(cfg.num_hidden_layers);  // most resident layers that still fit
      while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        Plan q = p;
        q.engine.resident_layers = mid;
        q.lines = sliding_memory(cfg, q.engine, cd);
        total(q);
        if (device_fits(q)) lo = mid;
        else hi = mid - 1;
      }
      p.engine.resident_layers = lo;
      p.lines = sliding_memory(cfg, p.engine, cd);
      total(p);
    }
    p.fits = fits(budget, p);
    if (!p.fits) {
      if (best.lines.empty() || overshoot(budget, p) < overshoot(budget, best)) best = p;
      return;
    }
    choose_speculation(cfg, budget, cd, p);
    if (!p.engine.moments_dir.empty()) {
      // Cached if the page cache beyond the budget and the budget's unused part hold them.
      const size_t used = p.host_bytes + (budget.unified ? p.device_bytes : 0);
      const size_t slack = budget.host_bytes > used ? budget.host_bytes - used : 0;
      p.engine.moments_streamed = p.disk_bytes > budget.page_cache_bytes + slack;
    }
    predict(cfg, req, hw, p);
    // Ties (within 0.5%) go to less GPU work (slack for the optimizer's contention), then
    // to less host memory.
    auto tie = [](double a, double b) { return a <= b * 1.005 && b <= a * 1.005; };
    bool better = chosen.lines.empty() || p.step_seconds < chosen.step_seconds * 0.995;
    if (!better && tie(p.step_seconds, chosen.step_seconds))
      better = p.compute_seconds < chosen.compute_seconds * 0.995 ||
               (tie(p.compute_seconds, chosen.compute_seconds) && p.host_bytes < chosen.host_bytes);
    if (better) chosen = p;
  };
  // The AdamW moments go to --optimizer-dir's disk only when nothing fits with them in RAM.
  std::vector<std::string> moments_homes = {std::string()};
  if (!budget.moments_dir.empty()) moments_homes.push_back(budget.moments_dir);
  for (const std::string& moments_dir : moments_homes) {
    if (!chosen.lines.empty()) break;
    for (int acts : {0, 1, 2}) {  // device, host, split
      for (int slots : {3, 2}) {
        for (int64_t chunk = req.micro_tokens; chunk >= std::max<int64_t>(1, req.max_seq_len);
             chunk /= 2) {
          Plan p;
          p.mode = Plan::Mode::sliding;
          p.engine.moments_dir = moments_dir;
          p.engine.n_slots = slots;
          p.engine.max_chunk_tokens = chunk;
          p.engine.head_chunk_rows = head_chunk_rows_for(cfg, chunk, cd);
          p.engine.max_chunks = int((req.micro_tokens + chunk - 1) / chunk) * req.grad_accum;
          p.engine.activations_on_device = acts == 0;
          p.engine.head_resident = head_res;
          if (acts == 2) {
            int lo = -1, hi = int(cfg.num_hidden_layers);  // most device layers that fit the device
            while (lo < hi) {
              int mid = (lo + hi + 1) / 2;
              p.engine.device_act_layers = mid;
              p.lines = sliding_memory(cfg, p.engine, cd);
              total(p);
              if (budget.unified || p.device_bytes <= budget.device_bytes) lo = mid;
              else hi = mid - 1;
            }
            if (lo <= 0 || lo >= cfg.num_hidden_layers) continue;  // not a split: covered above
            p.engine.device_act_layers = lo;
          }
          p.lines = sliding_memory(cfg, p.engine, cd);
          total(p);
          // The first layers' optimizer on the device (forced, or a few counts on a GPU; the
          // planner's prediction weighs their memory against homes and the CPU's work).
          std::vector<int> counts;
          if (device_adamw_layers >= 0) counts = {device_adamw_layers};
          else if (cd == DType::f32) counts = {0};
          else
            for (int d : {0, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128})
              if (d <= cfg.num_hidden_layers) counts.push_back(d);
          for (int d : counts) {
            Plan q = p;
            q.engine.device_adamw_layers = d;
            q.lines = sliding_memory(cfg, q.engine, cd);
            total(q);
            if (d > 0 && !device_fits(q)) {  // more will not fit either
              if (device_adamw_layers >= 0) consider(q);  // forced: kept for the advice
              break;
            }
            consider(q);
          }
          if (chunk == 1) break;
        }
      }
    }
  }
  if (!chosen.lines.empty()) return chosen;
  // 3. Nothing fits: say which tier is short and what to change.
  predict(cfg, req, hw, best);
  std::ostringstream a;
  const ModelLayout layout = ModelLayout::build(cfg);
  const size_t moments = moments_file_bytes(state_units(layout));
  // The host backend's "device" is host memory too: one pool (Budget::unified).
  const size_t host_need = best.host_bytes + (budget.unified ? best.device_bytes : 0);
  if (host_need > budget.host_bytes) {
    a << "host memory: needs " << format_bytes(host_need) << " but the budget is "
      << format_bytes(budget.host_bytes) << " (" << best.lines[0].what << " alone is "
      << format_bytes(best.lines[0].bytes) << "); add RAM, raise --host-memory, ";
    if (budget.moments_dir.empty() && best.mode == Plan::Mode::sliding)
      a << "keep the AdamW moments (" << format_bytes(moments)
        << ") on a fast disk with --optimizer-dir DIR, ";
    a << "or choose a smaller model. ";
  }
  // Said whichever candidate is described: the directory given cannot take the moments.
  if (!budget.moments_dir.empty() && moments > budget.moments_dir_free)
    a << "--optimizer-dir " << budget.moments_dir << ": the AdamW moments need "
      << format_bytes(moments) << " but " << format_bytes(budget.moments_dir_free)
      << " are free there; free space or choose another directory. ";
  if (!budget.unified && best.device_bytes > budget.device_bytes)
    a << "device memory: even the smallest window needs " << format_bytes(best.device_bytes)
      << " but the budget is " << format_bytes(budget.device_bytes)
      << "; lower --batch-size or --seq-len, or raise --gpu-memory"
      << (device_adamw_layers > 0 ? cat(", or lower --device-adamw-layers (", device_adamw_layers,
                                        " layers' optimizer state on the device)")
                                  : std::string())
      << ".";
  // What does fit: the largest batch of sequences this long (the same tokens per optimizer
  // step come back through --grad-accum). A plan is monotone in the batch: a bisection.
  const int64_t seq = req.max_seq_len > 0 ? std::min(req.max_seq_len, req.micro_tokens)
                                          : req.micro_tokens;
  const int64_t rows = req.micro_tokens / seq;
  if (suggest_batch && rows > 1) {
    auto fits_rows = [&](int64_t r) {
      StepRequest q = req;
      q.micro_tokens = r * seq;
      return plan_step(cfg, q, budget, cd, hw, allow_resident, device_adamw_layers, false).fits;
    };
    int64_t lo = 0, hi = rows - 1;  // the largest batch in [1, rows) that fits; 0: none
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (fits_rows(mid)) lo = mid;
      else hi = mid - 1;
    }
    if (lo > 0)
      a << " What fits: --batch-size " << lo << " at --seq-len " << seq
        << " (--grad-accum " << (rows * req.grad_accum + lo - 1) / lo
        << " keeps about the same tokens per optimizer step).";
  }
  best.fits = false;
  best.advice = a.str();
  return best;
}

}  // namespace

std::string describe_plan(const ModelConfig& cfg, const StepRequest& req, const Budget& budget,
                          const Plan& p, bool summary) {
  std::ostringstream os;
  os << std::fixed;
  const double T = double(req.micro_tokens) * req.grad_accum;
  if (!summary) {
    os << "model      " << arch_name(cfg.arch) << ", " << std::setprecision(2)
       << double(cfg.num_parameters()) / 1e9 << " B parameters, " << cfg.num_hidden_layers
       << " layers\n";
    os << "step       " << req.grad_accum << " x " << req.micro_tokens << " tokens = "
       << int64_t(T) << " tokens per optimizer step\n";
  }
  if (p.mode == Plan::Mode::resident) {
    os << "mode       resident: the whole model stays on the device"
       << (p.keep_activations ? ", every layer's activations kept (no recompute)" : "") << "\n";
  } else {
    os << "mode       sliding window: " << p.engine.n_slots << " weight slots, "
       << resident_layer_count(cfg.num_hidden_layers, p.engine) << " of " << cfg.num_hidden_layers
       << " layers resident, " << (p.engine.speculative() ? "speculative" : "deferred")
       << " update"
       << (p.engine.device_adamw_layers == 1 ? " (layer 0's on the device)"
           : p.engine.device_adamw_layers > 1 ? cat(" (layers 0-", p.engine.device_adamw_layers - 1, " on the device)")
                                              : std::string())
       << ", chunks of "
       << p.engine.max_chunk_tokens << " tokens (" << p.engine.max_chunks
       << " per step), activation store on the "
       << (p.engine.n_device_act_layers(int(cfg.num_hidden_layers)) == cfg.num_hidden_layers
               ? "device"
               : p.engine.n_device_act_layers(int(cfg.num_hidden_layers)) == 0
                     ? "host"
                     : cat("device for ", p.engine.n_device_act_layers(int(cfg.num_hidden_layers)),
                           " layers, host for the rest"))
       << "\n";
  }
  os << std::left;
  if (!summary) {
    os << "\n  " << std::setw(42) << "memory" << std::setw(8) << "tier" << "bytes\n";
    for (auto& l : p.lines)
      os << "  " << std::setw(42) << l.what << std::setw(8) << (l.disk ? "disk" : l.device ? "device" : "host")
         << format_bytes(l.bytes) << "\n";
  }
  os << "  " << std::setw(42) << "total device" << std::setw(8) << "" << format_bytes(p.device_bytes)
     << "  (budget " << format_bytes(budget.device_bytes) << ")\n";
  os << "  " << std::setw(42) << "total host" << std::setw(8) << "" << format_bytes(p.host_bytes)
     << "  (budget " << format_bytes(budget.host_bytes) << ")\n";
  if (p.disk_bytes > 0)
    os << "  " << std::setw(42) << cat("total disk (", budget.moments_dir, ")") << std::setw(8) << ""
       << format_bytes(p.disk_bytes) << "  (free " << format_bytes(budget.moments_dir_free) << "; "
       << (p.engine.moments_streamed ? "streamed from disk every step"
                                     : "the page cache holds them: read once")
       << ")\n";
  else if (!budget.moments_dir.empty() && p.fits)
    os << "  (--optimizer-dir " << budget.moments_dir << " is not used: the AdamW moments fit in RAM)\n";
  os << (summary ? "" : "\n") << std::right;
  if (p.step_seconds > 0)
    os << std::setprecision(1) << "hardware   " << p.hw.source << "; CPU AdamW "
       << p.hw.adamw_params_per_s / 1e9 << " G params/s"
       << (p.engine.moments_streamed ? cat("; optimizer disk ", std::fixed, std::setprecision(1),
                                  p.hw.disk_bytes_per_s / 1e9, " GB/s read + write")
                            : std::string())
       << "\n";
  os << std::setprecision(3) << "predicted  step " << p.step_seconds << " s (compute "
     << p.compute_seconds << " s, transfers " << p.transfer_seconds << " s, optimizer "
     << p.optimizer_seconds << " s), " << std::setprecision(0) << p.tokens_per_second
     << " tokens/s, ";
  const double model_flops = p.model_flops_per_step / p.step_seconds;  // host plans: GFLOP/s
  if (model_flops >= 1e12) os << std::setprecision(1) << model_flops / 1e12 << " model TFLOP/s\n";
  else os << std::setprecision(1) << model_flops / 1e9 << " model GFLOP/s\n";
  // Worth saying when clipping costs >= 5%: the user can see clipped steps in the progress
  // line (the norm) and know why those are slower.
  if (p.clipped_step_seconds > 1.05 * p.step_seconds)
    os << std::setprecision(3) << "clipped    a step whose gradient norm is clipped: "
       << p.clipped_step_seconds << " s (its host AdamW waits for the global norm)\n";
  switch (p.bound) {
    case Plan::Bound::gpu_compute: os << "bound      compute: the step is as fast as its kernels\n"; break;
    case Plan::Bound::cpu_optimizer:
      if (p.optimizer_disk_bound) {
        os << "bound      the optimizer's disk (" << std::setprecision(2) << p.optimizer_seconds
           << " s per step to read and write the AdamW moments): more tokens per step "
           << "(--grad-accum) amortise it; a faster disk or more RAM (then no --optimizer-dir) "
           << "removes it\n";
        break;
      }
      os << "bound      the CPU optimizer (" << std::setprecision(2) << p.optimizer_seconds
         << " s of host AdamW per step): more tokens per step (--batch-size, --grad-accum) "
         << "amortise it"
         // head_resident: the planner's sliding plans on a GPU (a reduced compute dtype)
         << (p.mode == Plan::Mode::sliding && p.engine.head_resident
                 ? "; more GPU memory moves more layers' AdamW there (--device-adamw-layers)"
                 : "")
         << "\n";
      break;
    case Plan::Bound::transfers:
      os << "bound      PCIe transfers (" << std::setprecision(2) << p.transfer_seconds
         << " s per step): more tokens per step hide them; more GPU memory keeps more layers' "
         << "weights resident\n";
      break;
  }
  if (!summary)
    os << (p.fits ? "fits       yes\n" : "fits       NO: ") << (p.fits ? "" : p.advice + "\n");
  return os.str();
}

}  // namespace sf
