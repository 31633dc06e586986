// The sliding-window executor: the GPU (any Backend) holds only a few layers' weights at a
// time ("slots"); fp32 master weights and AdamW state stay on the host (ParamStore).
//
// One step, as build_step_schedule() lists it: the embedding rows are gathered; every
// layer runs over ALL chunks of the step (micro-batches of gradient accumulation included)
// before the next, while the next layer's weights load on the h2d stream and each chunk's
// layer input is saved to the activation store on the d2h stream; the head computes the loss
// and its gradient; backward runs the layers in reverse, fetching saved inputs, recomputing,
// accumulating fp32 weight gradients over the chunks on the device, and returning them to the
// host.
//
// Homes: every layer and the head own one compute-dtype buffer, its "home", in device memory
// (resident) or pinned host memory. It holds the unit's weights from its update until its
// backward, then its gradient (the fp32 device accumulator cast down) until the update, which
// turns it back into weights in place. So weights and gradients of the whole model cost one
// 2-byte copy, split between the tiers by the planner; resident homes are never transferred
// for compute. (With an fp32 compute dtype, as on the host backend, weights load straight
// from the master and homes hold only gradients.) The embedding's state stays on the host:
// the forward's rows are read by the device from the mapped fp32 master table, an untied
// table's gradient is scattered on the device into its sparse rows, a tied one's on the host.
// The first `device_adamw_layers` layers are the exception to "state on the host": their
// master and moments live on the device, and so does their AdamW.
//
// Exactness: the global gradient norm needs every gradient before any update. Deferred mode
// runs the updates after the backward on a CPU thread in forward order (UpdatePipeline; the
// device-AdamW layers are only enqueued, first); the next step's forward waits only for the
// unit it is about to use, so the CPU optimizer
// overlaps the next forward instead of stalling it. Speculative mode (the planner's choice;
// sliding_speculation.cpp) also overlaps the backward: units are updated with coefficient 1
// as their gradients land and redone in one pass if the final norm clips. The result equals
// the plain resident step (ResidentExecutor) up to fp32 summation order, the compute-dtype
// rounding of gradients and, for a clipped speculative step, the undo's rounding.
//
// Streams: compute, h2d, d2h, ordered only by events (one per purpose and slot/buffer).
// Nothing is allocated inside a step. The CPU update is in sliding_update.cpp, the speculative
// one in sliding_speculation.cpp.
#pragma once
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/host/host_backend.h"
#include "core/thread_pool.h"
#include "engine/embedding_grad.h"
#include "engine/engine_config.h"
#include "engine/schedule.h"
#include "engine/step_executor.h"
#include "engine/update_pipeline.h"
#include "model/device_batch.h"
#include "model/recipes.h"

namespace sf {

class SlidingWindowExecutor final : public StepExecutor {
 public:
  SlidingWindowExecutor(Backend& be, const ModelConfig& cfg, const EngineConfig& ec);
  ~SlidingWindowExecutor() override;

  StepStats train_step(std::span<const Batch> micro, const OptimHyper& h) override;
  double eval_loss_sum(const Batch& b) override;
  ParamStore& params() override;
  void params_changed() override;
  const char* name() const override { return name_.c_str(); }

  // Splits micro-batches into chunks of whole sequences of at most max_chunk_tokens.
  std::vector<Batch> make_chunks(std::span<const Batch> micro) const;
  size_t device_bytes() const { return be_.peak_bytes_in_use(); }

 private:
  struct Events;
  void run(const std::vector<Op>& ops, const std::vector<Batch>& chunks, float grad_scale);
  // AdamW of the embedding's touched or untouched rows (embedding_grad.h), bf16 copy of a
  // tied table included.
  void embedding_adamw(EmbeddingGrad::Kind kind, EmbeddingGrad::Rows rows, const AdamWStep& s,
                       const AdamWStep& done);
  int busy_begin();
  void busy_end(int t);
  void exec(const Op& op, const std::vector<Batch>& chunks, float grad_scale);
  void finish_update(const OptimHyper& h, StepStats& st);
  Mat x_mat(int which, int chunk) const;   // X buffer (ping-pong) rows of `chunk`
  Mat dx_mat(int chunk) const;
  Mat store_mat(int layer, int chunk) const;
  const void* host_weights(int unit) const;  // compute-dtype source for a weight load
  void* weights_on_device(const Op& op) const;  // home (resident) or slot
  bool resident(int unit) const { return home_on_device_[size_t(unit)]; }
  // Whose gradient's sum of squares the device reduces (into norms_[unit]): every streamed
  // or resident layer and the head in a reduced compute dtype, and an untied embedding
  // (scattered on the device); the rest are summed on the host.
  bool device_norm(int unit) const {
    return unit == 0 ? device_scatter() : resident(unit) || cd_ != DType::f32;
  }
  // Unit u's optimizer state and AdamW are on the device (EngineConfig::device_adamw_layers).
  bool device_adamw(int u) const { return ec_.device_adamw(u); }
  // Layer k's f32 gradient accumulator: the two alternating ones, or its own (device AdamW
  // layers from 2 on, whose gradient must outlive the backward).
  Buffer& grad_acc(int k) const {
    return k >= 2 && ec_.device_adamw(k + 1) ? *dev_grad_[size_t(k)] : *grad_[k % 2];
  }
  // Its AdamW on the update thread's stream, after its gradient and before its next load.
  void device_unit_adamw(int u, const AdamWStep& s);
  std::vector<int> update_order() const;  // phase B / the deferred update's unit order
  // Starts update(u) over update_order() on the update thread (UpdatePipeline). With the
  // moments on disk, each update first asks for the moments of the next unit that
  // touches_moments(), so the kernel reads them while this one runs.
  void start_updates(std::function<bool(int)> touches_moments, std::function<void(int)> update);
  // Every home gets the compute-dtype weights of the master again (a skipped step: homes
  // hold gradients); with_device_units: also device-optimizer units, whose state the host
  // master then defines (params_changed), else those keep theirs.
  void refresh_homes(bool with_device_units);
  ThreadPool& opt_pool();
  // untouched_done: phase A already updated the embedding's untouched rows (unit 0 only).
  void update_unit(int unit, const AdamWStep& s, bool untouched_done = false);
  // One AdamW operation (update / undo / redo of `done` by s) on layer or head unit u, over
  // its gradient's pieces: new compute-dtype weights to `out` (may be null), or over the
  // gradient in place and back home (in_place); f32 compute writes none.
  void unit_adamw(EmbeddingGrad::Kind kind, int u, uint16_t* out, bool in_place,
                  const AdamWStep& s, const AdamWStep& done);
  // Speculative update (EngineConfig::speculative).
  struct Spec;
  void speculate_loop(AdamWStep s, float max_norm);
  void mark_grad_ready(int unit);
  void embedding_grad_home();  // the embedding's gradient is complete (end of the backward)
  // Runs fn(g, off, len) over unit u's gradient (compute dtype, host memory) in pieces: the
  // home itself (host homes, one piece) or, for device homes, pieces through the two ring
  // buffers, the next piece's download overlapping fn on this one. upload: fn rewrote the
  // piece into new weights, which go back to the home (home_ready is recorded at the end).
  // Called from one update thread at a time.
  void grad_pieces(int u, bool upload, const std::function<void(void*, int64_t, int64_t)>& fn);
  double unit_sumsq(int unit);                 // its gradient's sum of squares, once home
  uint16_t* spec_out(int unit);                // where its speculated weights go
  bool can_speculate(int unit) const;
  void finish_speculative(const OptimHyper& h, StepStats& st);
  void finish_unit(int u, const AdamWStep& s, const AdamWStep& s1, bool speculated,
                   bool untouched_done);

  Backend& be_;
  HostBackend host_;  // host-side ops (embedding gather/scatter) in the reference arithmetic
  ModelConfig cfg_;
  ModelLayout layout_;
  EngineConfig ec_;
  DType cd_;
  std::string name_;
  int64_t max_step_tokens_;

  ParamStore store_;
  UpdatePipeline updates_;
  std::vector<std::unique_ptr<Buffer>> homes_;       // per unit (see above); [0]: tied table
  std::vector<char> home_on_device_;
  std::unique_ptr<Buffer> emb_grad_buf_;             // its storage (host)
  std::unique_ptr<EmbeddingGrad> emb_grad_;          // sparse f32 embedding gradient
  // Phase A updated this step's untouched embedding rows. Phase B reads its own copy: the
  // next step resets this while phase B may still run.
  bool emb_untouched_done_ = false;
  std::unique_ptr<Buffer> table_grad_host_;          // tied: head's share of the table grad
  std::unique_ptr<Buffer> ring_[2];                  // pinned: resident homes' update trips
  int64_t ring_piece_ = 0;                           // elements per ring buffer
  int ring_next_ = 0;                                // the ring buffer the next piece uses
  std::unique_ptr<Buffer> gstage_[2];                // device: gradients cast for the trip home
  std::unique_ptr<Buffer> norms_;                    // device f32 [units]: resident grad norms
  std::unique_ptr<Stream> upd_d2h_, upd_h2d_;        // the update thread's own streams
  float emb_sumsq_ = 0;  // norms_[0] after embedding_grad_on_device (device_norm(0))
  // Device-AdamW layers (index k): fp32 [master | m | v] and, from k = 2, the gradient
  // accumulator; whether the host's copy in store_ is behind (a step updated them since the
  // last params()).
  std::vector<std::unique_ptr<Buffer>> dev_state_, dev_grad_;
  bool host_state_stale_ = false;
  void device_state_copy(bool to_host);  // all device-AdamW layers' state, synchronously
  std::unique_ptr<Buffer> emb_table_;  // the fp32 master table, mapped for embedding_forward
  std::unique_ptr<Buffer> emb_stage_;  // [T_step, C] dX (host; tied tables: host scatter)
  // Untied tables: the step's dX is scattered into the sparse rows on the device (backend
  // embedding_backward into the forward's X buffers, free at the end of the backward, as f32
  // row blocks), then copied home, instead of dX copied home and scattered on the host (on
  // the critical path between two steps). Per token, its row in block 0 / block 1 or -1:
  std::unique_ptr<Buffer> emb_rows_dev_, emb_rows_host_;  // int32 [2, T_step]
  bool device_scatter() const { return !layout_.tied; }
  int64_t emb_block_rows() const;                    // rows of f32 [., C] one X buffer holds
  int64_t emb_block_ = 0;                            // this step's rows per block
  void embedding_grad_on_device(int64_t n_tokens);

  std::unique_ptr<Stream> compute_, h2d_, d2h_;
  // grads_out's casts and sums of squares: next to the following layer's backward on
  // compute_, instead of between two layers (~0.75 ms per layer at 32K tokens).
  std::unique_ptr<Stream> grads_;
  std::unique_ptr<Events> ev_;
  std::vector<std::unique_ptr<Buffer>> slots_;
  std::vector<int> slot_unit_;
  std::unique_ptr<Buffer> head_w_, table_w_, head_g_, table_g_;
  std::unique_ptr<Buffer> grad_[2];
  std::unique_ptr<Buffer> x_[2], dx_, xin_[2];
  std::unique_ptr<Buffer> scratch_, loss_;
  std::vector<std::unique_ptr<Buffer>> act_store_;  // per layer [T_step, C]
  std::vector<std::unique_ptr<DeviceBatch>> batches_;
  std::vector<int64_t> chunk_off_;  // token offset of each chunk in the step
  std::vector<Op> schedule_;
  std::unique_ptr<Spec> spec_;
  std::unique_ptr<ThreadPool> opt_pool_;
  std::vector<std::unique_ptr<Buffer>> next_;  // speculative: next weights per unit (host)
  // Per unit: `next` holds new weights of a resident unit that the next load copies home.
  // Set by phase B (update thread) before updates_ marks the unit done; read and cleared by
  // the thread driving the step after updates_.wait(unit).
  std::vector<char> upload_next_;
  void home_from_next(int u);
  double phase_seconds_[2] = {0, 0};  // forward+head, backward of the last run()
  int busy_used_ = 0;                 // timing event pairs recorded by the current run()
  int busy_first_bwd_ = -1;           // the first of them in the backward (-1: none)
  bool step_end_recorded_ = false;    // Events::step_end holds a previous training step
  double tail_prev_ = 0;              // from its last compute op to step_end
  // Busy and idle device time of the last run() (finished), into st; then marks its end.
  void gpu_times(StepStats& st);
};

}  // namespace sf
