// The sliding-window executor's CPU update (sliding_executor.h): the per-unit AdamW and
// the trips of device homes' gradients through the pinned ring, the deferred update after
// the backward, the embedding's row-run AdamW, and refreshing homes from the master.
#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"
#include "engine/clip_decision.h"
#include "engine/sliding_executor.h"
#include "engine/sliding_internal.h"
#include "optim/adamw.h"
#include "optim/adamw_undo.h"
#include "optim/grad_norm.h"

namespace sf {

// A resident unit's speculated weights wait in `next` until the forward loads the unit: the
// copy goes on h2d in forward order, one layer ahead, instead of all units' copies queueing
// at the step boundary ahead of the embedding and the first layer.
void SlidingWindowExecutor::home_from_next(int u) {
  if (!upload_next_[size_t(u)]) return;
  be_.copy_to_device(*h2d_, homes_[size_t(u)]->data(), next_[size_t(u)]->data(),
                     size_t(store_.numel(u)) * dtype_size(cd_));
  upload_next_[size_t(u)] = 0;
}

void SlidingWindowExecutor::params_changed() {
  updates_.wait_all();
  device_state_copy(false);  // the master is the truth now: device-AdamW layers' too
  host_state_stale_ = false;
  refresh_homes(true);
  // Streamed moments just loaded from a checkpoint: to disk and out of the page cache before
  // the first sweep, which would otherwise stall in page reclaim (no-op when nothing changed).
  for (int u = 0; u < store_.n_units(); ++u) store_.moments_done(u);
}

void SlidingWindowExecutor::refresh_homes(bool with_device_units) {
  std::fill(upload_next_.begin(), upload_next_.end(), 0);  // the master is the truth now
  if (cd_ == DType::f32) return;  // weights load straight from the master
  // Every home (and the tied table's staging) gets the compute-dtype weights.
  std::vector<char> tmp;
  for (int u = 0; u < store_.n_units(); ++u) {
    if (!homes_[size_t(u)] || (device_adamw(u) && !with_device_units)) continue;
    const float* src = store_.master(u);
    size_t n = size_t(store_.numel(u));
    void* dst = homes_[size_t(u)]->data();
    if (u > 0 && resident(u)) {
      tmp.resize(n * dtype_size(cd_));
      dst = tmp.data();
    }
    host_pool().parallel_for(int64_t(n), [&](int64_t b, int64_t e) {
      convert_from_f32(src + b, static_cast<char*>(dst) + size_t(b) * dtype_size(cd_), cd_,
                       size_t(e - b));
    }, 1 << 16);
    if (u > 0 && resident(u)) {
      be_.copy_to_device(*h2d_, homes_[size_t(u)]->data(), tmp.data(), tmp.size());
      h2d_->synchronize();
    }
  }
}

// AdamW of a device-AdamW layer from its f32 accumulator (left there by grads_out), new
// compute-dtype weights straight into its resident home (f32 compute: the master is what
// the layer reads). Per decay range, as adamw_update_ranges does on the host.
void SlidingWindowExecutor::device_unit_adamw(int u, const AdamWStep& s) {
  Stream& st = *upd_h2d_;
  const int k = u - 1;
  const int64_t n = store_.numel(u);
  float* p = static_cast<float*>(dev_state_[size_t(k)]->data());
  float *m = p + n, *v = p + 2 * n;
  const float* g = static_cast<const float*>(grad_acc(k).data());
  char* out = cd_ == DType::f32 ? nullptr : static_cast<char*>(homes_[size_t(u)]->data());
  ev_->grads_home[size_t(u)]->wait(st);
  for (const ParamRange& r : store_.ranges(u)) {
    AdamWStep sr = s;
    if (!r.decay) sr.weight_decay = 0.f;
    be_.adamw(st, p + r.offset, m + r.offset, v + r.offset, g + r.offset,
              out ? out + size_t(r.offset) * dtype_size(cd_) : nullptr, r.numel, sr);
  }
  ev_->home_ready[size_t(u)]->record(st);
  // A shared accumulator is free for the next backward's layer k + 2 (layers 0 and 1).
  if (k < 2) ev_->grads_copied[k % 2]->record(st);
  host_state_stale_ = true;
}

// The CPU optimizer's threads: every core but one, so that the thread driving the GPU (and
// the host-side embedding work) is not starved while AdamW runs under the forward or backward.
ThreadPool& SlidingWindowExecutor::opt_pool() {
  if (!opt_pool_) opt_pool_ = std::make_unique<ThreadPool>(std::max(1, host_pool().size() - 1));
  return *opt_pool_;
}

void SlidingWindowExecutor::embedding_adamw(EmbeddingGrad::Kind kind, EmbeddingGrad::Rows rows,
                                            const AdamWStep& s, const AdamWStep& done) {
  uint16_t* out = homes_[0] ? static_cast<uint16_t*>(homes_[0]->data()) : nullptr;
  emb_grad_->adamw(kind, rows, store_.master(0), store_.m(0), store_.v(0), out,
                   store_.ranges(0)[0].decay, s, done, opt_pool());
}

void SlidingWindowExecutor::finish_update(const OptimHyper& h, StepStats& st) {
  ThreadPool& pool = opt_pool();
  const int n_units = store_.n_units();
  // Global norm: a tied embedding (and f32 homes) in double on the host; the other units
  // were reduced on the device while their gradients went home (the untied embedding's rows
  // as they were scattered).
  std::vector<float> dev_norms(size_t(n_units), 0.f);
  be_.copy_to_host(*compute_, dev_norms.data(), norms_->data(), size_t(n_units) * 4);
  compute_->synchronize();
  double sumsq = device_norm(0) ? double(emb_sumsq_) : emb_grad_->sum_squares(pool);
  for (int u = 1; u < n_units; ++u)
    sumsq += device_norm(u) ? double(dev_norms[size_t(u)])
                            : sum_squares_ranges(static_cast<const float*>(homes_[size_t(u)]->data()),
                                                 store_.numel(u), store_.ranges(u), &pool);
  const ClipDecision d = decide_clip(sumsq, h.max_grad_norm);
  d.report(st);
  if (d.skip) {  // weights stay as they are
    refresh_homes(false);  // homes hold gradients now: put the unchanged weights back
    return;
  }
  const AdamWStep s = next_adamw_step(h, store_, d.coef);
  advance_step(store_, s);  // taken now; the update thread applies it
  start_updates([this](int u) { return !device_adamw(u); },
                [this, s](int u) { update_unit(u, s); });
}

void SlidingWindowExecutor::start_updates(std::function<bool(int)> touches_moments,
                                          std::function<void(int)> update) {
  std::vector<int> order = update_order();
  const int n_units = store_.n_units();
  std::vector<int> next_of(size_t(n_units), -1);
  if (store_.moments_on_disk()) {
    int next = -1;
    for (size_t i = order.size(); i-- > 0;) {
      next_of[size_t(order[i])] = next;
      if (touches_moments(order[i])) next = order[i];
    }
    if (next >= 0) store_.prefetch_moments(next);
  }
  updates_.start(std::move(order), [this, n_units, next_of = std::move(next_of),
                                    update = std::move(update)](int u) {
    if (next_of[size_t(u)] >= 0) store_.prefetch_moments(next_of[size_t(u)]);
    update(u);
    store_.moments_done(u);
    if (u == n_units - 1) upd_h2d_->synchronize();  // the round ends with nothing in flight
  });
}

// Phase B's order: device-AdamW layers first (each is only an enqueue: the GPU updates them
// while the CPU takes the embedding), then forward order: embedding, layers, head (last: the
// round's end is keyed on it).
std::vector<int> SlidingWindowExecutor::update_order() const {
  std::vector<int> order;
  for (int u = 0; u < store_.n_units(); ++u)
    if (device_adamw(u)) order.push_back(u);
  for (int u = 0; u < store_.n_units(); ++u)
    if (!device_adamw(u)) order.push_back(u);
  return order;
}

// One unit's AdamW. The gradient is read in the compute dtype from the unit's home and the
// new compute-dtype weights are written over it in place (element i is read before it is
// written); resident homes make the trip through a pinned ring buffer.
void SlidingWindowExecutor::update_unit(int u, const AdamWStep& s, bool untouched_done) {
  if (device_adamw(u)) {
    device_unit_adamw(u, s);
    return;
  }
  if (u == 0) {  // embedding: sparse f32 gradient on the host; tied bf16 refreshes the table
    embedding_adamw(EmbeddingGrad::Kind::update, EmbeddingGrad::Rows::touched, s, s);
    if (!untouched_done)
      embedding_adamw(EmbeddingGrad::Kind::update, EmbeddingGrad::Rows::untouched, s, s);
    return;
  }
  // The new compute-dtype weights overwrite the gradient in place (element i is read before
  // it is written) and go home with it.
  unit_adamw(EmbeddingGrad::Kind::update, u, nullptr, true, s, s);
}

void SlidingWindowExecutor::unit_adamw(EmbeddingGrad::Kind kind, int u, uint16_t* out,
                                       bool in_place, const AdamWStep& s, const AdamWStep& done) {
  const bool f32 = cd_ == DType::f32;
  grad_pieces(u, in_place && !f32, [&](void* g, int64_t off, int64_t len) {
    const std::vector<ParamRange> r = clip_ranges(store_.ranges(u), off, len);
    float *p = store_.master(u) + off, *m = store_.m(u) + off, *v = store_.v(u) + off;
    uint16_t* o = f32 ? nullptr : in_place ? static_cast<uint16_t*>(g) : out ? out + off : nullptr;
    switch (kind) {
      case EmbeddingGrad::Kind::update:
        if (f32) adamw_update_ranges(p, m, v, static_cast<const float*>(g), o, len, r, s, &opt_pool());
        else adamw_update_ranges(p, m, v, static_cast<const uint16_t*>(g), o, len, r, s, &opt_pool());
        break;
      case EmbeddingGrad::Kind::undo:
        if (f32) adamw_undo_ranges(p, m, v, static_cast<const float*>(g), len, r, s, &opt_pool());
        else adamw_undo_ranges(p, m, v, static_cast<const uint16_t*>(g), len, r, s, &opt_pool());
        break;
      case EmbeddingGrad::Kind::redo:
        if (f32) adamw_redo_ranges(p, m, v, static_cast<const float*>(g), o, len, r, done, s, &opt_pool());
        else adamw_redo_ranges(p, m, v, static_cast<const uint16_t*>(g), o, len, r, done, s, &opt_pool());
        break;
      case EmbeddingGrad::Kind::update_redo:
        if (f32) adamw_update_redo_ranges(p, m, v, static_cast<const float*>(g), o, len, r, done, s, &opt_pool());
        else adamw_update_redo_ranges(p, m, v, static_cast<const uint16_t*>(g), o, len, r, done, s, &opt_pool());
        break;
    }
  });
}

void SlidingWindowExecutor::grad_pieces(int u, bool upload,
                                        const std::function<void(void*, int64_t, int64_t)>& fn) {
  const int64_t n = store_.numel(u);
  if (!resident(u)) {
    fn(homes_[size_t(u)]->data(), 0, n);
    return;
  }
  const size_t es = dtype_size(cd_);
  char* home = static_cast<char*>(homes_[size_t(u)]->data());
  const int64_t P = ring_piece_;
  const int64_t pieces = (n + P - 1) / P;
  auto download = [&](int64_t k, int r) {
    const int64_t off = k * P, len = std::min(P, n - off);
    ev_->grads_home[size_t(u)]->wait(*upd_d2h_);
    ev_->ring_up[r]->wait(*upd_d2h_);  // the buffer's previous upload has left
    be_.copy_to_host(*upd_d2h_, ring_[r]->data(), home + size_t(off) * es, size_t(len) * es);
    ev_->ring_down[r]->record(*upd_d2h_);
  };
  int r = ring_next_;
  download(0, r);
  for (int64_t k = 0; k < pieces; ++k) {
    if (k + 1 < pieces) download(k + 1, r ^ 1);
    ev_->ring_down[r]->synchronize();
    const int64_t off = k * P, len = std::min(P, n - off);
    fn(ring_[r]->data(), off, len);
    if (upload) {
      be_.copy_to_device(*upd_h2d_, home + size_t(off) * es, ring_[r]->data(), size_t(len) * es);
      ev_->ring_up[r]->record(*upd_h2d_);
    }
    r ^= 1;
  }
  ring_next_ = r;
  // Not waited for here: the next forward orders after home_ready, and a ring buffer's next
  // download after its ring_up, so AdamW of the next piece overlaps this upload.
  if (upload) ev_->home_ready[size_t(u)]->record(*upd_h2d_);
}

}  // namespace sf
