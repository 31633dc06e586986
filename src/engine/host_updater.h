// The sliding window's optimizer update on the host (and the enqueueing of the device-AdamW
// layers'), all of it on one persistent update thread (UpdatePipeline).
//
// Deferred: after the backward the global norm is summed (device-reduced sums of squares for
// layers and head, host sums for the embedding and f32 homes), decide_clip decides, and the
// units are updated in forward order, pipelined into the next forward: loading unit k waits
// only for update k. Each gradient is read in the compute dtype from its home and the new
// weights are written over it in place; resident homes make the trip through a pinned ring.
//
// Speculative (EngineConfig::speculation): phase A runs during the backward. As units'
// gradients come home (head, last layer ... first, embedding; the newest first) it takes each
// unit's sum of squares and, while the norm so far cannot need clipping (may_speculate) and
// the unit has a "next" buffer, applies AdamW with coefficient 1 at once. It stops taking
// units when the backward ends. Phase B, once the norm is known, runs like the deferred
// update: a speculated unit is final when the coefficient is 1, else it is redone in one fused
// pass (optim/adamw_undo.h); a unit phase A could have speculated but did not reach gets the
// one-pass update-then-redo that gives the speculated bits, so a clipped step's result does
// not depend on how far phase A got. A non-finite norm skips the step: speculated units are
// undone (to within a few ulps).
//
// Landing (EngineConfig::HostWeights::master, steps without clipping): the round starts with
// the step's first gradient (start_landing) and updates each unit as its gradient lands, in
// the backward's order; streamed layers read theirs from the gradient ring and write only the
// fp32 master (the next load casts it on the device). A unit whose own gradient is not finite
// is left as it was and the step then fails: the units before it were already updated, and
// without a copy of every gradient nothing can be undone.
#pragma once
#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "core/thread_pool.h"
#include "engine/clip_decision.h"
#include "engine/data_parallel.h"
#include "engine/device_adamw_layers.h"
#include "engine/embedding_path.h"
#include "engine/step_executor.h"
#include "engine/unit_homes.h"
#include "engine/update_pipeline.h"
#include "engine/window_context.h"

namespace sf {

struct SpeculationState;

class HostUpdater {
 public:
  // dp (active): this rank's share of a data-parallel update (data_parallel.h): the finish is
  // then finish_sharded, and every wait also waits for the other ranks' slices.
  HostUpdater(WindowContext& w, UnitHomes& homes, EmbeddingPath& emb, DeviceAdamWLayers& dev,
              const DataParallel* dp = nullptr);
  ~HostUpdater();

  // Before the step's run, with the schedule's update order: whether this step speculates
  // (phase A is then posted).
  bool begin_step(const OptimHyper& h, std::vector<int> order);
  // The backward's first gradient is about to go home: a landing round starts here.
  void start_landing();
  void grad_ready(int u);      // grads_out has enqueued u's gradient's trip home
  void embedding_grad_home();  // the embedding's gradient is complete
  // After the run: the norm, the clip decision, and the updates started on the update thread
  // in begin_step's order (the schedule's update ops: device-AdamW layers first, then forward
  // order; landing: the backward's order, already running).
  void finish(const OptimHyper& h, StepStats& st);

  // Unit u's update of the previous step (data parallel: every rank's slice of it).
  void wait(int u) {
    updates_.wait(u);
    if (sharded_) sharded_->wait(u);
  }
  void wait_all() {
    updates_.wait_all();
    if (sharded_) sharded_->wait_all();
  }
  // Data parallel (else null / no-ops): this rank's share; reduce_grad(u) after grads_out of
  // layer or head u enqueued its trip home (collective: waits for the trip, reduce-scatters);
  // abort_ranks when this rank's step failed (the other ranks' waits and calls then throw).
  ShardedUpdate* sharded() const { return sharded_.get(); }
  void reduce_grad(int u);
  void abort_ranks(const std::string& why) noexcept {
    if (sharded_) sharded_->abort(why);
  }
  double take_wait_seconds() { return updates_.take_wait_seconds(); }
  double last_round_seconds() const { return updates_.last_round_seconds(); }

 private:
  // Whose gradient's sum of squares the device reduces (into norms[u]): every streamed or
  // resident layer and the head in a reduced compute dtype, and an untied embedding.
  bool device_norm(int u) const { return u == 0 ? emb_.device_norm() : homes_.resident(u) || w_.reduced(); }
  ThreadPool& opt_pool();
  void finish_deferred(const OptimHyper& h, StepStats& st);
  void finish_speculative(const OptimHyper& h, StepStats& st);
  void finish_landing(const OptimHyper& h, StepStats& st);
  void finish_sharded(const OptimHyper& h, StepStats& st);
  // The GPU path of a sharded update: this rank's slice of unit u's home (its reduced bf16
  // gradient, turned into the new weights in place), then, once every rank's slice is in,
  // the other slices of the home from the shared master.
  void update_home_slice(int u, const AdamWStep& s, int64_t round);
  void refresh_other_slices(int u);
  void land_unit(int u, const AdamWStep& s);
  void wait_landed(int u);  // until grads_out (embedding: its backward) has enqueued u's trip
  // Starts update(u) over order_; with the moments on disk, each update first asks
  // for the moments of the next unit that touches_moments(), so the kernel reads them while
  // this one runs.
  // wait_for_gradient(u), when given, runs first (landing: until u's gradient is on its way).
  // after(), when given, runs behind the round's units (UpdatePipeline::start).
  void start_updates(std::function<bool(int)> touches_moments, std::function<void(int)> update,
                     std::function<void(int)> wait_for_gradient = nullptr,
                     std::function<void()> after = nullptr);
  void update_unit(int u, const AdamWStep& s, bool untouched_done = false);
  // One AdamW operation on layer or head unit u over its gradient's pieces: new weights to
  // `out` (null: none), or over the gradient in place and back home.
  enum class WeightsTo : uint8_t { out, gradient_in_place };
  void unit_adamw(EmbeddingGrad::Kind kind, int u, WeightsTo to, uint16_t* out, const AdamWStep& s,
                  const AdamWStep& done);
  // fn(g, off, len) over unit u's gradient (compute dtype, host memory) in pieces: the home
  // itself (host homes) or pieces through the two ring buffers, the next piece's download
  // overlapping fn on this one. rewrite: fn turns each piece into weights, which go home.
  enum class Pieces : uint8_t { read, rewrite };
  // [b, e) (e < 0: to the end): only those elements of the unit (a data-parallel slice).
  void grad_pieces(int u, Pieces mode, const std::function<void(void*, int64_t, int64_t)>& fn, int64_t b = 0,
                   int64_t e = -1);
  void speculate_loop(AdamWStep s, float max_norm);
  double unit_sumsq(int u);
  uint16_t* spec_out(int u);
  bool can_speculate(int u) const;
  void finish_unit(int u, const AdamWStep& s, const AdamWStep& s1, bool speculated, bool untouched_done);
  // A compact state's speculation (no undo): phase A's weights of unit u into out, the state
  // untouched; phase B; and the kept step's state, written behind the round.
  void unit_weights(int u, uint16_t* out, const AdamWStep& s);
  void finish_compact(const ClipDecision& d, const AdamWStep& s1, const std::vector<char>& speculated);
  void commit_state(int u, const AdamWStep& s);
  void abandon_speculation();

  WindowContext& w_;
  UnitHomes& homes_;
  EmbeddingPath& emb_;
  DeviceAdamWLayers& dev_;
  std::unique_ptr<ThreadPool> opt_pool_;
  int64_t ring_piece_ = 0;  // elements per ring buffer
  int ring_next_ = 0;       // the ring buffer the next piece uses
  // Phase A updated this step's untouched embedding rows. Phase B reads its own copy: the
  // next step resets this while phase B may still run.
  bool emb_untouched_done_ = false;
  std::vector<int> order_;  // this step's update order
  // Landing: which units' gradients are on their way (set by the step's thread), their sums
  // of squares as the round took them, and whether one was not finite.
  struct Landing {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<char> enqueued;
    std::vector<double> sumsq;
    bool aborted = false, not_finite = false;
  } landing_;
  AdamWStep landing_step_{};
  std::unique_ptr<SpeculationState> spec_;
  std::unique_ptr<ShardedUpdate> sharded_;  // data parallel only
  UpdatePipeline updates_;  // last: its thread stops first
};

}  // namespace sf
