// The speculative update of the sliding-window executor (EngineConfig::speculation): phase A
// runs AdamW during the backward as gradients come home; phase B, once the global norm is
// known, keeps or rolls back and redoes those updates and does the rest.
#include <cmath>

#include "core/thread_pool.h"
#include "engine/adamw_rollback.h"
#include "engine/sliding_executor.h"
#include "engine/sliding_internal.h"
#include "optim/adamw.h"
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

// The unit's gradient, in host memory: the home itself, or (resident homes) a copy in the
// ring. Called from the update threads only.
const void* SlidingWindowExecutor::fetch_grad(int unit, int ring) {
  if (unit == 0) return emb_grad_->data();
  if (!resident(unit)) return homes_[size_t(unit)]->data();
  const size_t bytes = size_t(store_.numel(unit)) * dtype_size(cd_);
  ev_->grads_home[size_t(unit)]->wait(*upd_d2h_);
  be_.copy_to_host(*upd_d2h_, ring_[ring]->data(), homes_[size_t(unit)]->data(), bytes);
  upd_d2h_->synchronize();
  return ring_[ring]->data();
}

// Phase A, on its own thread during the backward: take each unit's gradient as it comes home
// (head, last layer ... first layer, embedding), add its sum of squares to the global norm,
// and while the norm so far cannot need clipping, apply AdamW with coefficient 1 at once.
void SlidingWindowExecutor::speculate_loop(AdamWStep s, float max_norm) {
  const int n_units = store_.n_units();
  std::vector<int> order;
  order.push_back(n_units - 1);
  for (int u = n_units - 2; u >= 0; --u) order.push_back(u);
  double running = 0;
  int ring = 0;
  try {
    for (int u : order) {
      {
        std::unique_lock<std::mutex> lk(spec_->mu);
        spec_->cv.wait(lk, [&] { return spec_->stop || spec_->ready[size_t(u)] != 0; });
        if (spec_->stop) return;
      }
      if (u > 0) ev_->grads_home[size_t(u)]->synchronize();
      const DType gt = u == 0 ? DType::f32 : cd_;
      const void* g = fetch_grad(u, ring);
      ring ^= 1;
      const double sq = gt == DType::f32
          ? sum_squares_ranges(static_cast<const float*>(g), store_.numel(u), store_.ranges(u), &opt_pool())
          : sum_squares_ranges(static_cast<const uint16_t*>(g), store_.numel(u), store_.ranges(u), &opt_pool());
      spec_->sumsq[size_t(u)] = sq;
      running += sq;
      // Coefficient 1 is certain only if even the final norm (>= this one) can stay below
      // max_norm - 1e-6; otherwise stop speculating and leave the rest to phase B.
      const bool safe = std::isfinite(running) && (max_norm <= 0 || std::sqrt(running) + 1e-6 < max_norm);
      if (!safe) continue;
      uint16_t* out = nullptr;
      if (u == 0) out = homes_[0] ? static_cast<uint16_t*>(homes_[0]->data()) : nullptr;
      else if (cd_ != DType::f32) out = static_cast<uint16_t*>(next_[size_t(u)]->data());
      if (gt == DType::f32)
        adamw_update_ranges(store_.master(u), store_.m(u), store_.v(u), static_cast<const float*>(g),
                            out, store_.numel(u), store_.ranges(u), s, &opt_pool());
      else
        adamw_update_ranges(store_.master(u), store_.m(u), store_.v(u), static_cast<const uint16_t*>(g),
                            out, store_.numel(u), store_.ranges(u), s, &opt_pool());
      spec_->speculated[size_t(u)] = 1;
    }
  } catch (...) {
    spec_->error = std::current_exception();
  }
}

// Phase B: the global norm is known. Speculated units are final when the coefficient is 1;
// otherwise they are rolled back and redone, and the other units are updated, in forward
// order on the update thread (pipelined into the next forward). New weights land in `next`,
// which becomes the home (host homes: a pointer swap; resident homes: one h2d copy).
void SlidingWindowExecutor::finish_speculative(const OptimHyper& h, StepStats& st) {
  spec_->thread.join();
  spec_->active = false;
  if (spec_->error) std::rethrow_exception(spec_->error);
  double sumsq = 0;
  for (double x : spec_->sumsq) sumsq += x;
  st.grad_norm = std::sqrt(sumsq);
  const int n_units = store_.n_units();
  const AdamWStep s1 = spec_->step;
  if (!std::isfinite(st.grad_norm)) {  // skip the step: undo what was speculated
    st.clip_coef = 0;
    for (int u = 0; u < n_units; ++u)
      if (spec_->speculated[size_t(u)])
        adamw_rollback_ranges(store_.master(u), store_.m(u), store_.v(u), fetch_grad(u, 0),
                              u == 0 ? DType::f32 : cd_, store_.numel(u), store_.ranges(u), s1,
                              &opt_pool());
    params_changed();
    return;
  }
  st.clip_coef = clip_coefficient(st.grad_norm, h.max_grad_norm);
  AdamWStep s = s1;
  s.grad_scale = float(st.clip_coef);
  store_.step = s.step;
  std::vector<int> order(static_cast<size_t>(n_units));
  for (int u = 0; u < n_units; ++u) order[size_t(u)] = u;
  updates_.start(order, [this, s, s1, speculated = spec_->speculated](int u) {
    static thread_local int trips = 0;
    const int ring = (trips++) & 1;
    const bool done = speculated[size_t(u)] && s.grad_scale == 1.f;
    if (!done) {
      const void* g = fetch_grad(u, ring);
      const DType gt = u == 0 ? DType::f32 : cd_;
      if (speculated[size_t(u)])
        adamw_rollback_ranges(store_.master(u), store_.m(u), store_.v(u), g, gt, store_.numel(u),
                              store_.ranges(u), s1, &opt_pool());
      uint16_t* out = nullptr;
      if (u == 0) out = homes_[0] ? static_cast<uint16_t*>(homes_[0]->data()) : nullptr;
      else if (cd_ != DType::f32) out = static_cast<uint16_t*>(next_[size_t(u)]->data());
      if (gt == DType::f32)
        adamw_update_ranges(store_.master(u), store_.m(u), store_.v(u), static_cast<const float*>(g),
                            out, store_.numel(u), store_.ranges(u), s, &opt_pool());
      else
        adamw_update_ranges(store_.master(u), store_.m(u), store_.v(u), static_cast<const uint16_t*>(g),
                            out, store_.numel(u), store_.ranges(u), s, &opt_pool());
    }
    if (u == 0 || cd_ == DType::f32) return;
    if (resident(u)) {
      const size_t bytes = size_t(store_.numel(u)) * dtype_size(cd_);
      be_.copy_to_device(*upd_h2d_, homes_[size_t(u)]->data(), next_[size_t(u)]->data(), bytes);
      ev_->home_ready[size_t(u)]->record(*upd_h2d_);
      upd_h2d_->synchronize();
    } else {
      std::swap(homes_[size_t(u)], next_[size_t(u)]);
    }
  });
}

}  // namespace sf
