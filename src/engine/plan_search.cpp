// The plan search (make_plan): everything resident if it fits, else the fastest predicted
// sliding window over activation stores (device, host, split), weight slots, chunk sizes,
// resident homes, device-AdamW layers, kept attention (device, host, none) and speculation, with the AdamW moments in RAM first
// and on --optimizer-dir's disk only when nothing fits so; when nothing fits at all, the
// candidate that misses by least with advice on what to change. Counts memory through
// plan_memory.cpp and predicts through plan_prediction.cpp; allocates nothing.
#include <algorithm>
#include <iomanip>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"
#include "optim/param_store.h"
#include "engine/plan_internal.h"
#include "model/param_layout.h"

namespace sf {

using plan_internal::kept_attention_share;
using plan_internal::predict;

namespace {

// What every phase of the search reads: make_plan's arguments.
struct PlanInputs {
  const ModelConfig& cfg;
  const StepRequest& req;
  const Budget& budget;
  DType cd;
  const HardwareModel& hw;
  bool allow_resident;      // false: a sliding window even when everything would fit
  int device_adamw_layers;  // -1: the planner's choice; otherwise forced
};

// When nothing fits, whether the refusal also names the largest batch that does: make_plan's
// does; the plans of that search itself do not.
enum class BatchSuggestion { search, none };

// Where a sliding window's activation store lives: all on the device, all on the host, or
// split (as many layers on the device as fit, the rest on the host).
enum class ActivationStore { device, host, split };

// The search's two results: the fastest predicted candidate that fits (empty lines: none),
// and the candidate that misses the budgets by least (what a refusal describes).
struct SearchResult {
  Plan fastest;
  Plan closest_miss;
};

Plan plan_step(const PlanInputs& in, BatchSuggestion suggest);

// The largest v in [lo, hi] with fits(v), for a fits that holds up to some value and not
// above it; lo when none above lo does (fits(lo) is not asked).
template <class Fits>
int64_t largest_fitting(int64_t lo, int64_t hi, Fits fits) {
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (fits(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

void total(Plan& p) {
  p.device_bytes = p.host_bytes = p.disk_bytes = 0;
  for (auto& l : p.lines) (l.disk ? p.disk_bytes : l.device ? p.device_bytes : p.host_bytes) += l.bytes;
}

// A sliding window's memory lines and totals, recounted from its engine settings.
void count_window_memory(const PlanInputs& in, Plan& p) {
  p.engine.data_parallel_world = in.req.data_parallel_ranks;
  p.lines = sliding_memory(in.cfg, p.engine, in.cd);
  total(p);
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

// The device tier alone (the whole pool where the device is host memory).
bool device_fits(const Budget& b, const Plan& q) {
  return b.unified ? fits(b, q) : q.device_bytes <= b.device_bytes;
}

void check_request(const PlanInputs& in) {
  SF_REQUIRE(in.req.micro_tokens > 0 && in.req.grad_accum > 0, "plan: empty batch");
  SF_REQUIRE(in.device_adamw_layers <= 0 || in.cd != DType::f32,
             "AdamW on the device for some layers needs a GPU backend (the host reference "
             "computes in fp32 and keeps all state in host memory)");
  SF_REQUIRE(in.req.clipped_share >= 0 && in.req.clipped_share <= 1, "plan: the share of clipped steps is ",
             in.req.clipped_share, "; give one from 0 to 1");
  SF_REQUIRE(in.req.checkpoint_every >= 0 && in.req.checkpoint_every <= 3, "--checkpoint-every ",
             in.req.checkpoint_every, ": save every 1st, 2nd or 3rd layer's input (0: the planner's choice)");
  SF_REQUIRE(in.device_adamw_layers <= in.cfg.num_hidden_layers,
             "--device-adamw-layers ", in.device_adamw_layers, " is more than the model's ",
             in.cfg.num_hidden_layers, " layers");
  SF_REQUIRE(in.req.data_parallel_ranks >= 1, "plan: ", in.req.data_parallel_ranks, " data-parallel ranks");
  SF_REQUIRE(in.req.data_parallel_ranks == 1 || in.device_adamw_layers <= 0, "--device-adamw-layers ",
             in.device_adamw_layers, ": data parallel (", in.req.data_parallel_ranks, " ranks) updates every layer on "
             "the host, a slice per rank; use --device-adamw-layers 0, or --gpus 1");
}

// 1. Everything resident, if it fits: no transfers at all; every layer's activations kept
//    (no recompute) if that fits too. The larger LM-head chunk first (with kept activations
//    its scratch is its own). The first that fits, predicted; none when none fits.
std::optional<Plan> resident_plan(const PlanInputs& in) {
  // Several ranks run the sliding window (its slices and counters are their shared update).
  if (!in.allow_resident || in.req.checkpoint_every > 1 || in.req.data_parallel_ranks > 1) return std::nullopt;
  const int64_t head_rows = head_chunk_rows_for(in.cfg, in.req.micro_tokens, in.cd);
  for (auto [keep, rows] : {std::pair{true, head_rows}, std::pair{true, int64_t(256)},
                            std::pair{false, head_rows}}) {
    Plan res;
    res.mode = Plan::Mode::resident;
    res.keep_activations = keep;
    res.engine.head_chunk_rows = rows;
    res.engine.state_format = in.req.state_format;
    res.lines = resident_memory(in.cfg, in.req.micro_tokens, in.cd, keep, rows, in.req.state_format,
                                in.hw.attention_workspace ? attention_workspace_bytes(in.cfg, in.req.micro_tokens) : 0);
    total(res);
    res.fits = fits(in.budget, res);
    if (res.fits) {
      predict(in.cfg, in.req, in.hw, res);
      return res;
    }
  }
  return std::nullopt;
}

// Resident homes move bytes from the host to the device: as many layers' homes resident as
// the device holds (whether the host holds the rest is asked after).
void make_most_layers_resident(const PlanInputs& in, Plan& p) {
  p.engine.resident_layers = int(largest_fitting(0, in.cfg.num_hidden_layers, [&](int64_t mid) {
    Plan q = p;
    q.engine.resident_layers = int(mid);
    count_window_memory(in, q);
    return device_fits(in.budget, q);
  }));
  count_window_memory(in, p);
}

// Sets p's speculation and "next" buffers and recounts its memory: whether it still fits.
bool fits_with_speculation(const PlanInputs& in, EngineConfig::Speculation sp, int next_units,
                           Plan& p) {
  p.engine.speculation = sp;
  p.engine.next_units = next_units;
  count_window_memory(in, p);
  return fits(in.budget, p);
}

// Overlap the optimizer with the backward (speculative update) with "next" buffers for as
// many units as the host budget holds (first layers first, see EngineConfig::next_units);
// off when not even one fits (a reduced compute dtype needs them).
void choose_speculation(const PlanInputs& in, Plan& p) {
  using Speculation = EngineConfig::Speculation;
  // Several ranks run the deferred update (the speculative one is not built for them), so
  // their plan, its memory and its prediction are the deferred update's.
  if (in.req.data_parallel_ranks > 1) {
    fits_with_speculation(in, Speculation::off, -1, p);
    return;
  }
  if (fits_with_speculation(in, Speculation::always, -1, p)) return;
  const int n_units = in.cfg.num_hidden_layers + 2;
  const int most = int(largest_fitting(0, n_units - 1, [&](int64_t mid) {
    return fits_with_speculation(in, Speculation::always, int(mid), p);
  }));
  if (most > 0 || in.cd == DType::f32) fits_with_speculation(in, Speculation::always, most, p);
  else fits_with_speculation(in, Speculation::off, -1, p);
}

// Moments on disk stay cached if the page cache beyond the budget and the budget's unused
// part hold them; otherwise they stream from the disk every step.
void decide_moments_streamed(const Budget& budget, Plan& p) {
  const size_t used = p.host_bytes + (budget.unified ? p.device_bytes : 0);
  const size_t slack = budget.host_bytes > used ? budget.host_bytes - used : 0;
  p.engine.moments_streamed = p.disk_bytes > budget.page_cache_bytes + slack;
}

bool within_half_percent(double a, double b) { return a <= b * 1.005 && b <= a * 1.005; }

// The step time the search minimises: with clipping on, the mix of clipped and unclipped
// steps StepRequest::clipped_share says. A clipped step's AdamW waits for the norm, so a plan
// that speculates well but updates slowly after the backward must not win on its unclipped
// steps alone (the 8B shape cut to 8 layers at 32 x 1024 in 24 GiB: two plans of equal
// unclipped steps, the one ranked first by them 8% slower when clipped).
double searched_seconds(const Plan& p, const StepRequest& req) {
  if (!req.clipping) return p.step_seconds;
  return (1.0 - req.clipped_share) * p.step_seconds + req.clipped_share * p.clipped_step_seconds;
}

// Whether p replaces the fastest so far: a faster step (searched_seconds); ties (within 0.5%)
// go to the faster unclipped step (a run's steady state), then to less GPU work (slack for
// the optimizer's contention), then to less host memory.
bool beats(const Plan& p, const Plan& fastest, const StepRequest& req) {
  const double t = searched_seconds(p, req), best = searched_seconds(fastest, req);
  if (fastest.lines.empty() || t < best * 0.995) return true;
  if (!within_half_percent(t, best)) return false;
  if (!within_half_percent(p.step_seconds, fastest.step_seconds)) return p.step_seconds < fastest.step_seconds;
  return p.compute_seconds < fastest.compute_seconds * 0.995 ||
         (within_half_percent(p.compute_seconds, fastest.compute_seconds) &&
          p.host_bytes < fastest.host_bytes);
}

// Moments on --optimizer-dir's disk: as few units' as let the rest of p fit in the host
// budget (each unit there costs its moments' bytes read and written every step, the others
// update at the CPU's pace); when even every unit's leave RAM short, a bf16 master whose
// weights stream from homes goes with its unit's moments (as few units' again); every unit's
// state when even that is short (the closest miss).
void choose_disk_units(const PlanInputs& in, Plan& p) {
  const int64_t n = in.cfg.num_hidden_layers + 2;  // the layout's units
  auto fits_with = [&](int64_t k, bool masters) {
    Plan q = p;
    q.engine.disk_moment_units = int(k);
    q.engine.masters_on_disk = masters;
    count_window_memory(in, q);
    return fits(in.budget, q);
  };
  // The fewest units that fit, in [1, n]; n + 1: none fits.
  auto fewest = [&](bool masters) {
    int64_t lo = 1, hi = n + 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (fits_with(mid, masters)) hi = mid;
      else lo = mid + 1;
    }
    return lo;
  };
  int64_t k = fewest(false);
  const bool masters_may_go = p.engine.bf16_master() && !p.engine.from_master();
  p.engine.masters_on_disk = k > n && masters_may_go;
  if (p.engine.masters_on_disk) k = fewest(true);
  p.engine.disk_moment_units = k >= n ? -1 : int(k);
  count_window_memory(in, p);
}

// A window that saves every layer's input but is a little short of memory: the fewest of
// its top layers' inputs replayed (every 2nd from some layer up: one layer forward more in the
// backward per replayed input) that let it fit, its homes made resident again where that
// freed device memory. Whether it fits now. (8B at 1 x 65536 on the H200: one call's host
// budget was 0.8 GiB short of the plan that had run 4,384 tokens/s; the one that fitted whole
// replayed every 2nd layer's input and ran 4,071.)
bool replay_top_inputs_to_fit(const PlanInputs& in, Plan& p) {
  const int L = in.cfg.num_hidden_layers;
  const int most = (L - p.engine.kept_attention_layers) / 2;  // replayed inputs at most
  if (in.req.checkpoint_every != 0 || p.engine.checkpoint_every != 1 || most < 1 || !p.engine.moments_dir.empty())
    return false;
  auto replaying = [&](int64_t m) {
    Plan q = p;
    q.engine.checkpoint_every = 2;
    q.engine.strided_from = L - 2 * int(m);
    count_window_memory(in, q);
    return q;
  };
  if (!fits(in.budget, replaying(most))) return false;
  // v = most - m: the fewer replayed, the larger v; fits holds up to some v.
  const int64_t v = largest_fitting(0, most - 1, [&](int64_t x) { return fits(in.budget, replaying(most - x)); });
  p = replaying(most - v);
  if (device_fits(in.budget, p) && !p.engine.from_master()) make_most_layers_resident(in, p);
  return fits(in.budget, p);
}

// A candidate window: its resident homes, then (if it fits) its speculation, where its
// moments are read from, and its prediction; kept in r if it is the fastest or the closest
// miss. Whether it fits.
bool consider(const PlanInputs& in, Plan p, SearchResult& r) {
  const bool from_master = p.engine.from_master();  // no layer homes at all, no speculation
  if (!device_fits(in.budget, p) && in.cd != DType::f32 && p.engine.device_adamw_layers == 0) {
    p.engine.layer_grad_buffers = 1;  // a layer's f32 gradient less on the device
    count_window_memory(in, p);
  }
  if (device_fits(in.budget, p) && !from_master) make_most_layers_resident(in, p);
  if (!p.engine.moments_dir.empty()) choose_disk_units(in, p);
  p.fits = fits(in.budget, p) || replay_top_inputs_to_fit(in, p);
  if (!p.fits) {
    if (r.closest_miss.lines.empty() || overshoot(in.budget, p) < overshoot(in.budget, r.closest_miss))
      r.closest_miss = p;
    return false;
  }
  // A compact state has no exact undo: it speculates only the weights, into bf16 `next`
  // buffers (so not with an f32 compute dtype), and not from moments on disk (phase A and the
  // commit would each read them); otherwise its updates wait for the norm (deferred).
  const bool compact = !p.engine.state_format.is_fp32();
  if (!from_master && (!compact || (in.cd != DType::f32 && p.engine.moments_dir.empty())))
    choose_speculation(in, p);
  if (!p.engine.moments_dir.empty()) decide_moments_streamed(in.budget, p);
  predict(in.cfg, in.req, in.hw, p);
  if (beats(p, r.fastest, in.req)) r.fastest = p;
  return true;
}

// The most layers' activations the device holds beside the rest of p (-1: not even none).
int most_device_act_layers(const PlanInputs& in, Plan p) {
  return int(largest_fitting(-1, in.cfg.num_hidden_layers, [&](int64_t mid) {
    p.engine.device_act_layers = int(mid);
    count_window_memory(in, p);
    return in.budget.unified || p.device_bytes <= in.budget.device_bytes;
  }));
}

// A window before its homes, device-AdamW layers and speculation are chosen; none for a
// split that is no split (all layers or none on the device: the other stores cover those).
std::optional<Plan> window_candidate(const PlanInputs& in, const std::string& moments_dir,
                                     EngineConfig::HostWeights host_weights, ActivationStore store,
                                     int slots, int64_t chunk, int checkpoint_every) {
  Plan p;
  p.mode = Plan::Mode::sliding;
  p.engine.checkpoint_every = checkpoint_every;
  p.engine.state_format = in.req.state_format;
  p.engine.host_weights = host_weights;
  p.engine.moments_dir = moments_dir;
  p.engine.n_slots = slots;
  p.engine.max_chunk_tokens = chunk;
  p.engine.attention_workspace_bytes = in.hw.attention_workspace ? attention_workspace_bytes(in.cfg, chunk) : 0;
  p.engine.head_chunk_rows = head_chunk_rows_for(in.cfg, chunk, in.cd);
  p.engine.max_chunks = int((in.req.micro_tokens + chunk - 1) / chunk) * in.req.grad_accum;
  p.engine.activations_on_device = store == ActivationStore::device;
  // The head's home is resident with a reduced-precision compute dtype.
  p.engine.head_resident = in.cd != DType::f32;
  if (store == ActivationStore::split) {
    const int on_device = most_device_act_layers(in, p);
    if (on_device <= 0 || on_device >= in.cfg.num_hidden_layers) return std::nullopt;
    p.engine.device_act_layers = on_device;
  }
  count_window_memory(in, p);
  return p;
}

// The first layers' optimizer on the device: the forced count, none for the fp32 host
// reference, or a few counts on a GPU (the prediction weighs their memory against homes and
// the CPU's work).
std::vector<int> device_adamw_counts(const PlanInputs& in, const Plan& p) {
  if (in.device_adamw_layers >= 0) return {in.device_adamw_layers};
  // Several ranks update every layer on the host (a slice each; checked_for_ranks).
  if (in.cd == DType::f32 || p.engine.from_master() || in.req.data_parallel_ranks > 1) return {0};
  std::vector<int> counts;
  for (int d : {0, 1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128})
    if (d <= in.cfg.num_hidden_layers) counts.push_back(d);
  return counts;
}

// Where a window keeps its layers' attention for the backward (EngineConfig::
// kept_attention_layers): nowhere (the backward recomputes it), or the first L, L/2 or L/4
// layers' on the device or on the host. Fixed options, not "as many as fit", so that each
// candidate's prediction can only improve with the budget (its homes and `next` buffers
// grow) and more memory never predicts a slower step.
struct KeptAttentionOption {
  int layers = 0;
  bool on_device = true;
};

// Below this share of the compute, the options are not searched: short sequences gain
// little (8B at 1K tokens per sequence: 1.4%; from ~2K on: 2.3% and more) and the options
// multiply the candidates, i.e. the search's time. (beats() cannot tell apart steps or GPU
// work within 0.5% anyway.)
constexpr double kKeptAttentionMinShare = 0.02;

// In each tier, fewer layers first: a count that does not fit ends that tier's options.
std::vector<KeptAttentionOption> kept_attention_options(const PlanInputs& in) {
  if (!in.req.kept_attention || kept_attention_share(in.cfg, in.req, in.hw) < kKeptAttentionMinShare) return {};
  std::vector<KeptAttentionOption> options;
  const int L = in.cfg.num_hidden_layers;
  for (bool on_device : {true, false})
    for (int n : {L / 4, L / 2, L})
      if (n > 0) options.push_back({n, on_device});  // L/4 < L/2 < L wherever L/4 > 0
  return options;
}

// p without kept attention, then (if that fits: keeping takes memory) with each option; in a
// tier, once a count does not fit, neither does a larger one. The device options are
// counted before the homes (which only add to the device) to skip what cannot fit.
void consider_kept_attention(const PlanInputs& in, const Plan& p, SearchResult& r) {
  if (!consider(in, p, r)) return;
  bool tier_full[2] = {false, false};  // [on_device]
  for (const KeptAttentionOption& o : kept_attention_options(in)) {
    if (tier_full[o.on_device]) continue;
    // Every layer kept saves every input: the same plan as saving every input (stride 1).
    if (o.layers >= in.cfg.num_hidden_layers && p.engine.checkpoint_every > 1) continue;
    Plan q = p;
    q.engine.kept_attention_layers = o.layers;
    q.engine.kept_attention_on_device = o.on_device;
    count_window_memory(in, q);
    tier_full[o.on_device] = (o.on_device && !device_fits(in.budget, q)) || !consider(in, q, r);
  }
}

void consider_device_adamw_counts(const PlanInputs& in, const Plan& p, SearchResult& r) {
  for (int d : device_adamw_counts(in, p)) {
    if (d > 0 && p.engine.from_master()) break;  // forced: the copies' plans cover it
    Plan q = p;
    q.engine.device_adamw_layers = d;
    count_window_memory(in, q);
    if (d > 0 && !device_fits(in.budget, q)) {  // more will not fit either
      if (in.device_adamw_layers >= 0) consider(in, q, r);  // forced: kept for the advice
      break;
    }
    consider_kept_attention(in, q, r);
  }
}

// Chunks from the whole micro-batch halved down to the longest sequence.
std::vector<int64_t> chunk_sizes(const StepRequest& req) {
  std::vector<int64_t> chunks;
  for (int64_t chunk = req.micro_tokens; chunk >= std::max<int64_t>(1, req.max_seq_len); chunk /= 2) {
    chunks.push_back(chunk);
    if (chunk == 1) break;
  }
  return chunks;
}

// Whether the fastest plan so far is at least as fast as p's compute alone could be, with its
// kept-attention options at their largest saving: saving fewer inputs only adds compute, so
// none of p's variants could win then (the search skips them: it is 2-3x longer otherwise).
bool outrun_by_the_fastest(const PlanInputs& in, const Plan& p, const SearchResult& r) {
  if (r.fastest.lines.empty()) return false;
  Plan q = p;
  predict(in.cfg, in.req, in.hw, q);
  const double kept = kept_attention_options(in).empty() ? 0.0 : kept_attention_share(in.cfg, in.req, in.hw);
  return searched_seconds(r.fastest, in.req) <= q.compute_seconds * (1.0 - kept);
}

// Every 1st, 2nd or 3rd layer's input saved (the others replayed in the backward), or the
// request's forced stride. A model of fewer layers than the stride saves only layer 0's.
std::vector<int> checkpoint_strides(const PlanInputs& in) {
  if (in.req.checkpoint_every > 0) return {in.req.checkpoint_every};
  std::vector<int> v = {1};
  for (int n : {2, 3})
    if (n < in.cfg.num_hidden_layers) v.push_back(n);
  return v;
}

// 2. Sliding window. Candidates: activation store on the device, on the host, or split;
//    every 1st, 2nd or 3rd layer's input saved (or, where saving all is a little short of
//    memory, every 2nd of the top layers'); 3 or 2 slots; every chunk size. For each that
//    fits, as many layers' homes resident as the device budget allows (no transfers for
//    those), and the speculative update with as many "next" buffers as the host holds.
//    Without clipping also the windows with no host copy of the layers (weights from the
//    master, each gradient applied as it lands). The fastest predicted candidate wins.
void search_windows(const PlanInputs& in, const std::string& moments_dir, SearchResult& r) {
  using HostWeights = EngineConfig::HostWeights;
  std::vector<HostWeights> host_weights = {HostWeights::copies};
  if (!in.req.clipping) host_weights.push_back(HostWeights::master);
  // Every input saved first, so that the fastest of those can rule out what saving fewer
  // cannot beat.
  for (int every : checkpoint_strides(in))
    for (HostWeights hw : host_weights)
      for (ActivationStore store : {ActivationStore::device, ActivationStore::host, ActivationStore::split})
        for (int slots : {3, 2})
          for (int64_t chunk : chunk_sizes(in.req))
            if (std::optional<Plan> p = window_candidate(in, moments_dir, hw, store, slots, chunk, every))
              if (every == 1 || !outrun_by_the_fastest(in, *p, r)) consider_device_adamw_counts(in, *p, r);
}

// The AdamW moments go to --optimizer-dir's disk only when nothing fits with them in RAM.
SearchResult sliding_search(const PlanInputs& in) {
  SearchResult r;
  std::vector<std::string> moments_homes = {std::string()};
  if (!in.budget.moments_dir.empty()) moments_homes.push_back(in.budget.moments_dir);
  for (const std::string& moments_dir : moments_homes) {
    if (!r.fastest.lines.empty()) break;
    search_windows(in, moments_dir, r);
  }
  return r;
}

// 3. Nothing fits: say which tier is short and what to change.

// The host backend's "device" is host memory too: one pool (Budget::unified).
void say_host_shortfall(const Budget& budget, const Plan& best, size_t moments, std::ostream& a) {
  const size_t host_need = best.host_bytes + (budget.unified ? best.device_bytes : 0);
  if (host_need <= budget.host_bytes) return;
  // The largest piece on the host (the state, unless the disk took most of it).
  const MemoryLine* largest = &best.lines[0];
  for (const MemoryLine& l : best.lines)
    if (!l.device && !l.disk && l.bytes > largest->bytes) largest = &l;
  a << "host memory: needs " << format_bytes(host_need) << " but the budget is "
    << format_bytes(budget.host_bytes) << " (" << largest->what << " alone is "
    << format_bytes(largest->bytes) << "); add RAM, raise --host-memory, ";
  if (budget.moments_dir.empty() && best.mode == Plan::Mode::sliding)
    a << "keep the AdamW moments (" << format_bytes(moments)
      << ") on a fast disk with --optimizer-dir DIR, ";
  a << "or choose a smaller model. ";
}

// Said whichever candidate is described: the directory given cannot take the moments (every
// unit's), or what the closest miss put there (its bf16 masters too).
void say_optimizer_dir_shortfall(const Budget& budget, const Plan& best, size_t moments, std::ostream& a) {
  const bool masters = best.engine.masters_on_disk && best.disk_bytes > moments;
  const size_t need = masters ? best.disk_bytes : moments;
  if (!budget.moments_dir.empty() && need > budget.moments_dir_free)
    a << "--optimizer-dir " << budget.moments_dir << ": the AdamW moments"
      << (masters ? " and bf16 masters" : "") << " need " << format_bytes(need) << " but "
      << format_bytes(budget.moments_dir_free) << " are free there; free space or choose another directory. ";
}

void say_device_shortfall(const PlanInputs& in, const Plan& best, std::ostream& a) {
  if (in.budget.unified || best.device_bytes <= in.budget.device_bytes) return;
  a << "device memory: even the smallest window needs " << format_bytes(best.device_bytes)
    << " but the budget is " << format_bytes(in.budget.device_bytes)
    << "; lower --batch-size or --seq-len, or raise --gpu-memory"
    << (in.device_adamw_layers > 0 ? cat(", or lower --device-adamw-layers (", in.device_adamw_layers,
                                         " layers' optimizer state on the device)")
                                   : std::string())
    << ".";
}

// What does fit: the largest batch of sequences this long, and whether the same tokens per
// optimizer step come back through --grad-accum (they do where micro-batches run one after
// the other; a sliding window keeps every micro-batch's layer inputs until its backward, so
// there they cost the same memory). A plan is monotone in the batch: a bisection.
void say_largest_fitting_batch(const PlanInputs& in, std::ostream& a) {
  const StepRequest& req = in.req;
  const int64_t seq = req.max_seq_len > 0 ? std::min(req.max_seq_len, req.micro_tokens)
                                          : req.micro_tokens;
  const int64_t rows = req.micro_tokens / seq;
  if (rows <= 1) return;
  auto fits_with = [&](int64_t r, int accum) {
    StepRequest q = req;
    q.micro_tokens = r * seq;
    q.grad_accum = accum;
    const PlanInputs smaller{in.cfg, q, in.budget, in.cd, in.hw, in.allow_resident,
                             in.device_adamw_layers};
    return plan_step(smaller, BatchSuggestion::none).fits;
  };
  // The largest batch in [1, rows) that fits; 0: none.
  const int64_t most = largest_fitting(0, rows - 1, [&](int64_t r) { return fits_with(r, req.grad_accum); });
  if (most == 0) return;
  a << " What fits: --batch-size " << most << " at --seq-len " << seq;
  const int accum = int((rows * req.grad_accum + most - 1) / most);
  if (fits_with(most, accum))
    a << " (--grad-accum " << accum << " keeps about the same tokens per optimizer step).";
  else
    a << " (not with more --grad-accum: a sliding window keeps the layer inputs of every "
         "micro-batch of a step until its backward).";
}

// Clipping keeps every gradient until the norm is known (2 bytes per parameter more on the
// host with bf16): say when the run fits without it.
void say_fits_without_clipping(const PlanInputs& in, std::ostream& a) {
  if (!in.req.clipping || in.req.data_parallel_ranks > 1) return;  // several ranks keep every gradient
  StepRequest q = in.req;
  q.clipping = false;
  const PlanInputs unclipped{in.cfg, q, in.budget, in.cd, in.hw, in.allow_resident, in.device_adamw_layers};
  const Plan p = plan_step(unclipped, BatchSuggestion::none);
  if (p.fits)
    a << " Without gradient clipping (--max-grad-norm 0) it fits: each gradient is then applied as "
         "it lands and the weights stream from the fp32 master, with no host copy (predicted "
      << int64_t(p.tokens_per_second) << " tokens/s).";
}

// An fp32 state that does not fit: say which compact state would (issue: the user opts in).
void say_fits_with_compact_state(const PlanInputs& in, std::ostream& a) {
  if (!in.req.state_format.is_fp32()) return;
  for (StateFormat f : {StateFormat{MomentFormat::int8, MasterFormat::f32},
                        StateFormat{MomentFormat::int8, MasterFormat::bf16}}) {
    StepRequest q = in.req;
    q.state_format = f;
    const PlanInputs compact{in.cfg, q, in.budget, in.cd, in.hw, in.allow_resident, in.device_adamw_layers};
    const Plan p = plan_step(compact, BatchSuggestion::none);
    if (!p.fits) continue;
    a << " With a compact optimizer state (--optimizer-state int8"
      << (f.master == MasterFormat::bf16 ? " --master-weights bf16" : "") << ": "
      << std::fixed << std::setprecision(2) << state_bytes_per_param(in.cfg, f) << " B/param instead of "
      << state_bytes_per_param(in.cfg, StateFormat{})
      << ") it fits (predicted " << int64_t(p.tokens_per_second) << " tokens/s).";
    return;
  }
}

// The candidate that missed by least, predicted, with the advice.
Plan refusal(const PlanInputs& in, Plan best, BatchSuggestion suggest) {
  predict(in.cfg, in.req, in.hw, best);
  std::ostringstream a;
  const size_t moments = disk_file_bytes(state_units(ModelLayout::build(in.cfg)), in.req.state_format);
  say_host_shortfall(in.budget, best, moments, a);
  say_optimizer_dir_shortfall(in.budget, best, moments, a);
  say_device_shortfall(in, best, a);
  if (suggest == BatchSuggestion::search) {
    say_fits_without_clipping(in, a);
    say_fits_with_compact_state(in, a);
    say_largest_fitting_batch(in, a);
  }
  best.fits = false;
  best.advice = a.str();
  return best;
}

Plan plan_step(const PlanInputs& in, BatchSuggestion suggest) {
  check_request(in);
  if (std::optional<Plan> resident = resident_plan(in)) return *resident;
  SearchResult r = sliding_search(in);
  if (!r.fastest.lines.empty()) return r.fastest;
  return refusal(in, r.closest_miss, suggest);
}

}  // namespace

// A step that fits only without the attention backward's workspace (8B at 1 x 65536 with
// clipping on the H200 machine: 2 GiB of device for cuDNN's f32 dQ push the layer inputs to a
// host that has no room) runs the backward that needs none, slower but running; the refusal
// stays the one with the workspace, whose advice names the larger budgets.
Plan make_plan(const ModelConfig& cfg, const StepRequest& req, const Budget& budget, DType cd,
               const HardwareModel& hw, bool allow_resident, int device_adamw_layers) {
  Plan p = plan_step(PlanInputs{cfg, req, budget, cd, hw, allow_resident, device_adamw_layers},
                     BatchSuggestion::search);
  if (p.fits || !hw.attention_workspace || !(hw.attention_flops_no_workspace > 0)) return p;
  HardwareModel h = hw;
  h.attention_workspace = false;
  h.attention_flops = hw.attention_flops_no_workspace;
  h.attention_flops_no_workspace = 0;
  h.source += "; its backward slideformer's, which needs no workspace (cuDNN's does not fit beside this step)";
  Plan q = plan_step(PlanInputs{cfg, req, budget, cd, h, allow_resident, device_adamw_layers},
                     BatchSuggestion::none);
  if (!q.fits) return p;
  q.attention_without_workspace = true;
  return q;
}

}  // namespace sf
