// The speculative half of HostUpdater (host_updater.h): phase A during the backward, and the
// step's finish from what it reached (phase B).
#include <algorithm>

#include "core/stopwatch.h"
#include "engine/clip_decision.h"
#include "engine/host_updater.h"
#include "engine/speculation_state.h"
#include "optim/grad_norm.h"
#include "optim/state_adamw.h"

namespace sf {

// Sum of squares of unit u's gradient once it is home: reduced on the device by grads_out
// (one float back), or summed here in double (the embedding; f32 homes).
double HostUpdater::unit_sumsq(int u) {
  if (u == 0) return emb_.sum_squares(opt_pool());
  if (device_norm(u)) {
    float f = 0;
    Stream& d2h = *w_.streams.upd_d2h;
    w_.ev.grads_home[size_t(u)]->wait(d2h);
    w_.be.copy_to_host(d2h, &f, w_.norms() + u, 4);
    d2h.synchronize();
    return double(f);
  }
  return sum_squares_ranges(static_cast<const float*>(homes_.home(u)->data()), w_.store.numel(u),
                            w_.store.ranges(u), &opt_pool());
}

// Where unit u's new compute-dtype weights go when speculated or redone: `next` (it becomes
// the home in phase B), the tied table's staging for the embedding, or nowhere (f32 compute:
// weights load straight from the master).
uint16_t* HostUpdater::spec_out(int u) {
  if (u == 0) {
    Buffer* staging = homes_.home(0);
    return staging ? static_cast<uint16_t*>(staging->data()) : nullptr;
  }
  if (!w_.reduced()) return nullptr;
  return static_cast<uint16_t*>(homes_.next(u)->data());
}

bool HostUpdater::can_speculate(int u) const {
  if (w_.ec.device_adamw(u)) return false;  // updated on the device once the norm is known
  if (!w_.store.format().is_fp32())  // no undo: the weights into `next`, the gradient kept home
    return u >= 1 && w_.reduced() && homes_.next(u) != nullptr && !homes_.resident(u) &&
           !w_.store.moments_on_disk(u);
  return u == 0 || !w_.reduced() || homes_.next(u) != nullptr;
}

void HostUpdater::unit_weights(int u, uint16_t* out, const AdamWStep& s) {
  const auto* g = static_cast<const uint16_t*>(homes_.home(u)->data());
  adamw_weights_of_update(w_.store.state(u), 0, w_.store.numel(u), g, out, w_.store.ranges(u), s, &opt_pool());
}

// Units are taken newest first (the lowest ready layer): when AdamW falls behind the
// backward, what is left for phase B are the higher layers, which the next forward needs
// last, instead of the lowest, which it needs first.
void HostUpdater::speculate_loop(AdamWStep s, float max_norm) {
  const int n_units = w_.n_units();
  SpeculationState& sp = *spec_;
  std::vector<char> taken(size_t(n_units), 0);
  double running = 0;
  try {
    for (int left = n_units; left > 0; --left) {
      std::vector<int> cand;  // enqueued (ready) and not taken, lowest first
      {
        std::unique_lock<std::mutex> lk(sp.mu);
        sp.cv.wait(lk, [&] {
          if (sp.stop || sp.closing) return true;
          for (int v = 0; v < n_units; ++v)
            if (sp.ready[size_t(v)] && !taken[size_t(v)]) return true;
          return false;
        });
        if (sp.stop || sp.closing) return;
        for (int v = 0; v < n_units; ++v)
          if (sp.ready[size_t(v)] && !taken[size_t(v)]) cand.push_back(v);
      }
      // "Ready" means enqueued: the host runs ahead of the device. Take the lowest unit whose
      // gradient has landed; if none has yet, wait for the one that lands first (highest).
      int u = cand.back();
      for (int v : cand)
        if (v == 0 || w_.ev.grads_home[size_t(v)]->query()) {
          u = v;
          break;
        }
      taken[size_t(u)] = 1;
      trace_mark("phase A: takes unit", u);
      // The embedding rows this step did not touch have gradient 0 whatever the clip
      // coefficient: update them now (their bf16 copy too), off the critical path.
      if (!emb_untouched_done_ && w_.store.format().is_fp32()) {  // compact: no undo for a skipped step
        ScopedSeconds busy(sp.busy_seconds);
        w_.store.acquire_disk_unit(0);  // moments on disk: a slot, not the file's mapping
        emb_.adamw(EmbeddingGrad::Kind::update, EmbeddingGrad::Rows::untouched, s, s, opt_pool());
        w_.store.disk_unit_done(0);
        emb_untouched_done_ = true;
      }
      if (u > 0) w_.ev.grads_home[size_t(u)]->synchronize();
      ScopedSeconds busy(sp.busy_seconds);  // from here on the CPU works on unit u
      for (int v = u - 1; v >= 0; --v)  // the backward's next unit with moments on disk
        if (w_.store.moments_on_disk(v)) {
          w_.store.prefetch_disk_unit(v);
          break;
        }
      const double sq = unit_sumsq(u);
      sp.sumsq[size_t(u)] = sq;
      sp.have_sq[size_t(u)] = 1;
      running += sq;
      // Coefficient 1 is possible only while the norm so far stays below max_norm - 1e-6;
      // once it cannot, nothing more is speculated.
      const bool safe = may_speculate(running, max_norm, w_.test.speculate_everything);
      if (!safe || !can_speculate(u) || sp.closing) continue;
      if (u == 0) {
        w_.store.acquire_disk_unit(0);
        emb_.adamw(EmbeddingGrad::Kind::update, EmbeddingGrad::Rows::touched, s, s, opt_pool());
        w_.store.disk_unit_done(0);
        sp.speculated[0] = 1;
        continue;
      }
      w_.store.acquire_disk_unit(u);  // moments on disk: its slot (prefetched one unit ago)
      if (w_.store.format().is_fp32()) unit_adamw(EmbeddingGrad::Kind::update, u, WeightsTo::out, spec_out(u), s, s);
      else unit_weights(u, spec_out(u), s);
      w_.store.disk_unit_done(u);
      sp.speculated[size_t(u)] = 1;
    }
  } catch (...) {
    sp.error = std::current_exception();
  }
}

void HostUpdater::finish_speculative(const OptimHyper& h, StepStats& st) {
  SpeculationState& sp = *spec_;
  if (!w_.test.speculate_everything) sp.close();  // the backward is over (run() returned)
  sp.wait_returned();
  trace_mark("finish: phase A returned");
  sp.active = false;
  if (sp.error) std::rethrow_exception(sp.error);
  const int n_units = w_.n_units();
  double sumsq = 0;
  for (int u = 0; u < n_units; ++u) {
    if (!sp.have_sq[size_t(u)]) sp.sumsq[size_t(u)] = unit_sumsq(u);
    sumsq += sp.sumsq[size_t(u)];  // forward order, as finish_deferred sums
  }
  const ClipDecision d = decide_clip(sumsq, h.max_grad_norm);
  d.report(st);
  const AdamWStep s1 = sp.step;
  const std::vector<char> speculated = sp.speculated;
  st.spec_units_left = int(std::count(speculated.begin(), speculated.end(), 0));
  st.spec_busy_seconds = sp.busy_seconds;
  if (!w_.store.format().is_fp32()) return finish_compact(d, s1, speculated);
  if (d.skip) {  // undo what was speculated
    if (emb_untouched_done_)
      emb_.adamw(EmbeddingGrad::Kind::undo, EmbeddingGrad::Rows::untouched, s1, s1, opt_pool());
    if (speculated[0]) emb_.adamw(EmbeddingGrad::Kind::undo, EmbeddingGrad::Rows::touched, s1, s1, opt_pool());
    for (int u = 1; u < n_units; ++u)
      if (speculated[size_t(u)]) unit_adamw(EmbeddingGrad::Kind::undo, u, WeightsTo::out, nullptr, s1, s1);
    homes_.refresh(UnitHomes::DeviceAdamWHomes::keep);  // homes hold gradients: put the unchanged weights back
    return;
  }
  AdamWStep s = s1;
  s.grad_scale = d.coef;
  advance_step(w_.store, s);  // taken now; the update thread applies it
  // A speculated unit kept as it is touches no moment; one to update or redo does.
  const bool clipped = s.grad_scale != 1.f;
  start_updates([this, speculated, clipped](int u) {
                  return !w_.ec.device_adamw(u) && (clipped || !speculated[size_t(u)]);
                },
                [this, s, s1, speculated, untouched = emb_untouched_done_](int u) {
                  finish_unit(u, s, s1, speculated[size_t(u)] != 0, untouched);
                });
}

// Phase B of a compact state: phase A left the state as it was, so a skipped step has nothing
// to undo and a clipped one runs the plain update everywhere (the bits of the deferred update);
// a kept step takes the speculated weights at once and commits those units' state behind the
// round's other units, off the next forward's path (its forward waits per unit, the next
// phase A and every params() for the whole round).
void HostUpdater::finish_compact(const ClipDecision& d, const AdamWStep& s1, const std::vector<char>& speculated) {
  if (d.skip) {
    homes_.refresh(UnitHomes::DeviceAdamWHomes::keep);  // homes hold gradients: the unchanged weights back
    return;
  }
  AdamWStep s = s1;
  s.grad_scale = d.coef;
  advance_step(w_.store, s);  // taken now; the update thread applies it
  const bool kept = s.grad_scale == 1.f;
  auto took = [kept, speculated](int u) { return kept && speculated[size_t(u)] != 0; };
  std::vector<int> commits;
  for (int u : order_)
    if (took(u)) commits.push_back(u);
  start_updates([this, took](int u) { return !w_.ec.device_adamw(u) && !took(u); },
                [this, s, took](int u) {
                  if (took(u)) homes_.take_next(u);
                  else update_unit(u, s);
                },
                nullptr, [this, s, commits] {
                  for (int u : commits) commit_state(u, s);
                });
}

// The kept speculation's state: the update phase A computed the weights of, now written with
// the same arithmetic on the same inputs (the gradient is in `next`: take_next swapped it
// with the home the weights are in).
void HostUpdater::commit_state(int u, const AdamWStep& s) {
  trace_mark("commit: unit", u);
  const auto* g = static_cast<const uint16_t*>(homes_.next(u)->data());
  adamw_update_state(w_.store.state(u), 0, w_.store.numel(u), g, nullptr, w_.store.ranges(u), s, &opt_pool());
}

// Phase B for one unit: its plain update, or keep / redo its speculated one and make `next`
// its home.
void HostUpdater::finish_unit(int u, const AdamWStep& s, const AdamWStep& s1, bool speculated,
                              bool untouched_done) {
  trace_mark(speculated ? "phase B: speculated unit" : "phase B: unit", u);
  if (w_.ec.device_adamw(u)) {
    dev_.adamw(u, s);
    return;
  }
  const bool clipped = s.grad_scale != 1.f;
  if (!speculated && clipped && can_speculate(u)) {
    // Clipped, not reached by phase A: the bits it would have given had it been speculated
    // and redone, so that the result does not depend on how far phase A got. (That costs
    // ~1.5x a plain update: units phase A can never speculate, those without a `next`
    // buffer, get the plain one. On the H200 at 8B batch 64, 4 of 34 units have one.)
    if (u == 0) {
      emb_.adamw(EmbeddingGrad::Kind::update_redo, EmbeddingGrad::Rows::touched, s, s1, opt_pool());
      if (!untouched_done)  // gradient 0: no coefficient, no redo
        emb_.adamw(EmbeddingGrad::Kind::update, EmbeddingGrad::Rows::untouched, s, s, opt_pool());
    } else {
      unit_adamw(EmbeddingGrad::Kind::update_redo, u, WeightsTo::gradient_in_place, nullptr, s, s1);
    }
    return;
  }
  if (!speculated) {
    update_unit(u, s, untouched_done);
    return;
  }
  if (u == 0) {  // untouched rows were done in phase A (gradient 0: no coefficient)
    if (clipped) emb_.adamw(EmbeddingGrad::Kind::redo, EmbeddingGrad::Rows::touched, s, s1, opt_pool());
    return;
  }
  if (clipped) unit_adamw(EmbeddingGrad::Kind::redo, u, WeightsTo::out, spec_out(u), s, s1);  // replace it
  homes_.take_next(u);
}

}  // namespace sf
