#include "engine/host_updater.h"

#include "engine/speculation_state.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "core/stopwatch.h"
#include "engine/clip_decision.h"
#include "optim/adamw.h"
#include "optim/adamw_undo.h"
#include "optim/grad_norm.h"
#include "optim/state_adamw.h"

namespace sf {

HostUpdater::HostUpdater(WindowContext& w, UnitHomes& homes, EmbeddingPath& emb, DeviceAdamWLayers& dev,
                         const DataParallel* dp)
    : w_(w), homes_(homes), emb_(emb), dev_(dev) {
  if (dp && dp->active()) sharded_ = std::make_unique<ShardedUpdate>(*dp, w.store);
  ring_piece_ = std::min(homes.max_resident_numel(), w.ec.ring_piece);
  // A piece of an int8 state's unit must split no block: whole blocks of the unit's grid.
  if (w.store.format().moments == MomentFormat::int8)
    ring_piece_ = std::max(kStateBlock, ring_piece_ / kStateBlock * kStateBlock);
  if (w.ec.speculative()) spec_ = std::make_unique<SpeculationState>();
}

HostUpdater::~HostUpdater() {
  abandon_speculation();
  {
    std::lock_guard<std::mutex> lk(landing_.mu);
    landing_.aborted = true;  // a round still waiting for a gradient that never comes
  }
  landing_.cv.notify_all();
  try {
    updates_.wait_all();
  } catch (...) {
  }
}

// Stops a phase A that is still running because its step threw. Units it already updated
// keep that update: a step that throws ends training, and a resume starts from the last
// checkpoint.
void HostUpdater::abandon_speculation() {
  if (!spec_) return;
  {
    std::lock_guard<std::mutex> lk(spec_->mu);
    if (!spec_->running) return;
    spec_->stop = true;
  }
  spec_->cv.notify_all();
  spec_->wait_returned();
  spec_->stop = false;
  spec_->active = false;
}

// The CPU optimizer's threads: every core but one, so that the thread driving the GPU (and
// the host-side embedding work) is not starved while AdamW runs under the forward or backward.
ThreadPool& HostUpdater::opt_pool() {
  if (!opt_pool_) opt_pool_ = std::make_unique<ThreadPool>(std::max(1, host_pool().size() - 1));
  return *opt_pool_;
}

bool HostUpdater::begin_step(const OptimHyper& h, std::vector<int> order) {
  SF_CHECK(int(order.size()) == w_.n_units(), "the schedule updates ", order.size(), " of ", w_.n_units(), " units");
  order_ = std::move(order);
  emb_untouched_done_ = false;
  abandon_speculation();  // left running only by a step that threw
  if (w_.ec.from_master()) {
    SF_REQUIRE(!(h.max_grad_norm > 0),
                     "this plan streams the weights from the fp32 master and applies each gradient as "
                     "it lands, so no global norm can clip it (max_grad_norm ", h.max_grad_norm,
                     "); train with --max-grad-norm 0, or give the plan the host memory for a copy "
                     "of the gradients (2 bytes per parameter more)");
    // Only the step's AdamW here: the previous round may still be applying the last units
    // under this step's start; start_landing resets the landing state once it is over.
    landing_step_ = next_adamw_step(h, w_.store, 1.f);
    return false;
  }
  if (!spec_ || !step_may_speculate(h)) return false;
  const AdamWStep s = next_adamw_step(h, w_.store, 1.f);  // coefficient 1 until the norm is known
  const size_t n = size_t(w_.n_units());
  SpeculationState& sp = *spec_;
  sp.ready.assign(n, 0);
  sp.speculated.assign(n, 0);
  sp.sumsq.assign(n, 0.0);
  sp.have_sq.assign(n, 0);
  sp.closing = false;
  sp.busy_seconds = 0;
  sp.error = nullptr;
  sp.step = s;
  sp.active = true;
  sp.running = true;
  // Behind the previous step's phase B on the update thread: that round ends before this
  // step's backward starts (the forward waits for every unit's update), and phase A has
  // nothing to do before the backward.
  updates_.post([this, s, m = h.max_grad_norm] {
    speculate_loop(s, m);
    {
      std::lock_guard<std::mutex> lk(spec_->mu);
      spec_->running = false;
    }
    spec_->cv.notify_all();
  });
  return true;
}

void HostUpdater::grad_ready(int u) {
  if (w_.ec.from_master()) {
    {
      std::lock_guard<std::mutex> lk(landing_.mu);
      landing_.enqueued[size_t(u)] = 1;
    }
    landing_.cv.notify_all();
    return;
  }
  if (!spec_ || !spec_->active) return;
  {
    std::lock_guard<std::mutex> lk(spec_->mu);
    spec_->ready[size_t(u)] = 1;
  }
  spec_->cv.notify_all();
}

// Speculating, the embedding's sum of squares is taken here at once, while phase A may still
// be busy with layer 0's update, and phase A leaves the unit to phase B: the backward is over,
// and the norm is ready as soon as phase A's last unit is. (The tests' speculate-everything
// mode still hands it to phase A.)
void HostUpdater::embedding_grad_home() {
  if (sharded_) {  // the step's last gradient: reduced like the others, from its sparse rows
    const EmbeddingGrad& g = emb_.grad();
    sharded_->reduce_rows(0, g.rows(), g.data(), w_.cfg.hidden_size);
    return;
  }
  if (w_.ec.from_master()) {
    // Summed here, before the round may update the table (host_pool: the round owns opt_pool).
    const double sq = emb_.sum_squares(host_pool());
    {
      std::lock_guard<std::mutex> lk(landing_.mu);
      landing_.sumsq[0] = sq;
    }
    grad_ready(0);
    return;
  }
  if (!spec_ || !spec_->active || w_.test.speculate_everything) {
    grad_ready(0);
    return;
  }
  const double sq = emb_.sum_squares(host_pool());  // host_pool: phase A owns opt_pool
  std::lock_guard<std::mutex> lk(spec_->mu);
  spec_->sumsq[0] = sq;
  spec_->have_sq[0] = 1;
}

void HostUpdater::finish(const OptimHyper& h, StepStats& st) {
  if (sharded_) finish_sharded(h, st);
  else if (w_.ec.from_master()) finish_landing(h, st);
  else if (spec_ && spec_->active) finish_speculative(h, st);
  else finish_deferred(h, st);
}

void HostUpdater::finish_deferred(const OptimHyper& h, StepStats& st) {
  ThreadPool& pool = opt_pool();
  const int n_units = w_.n_units();
  std::vector<float> dev_norms(size_t(n_units), 0.f);
  w_.be.copy_to_host(*w_.streams.compute, dev_norms.data(), w_.norms(), size_t(n_units) * 4);
  w_.streams.compute->synchronize();
  double sumsq = emb_.sum_squares(pool);
  for (int u = 1; u < n_units; ++u)
    sumsq += device_norm(u) ? double(dev_norms[size_t(u)])
                            : sum_squares_ranges(static_cast<const float*>(homes_.home(u)->data()),
                                                 w_.store.numel(u), w_.store.ranges(u), &pool);
  const ClipDecision d = decide_clip(sumsq, h.max_grad_norm);
  d.report(st);
  if (d.skip) {  // weights stay as they are
    homes_.refresh(UnitHomes::DeviceAdamWHomes::keep);  // homes hold gradients now: put the unchanged weights back
    return;
  }
  const AdamWStep s = next_adamw_step(h, w_.store, d.coef);
  advance_step(w_.store, s);  // taken now; the update thread applies it
  start_updates([this](int u) { return !w_.ec.device_adamw(u); },
                [this, s](int u) { update_unit(u, s); });
}

void HostUpdater::start_updates(std::function<bool(int)> touches_moments, std::function<void(int)> update,
                                std::function<void(int)> wait_for_gradient, std::function<void()> after) {
  std::vector<int> order = order_;
  const int n_units = w_.n_units();
  ParamStore& store = w_.store;
  std::vector<int> next_of(size_t(n_units), -1);
  std::vector<char> acquire(size_t(n_units), 0);  // moments on disk: the unit's slot, before its update
  if (store.moments_on_disk()) {
    int next = -1;
    for (size_t i = order.size(); i-- > 0;) {
      const int u = order[i];
      next_of[size_t(u)] = next;  // the sweep's next unit on disk, read while this one updates
      acquire[size_t(u)] = touches_moments(u) && store.moments_on_disk(u);
      if (acquire[size_t(u)]) next = u;
    }
    if (next >= 0) store.prefetch_disk_unit(next);
  }
  updates_.start(std::move(order), [this, n_units, next_of = std::move(next_of), acquire = std::move(acquire),
                                    update = std::move(update), wait_for_gradient = std::move(wait_for_gradient)](int u) {
    if (wait_for_gradient) wait_for_gradient(u);
    if (next_of[size_t(u)] >= 0) w_.store.prefetch_disk_unit(next_of[size_t(u)]);
    if (acquire[size_t(u)]) w_.store.acquire_disk_unit(u);
    if (u > 0) homes_.set(u, HomeState::gradient, HomeState::updating, "update");
    trace_mark("update: starts unit", u);
    update(u);
    trace_mark("update: done unit", u);
    if (u > 0) homes_.set(u, HomeState::updating, HomeState::weights, "update");
    w_.store.disk_unit_done(u);
    if (u == n_units - 1) w_.streams.upd_h2d->synchronize();  // the round ends with nothing in flight
  }, std::move(after));
}

void HostUpdater::update_unit(int u, const AdamWStep& s, bool untouched_done) {
  if (w_.ec.device_adamw(u)) {
    dev_.adamw(u, s);
    return;
  }
  if (u == 0) {  // embedding: sparse f32 gradient on the host; tied bf16 refreshes the table
    emb_.adamw(EmbeddingGrad::Kind::update, EmbeddingGrad::Rows::touched, s, s, opt_pool());
    if (!untouched_done)
      emb_.adamw(EmbeddingGrad::Kind::update, EmbeddingGrad::Rows::untouched, s, s, opt_pool());
    return;
  }
  // The new compute-dtype weights overwrite the gradient in place (element i is read before
  // it is written) and go home with it.
  unit_adamw(EmbeddingGrad::Kind::update, u, WeightsTo::gradient_in_place, nullptr, s, s);
}

void HostUpdater::unit_adamw(EmbeddingGrad::Kind kind, int u, WeightsTo to, uint16_t* out,
                             const AdamWStep& s, const AdamWStep& done) {
  const bool f32 = !w_.reduced();
  ParamStore& store = w_.store;
  ThreadPool* pool = &opt_pool();
  const bool in_place = to == WeightsTo::gradient_in_place;
  if (!store.format().is_fp32()) {
    SF_CHECK(kind == EmbeddingGrad::Kind::update, "a compact optimizer state has no undo or redo");
    grad_pieces(u, in_place && !f32 ? Pieces::rewrite : Pieces::read, [&](void* g, int64_t off, int64_t len) {
      uint16_t* o = f32 ? nullptr : in_place ? static_cast<uint16_t*>(g) : out ? out + off : nullptr;
      if (f32) adamw_update_state(store.state(u), off, len, static_cast<const float*>(g), o, store.ranges(u), s, pool);
      else adamw_update_state(store.state(u), off, len, static_cast<const uint16_t*>(g), o, store.ranges(u), s, pool);
      w_.follow_master(u, off, len);
    });
    return;
  }
  grad_pieces(u, in_place && !f32 ? Pieces::rewrite : Pieces::read, [&](void* g, int64_t off, int64_t len) {
    const std::vector<ParamRange> r = clip_ranges(store.ranges(u), off, len);
    float *p = store.master(u) + off, *m = store.m(u) + off, *v = store.v(u) + off;
    uint16_t* o = f32 ? nullptr : in_place ? static_cast<uint16_t*>(g) : out ? out + off : nullptr;
    const float* gf = static_cast<const float*>(g);
    const uint16_t* gh = static_cast<const uint16_t*>(g);
    switch (kind) {
      case EmbeddingGrad::Kind::update:
        if (f32) adamw_update_ranges(p, m, v, gf, o, len, r, s, pool);
        else adamw_update_ranges(p, m, v, gh, o, len, r, s, pool);
        break;
      case EmbeddingGrad::Kind::undo:
        if (f32) adamw_undo_ranges(p, m, v, gf, len, r, s, pool);
        else adamw_undo_ranges(p, m, v, gh, len, r, s, pool);
        break;
      case EmbeddingGrad::Kind::redo:
        if (f32) adamw_redo_ranges(p, m, v, gf, o, len, r, done, s, pool);
        else adamw_redo_ranges(p, m, v, gh, o, len, r, done, s, pool);
        break;
      case EmbeddingGrad::Kind::update_redo:
        if (f32) adamw_update_redo_ranges(p, m, v, gf, o, len, r, done, s, pool);
        else adamw_update_redo_ranges(p, m, v, gh, o, len, r, done, s, pool);
        break;
    }
  });
}

void HostUpdater::grad_pieces(int u, Pieces mode, const std::function<void(void*, int64_t, int64_t)>& fn,
                              int64_t b, int64_t e) {
  const bool upload = mode == Pieces::rewrite;
  const int64_t end = e < 0 ? w_.store.numel(u) : e, n = end - b;
  if (!homes_.resident(u)) {
    char* g = static_cast<char*>(homes_.from_master(u) ? homes_.ring().of(u) : homes_.home(u)->data());
    fn(g + size_t(b) * dtype_size(w_.cd), b, n);
    return;
  }
  WindowEvents& ev = w_.ev;
  Stream &d2h = *w_.streams.upd_d2h, &h2d = *w_.streams.upd_h2d;
  const size_t es = dtype_size(w_.cd);
  char* home = static_cast<char*>(homes_.home(u)->data());
  Buffer* ring[2] = {&w_.bufs.at(BufferRole::update_ring, 0), &w_.bufs.at(BufferRole::update_ring, 1)};
  const int64_t P = ring_piece_;
  const int64_t pieces = (n + P - 1) / P;
  auto download = [&](int64_t k, int r) {
    const int64_t off = b + k * P, len = std::min(P, end - off);
    ev.grads_home[size_t(u)]->wait(d2h);
    ev.ring_up[r]->wait(d2h);  // the buffer's previous upload has left
    w_.be.copy_to_host(d2h, ring[r]->data(), home + size_t(off) * es, size_t(len) * es);
    ev.ring_down[r]->record(d2h);
  };
  int r = ring_next_;
  download(0, r);
  for (int64_t k = 0; k < pieces; ++k) {
    if (k + 1 < pieces) download(k + 1, r ^ 1);
    ev.ring_down[r]->synchronize();
    const int64_t off = b + k * P, len = std::min(P, end - off);
    fn(ring[r]->data(), off, len);
    if (upload) {
      w_.be.copy_to_device(h2d, home + size_t(off) * es, ring[r]->data(), size_t(len) * es);
      ev.ring_up[r]->record(h2d);
    }
    r ^= 1;
  }
  ring_next_ = r;
  // Not waited for here: the next forward orders after home_ready, and a ring buffer's next
  // download after its ring_up, so AdamW of the next piece overlaps this upload.
  if (upload) ev.home_ready[size_t(u)]->record(h2d);
}

// ---- data parallel (data_parallel.h) -------------------------------------------------------

// The f32 gradient, once its trip home is over, into the padded send buffer, then reduced.
void HostUpdater::reduce_grad(int u) {
  if (!sharded_ || w_.reduced()) return;  // the GPU path reduced it on the device (grads_out)
  Stream& s = *w_.streams.upd_d2h;
  w_.ev.grads_home[size_t(u)]->wait(s);
  w_.be.copy_to_host(s, sharded_->send_buffer(u), homes_.home(u)->data(), size_t(w_.store.numel(u)) * 4);
  s.synchronize();
  sharded_->reduce(u);
}

// The norm over every rank's slices, the same decision on every rank, and this rank's slices
// updated on the update thread in the schedule's order (the next forward waits per unit for
// every rank's slice: wait()).
void HostUpdater::finish_sharded(const OptimHyper& h, StepStats& st) {
  ThreadPool& pool = opt_pool();
  std::vector<float> dev_norms;  // the GPU path: the slices' sums of squares, reduced there
  if (w_.reduced()) {
    dev_norms.assign(size_t(w_.n_units()), 0.f);
    w_.be.copy_to_host(*w_.streams.compute, dev_norms.data(), w_.norms(), dev_norms.size() * 4);
    w_.streams.compute->synchronize();
  }
  const double local = sharded_->local_sumsq(&pool, dev_norms.empty() ? nullptr : dev_norms.data());
  const ClipDecision d = decide_clip(sum_over_ranks(*sharded_->dp().comm, local), h.max_grad_norm);
  d.report(st);
  if (d.skip) {
    homes_.refresh(UnitHomes::DeviceAdamWHomes::keep);
    if (homes_.any_shared()) sharded_->dp().comm->barrier();  // every rank's slices are back
    return;
  }
  const AdamWStep s = next_adamw_step(h, w_.store, d.coef);
  advance_step(w_.store, s);
  const int64_t round = sharded_->begin_round();
  start_updates([](int) { return false; }, [this, s, round](int u) {
    if (w_.test.rank_update_delay_ms > 0 && sharded_->dp().rank() != 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(w_.test.rank_update_delay_ms));
    if (w_.reduced()) update_home_slice(u, s, round);
    else sharded_->update(u, s, &opt_pool(), round);
  });
}

void HostUpdater::update_home_slice(int u, const AdamWStep& s, int64_t round) {
  if (u == 0) {  // the table: its fp32 master is what the GPU gathers from, as on the host
    sharded_->update(0, s, &opt_pool(), round);
    return;
  }
  const dist::ShardRange sl = sharded_->slice(u);
  ParamStore& store = w_.store;
  if (sl.size() > 0)
    grad_pieces(u, Pieces::rewrite, [&](void* g, int64_t off, int64_t len) {
      const std::vector<ParamRange> r = clip_ranges(store.ranges(u), off, len);
      uint16_t* gh = static_cast<uint16_t*>(g);  // the reduced gradient in, the new weights out
      adamw_update_ranges(store.master(u) + off, store.m(u) + off, store.v(u) + off, gh, gh, len, r, s, &opt_pool());
    }, int64_t(sl.begin), int64_t(sl.end));
  sharded_->slice_done(u, round);
  sharded_->wait_round(u, round);
  refresh_other_slices(u);
}

// The other ranks' slices of the home hold this rank's old weights: the new ones, cast from
// the shared master (round to nearest even, as the AdamW's own bf16 output), straight into a
// host home, or through the ring buffers into a resident one. A home the ranks share has
// every slice already: each rank's update wrote its own.
void HostUpdater::refresh_other_slices(int u) {
  if (homes_.shared(u)) return;
  const DataParallel& dp = sharded_->dp();
  const int64_t n = w_.store.numel(u);
  const size_t es = dtype_size(w_.cd);
  char* home = static_cast<char*>(homes_.home(u)->data());
  Stream& h2d = *w_.streams.upd_h2d;
  for (int q = 0; q < dp.world(); ++q) {
    const dist::ShardRange sl = dist::shard_range(size_t(n), dp.world(), q, kSliceAlign);
    if (q == dp.rank() || sl.size() == 0) continue;
    if (!homes_.resident(u)) {
      w_.master_to_compute(u, home + sl.begin * es, int64_t(sl.begin), int64_t(sl.end));
      continue;
    }
    for (int64_t off = int64_t(sl.begin); off < int64_t(sl.end); off += ring_piece_) {
      const int64_t len = std::min<int64_t>(ring_piece_, int64_t(sl.end) - off);
      const int r = ring_next_;
      w_.ev.ring_up[r]->synchronize();  // the buffer's previous upload has left
      Buffer& ring = w_.bufs.at(BufferRole::update_ring, r);
      w_.master_to_compute(u, ring.data(), off, off + len);
      w_.be.copy_to_device(h2d, home + size_t(off) * es, ring.data(), size_t(len) * es);
      w_.ev.ring_up[r]->record(h2d);
      ring_next_ ^= 1;
    }
  }
  if (homes_.resident(u)) w_.ev.home_ready[size_t(u)]->record(h2d);
}

// ---- landing ---------------------------------------------------------------------------

void HostUpdater::start_landing() {
  if (!w_.ec.from_master()) return;
  updates_.wait_all();  // the previous step's round (the forward waited for every unit)
  homes_.ring().reset(w_.n_units());
  const AdamWStep s = landing_step_;  // the round's own copy: the next begin_step sets another
  advance_step(w_.store, s);          // taken now; the round applies it
  {
    std::lock_guard<std::mutex> lk(landing_.mu);
    landing_.enqueued.assign(size_t(w_.n_units()), 0);
    landing_.sumsq.assign(size_t(w_.n_units()), 0.0);
    landing_.aborted = landing_.not_finite = false;
  }
  auto abort_on_error = [this](const std::function<void()>& fn) {
    try {
      fn();
    } catch (...) {
      homes_.ring().abort();  // a backward waiting for a buffer of the ring stops too
      throw;
    }
  };
  start_updates([](int) { return true; },
                [this, abort_on_error, s](int u) { abort_on_error([&] { land_unit(u, s); }); },
                [this, abort_on_error](int u) { abort_on_error([&] { wait_landed(u); }); });
}

void HostUpdater::wait_landed(int u) {
  std::unique_lock<std::mutex> lk(landing_.mu);
  landing_.cv.wait(lk, [&] { return landing_.aborted || landing_.enqueued[size_t(u)]; });
  SF_CHECK(!landing_.aborted, "the step ended before the gradient of unit ", u, " was sent home");
}

// Streamed layers: wait for the trip, check the unit's own norm, update the master from the
// ring. The head (resident) and the embedding go the deferred way, their trips ordered on
// the device / by the backward.
void HostUpdater::land_unit(int u, const AdamWStep& s) {
  if (w_.test.landing_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(w_.test.landing_delay_ms));
  if (u == w_.head_unit()) {
    // The round's first unit. The embedding rows this step did not touch have gradient 0:
    // their AdamW runs now instead of at the step boundary, where the next forward waits for
    // the embedding (0.13 s at 8B). The forward's gather reads only touched rows; a tied
    // table's copy for the head has left once head_ready has passed.
    w_.ev.head_ready->synchronize();
    emb_.adamw(EmbeddingGrad::Kind::update, EmbeddingGrad::Rows::untouched, s, s, opt_pool());
  }
  if (!homes_.from_master(u)) {
    update_unit(u, s, /*untouched_done=*/true);  // the embedding's touched rows (u 0), or the head
    return;
  }
  w_.ev.grads_home[size_t(u)]->synchronize();
  const double sq = device_norm(u) ? unit_sumsq(u)
                                   : sum_squares_ranges(static_cast<const float*>(homes_.ring().of(u)),
                                                        w_.store.numel(u), w_.store.ranges(u), &opt_pool());
  {
    std::lock_guard<std::mutex> lk(landing_.mu);
    landing_.sumsq[size_t(u)] = sq;
    if (!std::isfinite(sq)) landing_.not_finite = true;
  }
  if (std::isfinite(sq)) unit_adamw(EmbeddingGrad::Kind::update, u, WeightsTo::out, nullptr, s, s);
  homes_.ring().release(u);
}

// The norm for the report: the device's reductions where it made them (read now, the round
// goes on under the next forward); with fp32 homes the round's host sums (the round's end).
void HostUpdater::finish_landing(const OptimHyper& h, StepStats& st) {
  const int n_units = w_.n_units();
  std::vector<float> dev_norms(size_t(n_units), 0.f);
  w_.be.copy_to_host(*w_.streams.compute, dev_norms.data(), w_.norms(), size_t(n_units) * 4);
  w_.streams.compute->synchronize();
  bool all_on_device = true;
  for (int u = 1; u < n_units; ++u) all_on_device &= device_norm(u);
  if (!all_on_device) updates_.wait_all();
  double sumsq = 0;
  {
    std::lock_guard<std::mutex> lk(landing_.mu);
    for (int u = 0; u < n_units; ++u)
      sumsq += u > 0 && device_norm(u) ? double(dev_norms[size_t(u)]) : landing_.sumsq[size_t(u)];
  }
  const ClipDecision d = decide_clip(sumsq, h.max_grad_norm);
  if (d.skip) {
    updates_.wait_all();
    SF_FAIL(input, "the gradient of step ", w_.store.step, " is not finite (norm ", std::sqrt(sumsq),
            "); with the weights streamed from the master each unit was updated as its gradient "
            "landed, so the step cannot be skipped: resume from the last checkpoint with a lower "
            "learning rate, or plan with room for a gradient copy and clip");
  }
  d.report(st);
}

}  // namespace sf
