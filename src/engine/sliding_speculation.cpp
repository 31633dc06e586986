// The speculative update of the sliding-window executor (EngineConfig::speculation).
//
// Phase A runs on its own thread during the backward: as units' gradients come home (head,
// last layer ... first layer, embedding; the newest first) it takes each unit's sum of
// squares and, while
// the norm so far cannot need clipping and the unit has a "next" buffer, applies AdamW with
// clip coefficient 1 at once. It stops taking units when the backward ends: what it has not
// reached is left to phase B rather than delaying the step.
//
// Phase B, once the global norm is known, runs on the update thread in forward order,
// pipelined into the next forward (loading unit k waits only for its update): a speculated
// unit is final when the coefficient is 1, else it is redone in one fused pass (undo with
// coefficient 1 + update with the right one, optim/adamw_undo.h); every other unit gets its
// plain update, or with clipping, if phase A could have speculated it, the one-pass
// update-then-redo that gives the speculated path's bits: a clipped step's result does not
// depend on how far phase A got. A non-finite norm skips the step: speculated units are
// undone (to within a few ulps).
//
// Every unit's sum of squares comes from the same source whichever phase takes it (device
// reduction for layers and head, host for the embedding and f32 homes), so the norm, and the
// result, do not depend on how far phase A got.
#include <algorithm>
#include <cmath>

#include "core/stopwatch.h"
#include "core/thread_pool.h"
#include "engine/clip_decision.h"
#include "engine/sliding_executor.h"
#include "engine/sliding_internal.h"
#include "optim/adamw.h"
#include "optim/adamw_undo.h"
#include "optim/grad_norm.h"

namespace sf {

void SlidingWindowExecutor::mark_grad_ready(int unit) {
  if (!spec_ || !spec_->active) return;
  {
    std::lock_guard<std::mutex> lk(spec_->mu);
    spec_->ready[size_t(unit)] = 1;
  }
  spec_->cv.notify_all();
}

// The embedding's gradient is complete (the backward's last step). Speculating, its sum of
// squares is taken here at once, while phase A may still be busy with layer 0's update, and
// phase A leaves the unit to phase B: the backward is over, the embedding would be left to it
// anyway, and the norm is ready as soon as phase A's last unit is. (The tests' speculate-
// everything mode still hands it to phase A.)
void SlidingWindowExecutor::embedding_grad_home() {
  if (!spec_ || !spec_->active || ec_.speculate_everything) {
    mark_grad_ready(0);
    return;
  }
  // Reduced on the device (untied), or summed here (tied; host_pool: phase A owns opt_pool).
  const double sq = device_norm(0) ? double(emb_sumsq_) : emb_grad_->sum_squares(host_pool());
  std::lock_guard<std::mutex> lk(spec_->mu);
  spec_->sumsq[0] = sq;
  spec_->have_sq[0] = 1;
}

// Sum of squares of unit u's gradient once it is home: reduced on the device by grads_out
// (one float back), or summed here in double (the embedding; f32 homes).
double SlidingWindowExecutor::unit_sumsq(int u) {
  if (u == 0) return device_norm(0) ? double(emb_sumsq_) : emb_grad_->sum_squares(opt_pool());
  if (device_norm(u)) {
    float f = 0;
    ev_->grads_home[size_t(u)]->wait(*upd_d2h_);
    be_.copy_to_host(*upd_d2h_, &f, static_cast<const float*>(norms_->data()) + u, 4);
    upd_d2h_->synchronize();
    return double(f);
  }
  return sum_squares_ranges(static_cast<const float*>(homes_[size_t(u)]->data()),
                            store_.numel(u), store_.ranges(u), &opt_pool());
}

// Where unit u's new compute-dtype weights go when speculated or redone: `next` (it becomes
// the home in phase B), the tied table's staging for the embedding, or nowhere (f32 compute:
// weights load straight from the master).
uint16_t* SlidingWindowExecutor::spec_out(int u) {
  if (u == 0) return homes_[0] ? static_cast<uint16_t*>(homes_[0]->data()) : nullptr;
  if (cd_ == DType::f32) return nullptr;
  return static_cast<uint16_t*>(next_[size_t(u)]->data());
}

bool SlidingWindowExecutor::can_speculate(int u) const {
  if (device_adamw(u)) return false;  // updated on the device once the norm is known
  return u == 0 || cd_ == DType::f32 || next_[size_t(u)] != nullptr;
}

// Units are taken newest first (the lowest ready layer): when AdamW falls behind the
// backward, what is left for phase B are the higher layers, which the next forward needs
// last, instead of the lowest, which it needs first.
void SlidingWindowExecutor::speculate_loop(AdamWStep s, float max_norm) {
  const int n_units = store_.n_units();
  std::vector<char> taken(size_t(n_units), 0);
  double running = 0;
  try {
    for (int left = n_units; left > 0; --left) {
      std::vector<int> cand;  // enqueued (ready) and not taken, lowest first
      {
        std::unique_lock<std::mutex> lk(spec_->mu);
        spec_->cv.wait(lk, [&] {
          if (spec_->stop || spec_->closing) return true;
          for (int v = 0; v < n_units; ++v)
            if (spec_->ready[size_t(v)] && !taken[size_t(v)]) return true;
          return false;
        });
        if (spec_->stop || spec_->closing) return;
        for (int v = 0; v < n_units; ++v)
          if (spec_->ready[size_t(v)] && !taken[size_t(v)]) cand.push_back(v);
      }
      // "Ready" means enqueued: the host runs ahead of the device. Take the lowest unit whose
      // gradient has landed; if none has yet, wait for the one that lands first (highest).
      int u = cand.back();
      for (int v : cand)
        if (v == 0 || ev_->grads_home[size_t(v)]->query()) {
          u = v;
          break;
        }
      taken[size_t(u)] = 1;
      if (u <= 3) trace_mark("phase A: takes unit", u);
      // The embedding rows this step did not touch have gradient 0 whatever the clip
      // coefficient: update them now (their bf16 copy too), off the critical path.
      if (!emb_untouched_done_) {
        ScopedSeconds busy(spec_->busy_seconds);
        embedding_adamw(EmbeddingGrad::Kind::update, EmbeddingGrad::Rows::untouched, s, s);
        emb_untouched_done_ = true;
      }
      if (u > 0) ev_->grads_home[size_t(u)]->synchronize();
      ScopedSeconds busy(spec_->busy_seconds);  // from here on the CPU works on unit u
      if (u > 0) store_.prefetch_moments(u - 1);  // the backward's next (moments on disk)
      const double sq = unit_sumsq(u);
      spec_->sumsq[size_t(u)] = sq;
      spec_->have_sq[size_t(u)] = 1;
      running += sq;
      // Coefficient 1 is possible only while the norm so far stays below max_norm - 1e-6;
      // once it cannot, nothing more is speculated.
      const bool safe = may_speculate(running, max_norm, ec_.speculate_everything);
      if (!safe || !can_speculate(u) || spec_->closing) continue;
      if (u == 0) {
        embedding_adamw(EmbeddingGrad::Kind::update, EmbeddingGrad::Rows::touched, s, s);
        spec_->speculated[0] = 1;
        continue;
      }
      unit_adamw(EmbeddingGrad::Kind::update, u, spec_out(u), false, s, s);
      store_.moments_done(u);
      spec_->speculated[size_t(u)] = 1;
    }
  } catch (...) {
    spec_->error = std::current_exception();
  }
}

void SlidingWindowExecutor::finish_speculative(const OptimHyper& h, StepStats& st) {
  if (!ec_.speculate_everything) {
    spec_->close();  // the backward is over (run() returned)
  }
  spec_->thread.join();
  trace_mark("finish: phase A joined");
  spec_->active = false;
  if (spec_->error) std::rethrow_exception(spec_->error);
  const int n_units = store_.n_units();
  double sumsq = 0;
  for (int u = 0; u < n_units; ++u) {
    if (!spec_->have_sq[size_t(u)]) spec_->sumsq[size_t(u)] = unit_sumsq(u);
    sumsq += spec_->sumsq[size_t(u)];  // forward order, as finish_update sums
  }
  const ClipDecision d = decide_clip(sumsq, h.max_grad_norm);
  d.report(st);
  const AdamWStep s1 = spec_->step;
  const std::vector<char> speculated = spec_->speculated;
  st.spec_units_left = int(std::count(speculated.begin(), speculated.end(), 0));
  st.spec_busy_seconds = spec_->busy_seconds;
  if (d.skip) {  // undo what was speculated
    if (emb_untouched_done_)
      embedding_adamw(EmbeddingGrad::Kind::undo, EmbeddingGrad::Rows::untouched, s1, s1);
    if (speculated[0]) embedding_adamw(EmbeddingGrad::Kind::undo, EmbeddingGrad::Rows::touched, s1, s1);
    for (int u = 1; u < n_units; ++u) {
      if (!speculated[size_t(u)]) continue;
      unit_adamw(EmbeddingGrad::Kind::undo, u, nullptr, false, s1, s1);
    }
    refresh_homes(false);  // homes hold gradients: put the unchanged weights back
    return;
  }
  AdamWStep s = s1;
  s.grad_scale = d.coef;
  advance_step(store_, s);  // taken now; the update thread applies it
  // A speculated unit kept as it is touches no moment; one to update or redo does.
  const bool clipped = s.grad_scale != 1.f;
  start_updates([this, speculated, clipped](int u) {
                  return !device_adamw(u) && (clipped || !speculated[size_t(u)]);
                },
                [this, s, s1, speculated, untouched = emb_untouched_done_](int u) {
                  finish_unit(u, s, s1, speculated[size_t(u)] != 0, untouched);
                });
}

// Phase B for one unit: its plain update, or keep / redo its speculated one and make `next`
// its home.
void SlidingWindowExecutor::finish_unit(int u, const AdamWStep& s, const AdamWStep& s1,
                                        bool speculated, bool untouched_done) {
  if (u <= 2) trace_mark(speculated ? "phase B: speculated unit" : "phase B: unit", u);
  if (device_adamw(u)) {
    device_unit_adamw(u, s);
    return;
  }
  if (!speculated && s.grad_scale != 1.f && can_speculate(u)) {
    // Clipped, not reached by phase A: the bits it would have given had it been speculated
    // and redone, so that the result does not depend on how far phase A got. (That costs
    // ~1.5x a plain update: units phase A can never speculate, those without a `next`
    // buffer, get the plain one. On the H200 at 8B batch 64, 4 of 34 units have one.)
    if (u == 0) {
      embedding_adamw(EmbeddingGrad::Kind::update_redo, EmbeddingGrad::Rows::touched, s, s1);
      if (!untouched_done)  // gradient 0: no coefficient, no redo
        embedding_adamw(EmbeddingGrad::Kind::update, EmbeddingGrad::Rows::untouched, s, s);
    } else {
      unit_adamw(EmbeddingGrad::Kind::update_redo, u, nullptr, true, s, s1);
    }
    return;
  }
  if (!speculated) {
    update_unit(u, s, untouched_done);
    return;
  }
  if (u == 0) {  // untouched rows were done in phase A (gradient 0: no coefficient)
    if (s.grad_scale != 1.f)
      embedding_adamw(EmbeddingGrad::Kind::redo, EmbeddingGrad::Rows::touched, s, s1);
    return;
  }
  if (s.grad_scale != 1.f) {  // clipped after all: replace the speculated step
    unit_adamw(EmbeddingGrad::Kind::redo, u, spec_out(u), false, s, s1);
  }
  if (cd_ == DType::f32) return;
  if (resident(u)) {
    // The next forward copies `next` home when it loads the unit (home_from_next); `next` is
    // rewritten only after this unit's next backward.
    upload_next_[size_t(u)] = 1;
  } else {
    std::swap(homes_[size_t(u)], next_[size_t(u)]);
  }
}

}  // namespace sf
