// The plan search (make_plan): everything resident if it fits, else the fastest predicted
// sliding window over activation stores (device, host, split), weight slots, chunk sizes,
// resident homes, device-AdamW layers and speculation, with the AdamW moments in RAM first
// and on --optimizer-dir's disk only when nothing fits so; when nothing fits at all, the
// candidate that misses by least with advice on what to change. Counts memory through
// plan_memory.cpp and predicts through plan_prediction.cpp; allocates nothing.
#include <algorithm>
#include <sstream>

#include "core/error.h"
#include "engine/param_store.h"
#include "engine/plan_internal.h"
#include "model/param_layout.h"

namespace sf {

using plan_internal::predict;

namespace {

void total(Plan& p) {
  p.device_bytes = p.host_bytes = p.disk_bytes = 0;
  for (auto& l : p.lines) (l.disk ? p.disk_bytes : l.device ? p.device_bytes : p.host_bytes) += l.bytes;
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
  const size_t moments = moments_file_bytes(layout);
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

}  // namespace sf
