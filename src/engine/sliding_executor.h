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
// host_speculation.cpp) also overlaps the backward: units are updated with coefficient 1
// as their gradients land and redone in one pass if the final norm clips. The result equals
// the plain resident step (ResidentExecutor) up to fp32 summation order, the compute-dtype
// rounding of gradients and, for a clipped speculative step, the undo's rounding.
//
// Data parallel (DataParallel, data_parallel.h; absent: one rank, unchanged): this executor
// is rank r of N, each over its share of the global batch. Its ParamStore is carved from the
// ranks' one shared state; the token count is all-reduced before the backward (the loss is
// the mean over the global batch); each unit's gradient is reduce-scattered once it is home
// (grads_out; the embedding's after its backward); the norm is summed over the ranks; this
// rank updates its slice of every unit; a unit is loaded only once every rank's slice is in.
// Built for an fp32 compute dtype (the host backend) with the deferred update and fp32 state;
// other modes are refused by name (checked_for_ranks). A rank whose step throws aborts the
// group, so the others stop with an Error naming it. params_changed() is then collective (a
// barrier first: the state written by one rank is seen by all).
//
// Streams: compute, h2d, d2h, ordered only by events (one per purpose and slot/buffer).
// Nothing is allocated inside a step.
//
// The parts, each in its own file: the buffer list (window_buffers.h), the events
// (window_events.h), the homes and their state (unit_homes.h), the embedding path
// (embedding_path.h), the device-AdamW layers (device_adamw_layers.h), the attention store of
// the layers that keep their attention for the backward (kept_attention.h), the CPU update and the
// speculation on the update thread (host_updater.h) and the step timer (step_timer.h). This
// class interprets the schedule: one short function per op kind, in this file alone; layer
// k's weight transfer is load_weights().
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/data_parallel.h"
#include "engine/device_adamw_layers.h"
#include "engine/embedding_path.h"
#include "engine/engine_config.h"
#include "engine/host_updater.h"
#include "engine/kept_attention.h"
#include "engine/schedule.h"
#include "engine/step_executor.h"
#include "engine/step_timer.h"
#include "engine/unit_homes.h"
#include "engine/window_buffers.h"
#include "engine/window_context.h"
#include "model/device_batch.h"
#include "model/recipes.h"

namespace sf {

class SlidingWindowExecutor final : public StepExecutor {
 public:
  SlidingWindowExecutor(Backend& be, const ModelConfig& cfg, const EngineConfig& ec,
                        const EngineTestModes& test = {}, const DataParallel& dp = {});
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
  static std::vector<BufferSpec> checked_specs(Backend& be, const ModelLayout& layout,
                                               const ModelConfig& cfg, const EngineConfig& ec);
  // ec, once it is known that a data-parallel run (dp active) can run it.
  static const EngineConfig& checked_for_ranks(const EngineConfig& ec, const DataParallel& dp, const Backend& be,
                                               const ModelConfig& cfg);
  StepStats step(std::span<const Batch> micro, const OptimHyper& h);
  StepShape step_shape(int n_chunks, Pass pass) const;
  // A step's op list, checked (check_schedule), with each op's profiler range name.
  struct Schedule {
    std::vector<Op> ops;
    std::vector<std::string> names;  // describe(op), formatted once
    size_t backward_begin = 0;  // the first fetch_input: the forward and head are done
  };
  // The schedule of a step of n_chunks, built and checked on first use.
  const Schedule& schedule(int n_chunks, Pass pass);
  void run(const Schedule& s, const std::vector<Batch>& chunks, float grad_scale);
  float read_loss();
  // One function per op kind (schedule.h).
  void exec(const Op& op, const std::string& name);
  void exec_op(const Op& op);
  void wait_update(const Op& op);
  void load_weights(const Op& op);
  void load_from_master(int u, void* slot);
  void load_head();
  void embed_forward(const Op& op);
  void layer_forward(const Op& op);
  void offload_input(const Op& op);
  void head(const Op& op);
  void grads_out(const Op& op);
  void fetch_input(const Op& op);
  void layer_backward(const Op& op);
  void replay_forward(const Op& op);
  void embed_backward(const Op& op);
  // grads_out's three destinations: the device-AdamW layer's accumulator, a resident home, a
  // host home.
  void grads_stay_on_device(const Op& op, Stream& gs, Mat src);
  void grads_to_resident_home(const Op& op, Stream& gs, Mat src);
  void grads_to_host_home(const Op& op, Stream& gs, Mat src);
  // Data parallel on the GPU (a reduced compute dtype): the accumulator reduce-scattered in
  // place on the comm stream, then only this rank's slice cast (and sum of squares) into its
  // home's slice, and, for a host home, that slice's d2h.
  bool sharded_on_device() const { return dp_.active() && w_.reduced(); }
  void grads_out_sharded(const Op& op, Stream& gs, Buffer& acc);

  Mat rows(Buffer& b, int chunk) const;  // chunk's rows of a [T_step, C] buffer
  Mat x_mat(int which, int chunk) const { return rows(bufs_.at(BufferRole::activations, which), chunk); }
  Mat dx_mat(int chunk) const { return rows(bufs_.at(BufferRole::activation_grad), chunk); }
  Mat store_mat(int layer, int chunk) const { return rows(bufs_.at(BufferRole::act_store, layer), chunk); }
  Mat saved_mat(int buf, int chunk) const {
    return Mat(bufs_.at(BufferRole::saved_input, buf).data(), cd_, chunk_tokens(chunk), cfg_.hidden_size);
  }
  void* weights_on_device(const Op& op) const;  // home (resident), device master or slot
  LayerActs acts_for(int chunk) const;
  int64_t chunk_tokens(int c) const { return batches_[size_t(c)]->inputs().n_tokens; }
  KeptChunk kept_chunk(int c) const { return {c, chunk_off_[size_t(c)], chunk_tokens(c)}; }

  Backend& be_;
  ModelConfig cfg_;
  ModelLayout layout_;
  EngineConfig ec_;
  DataParallel dp_;
  DType cd_;
  std::string name_;
  ParamStore store_;
  WindowBuffers bufs_;
  WindowStreams streams_;
  WindowEvents ev_;
  WindowContext w_;
  UnitHomes homes_;
  EmbeddingPath emb_;
  DeviceAdamWLayers dev_adamw_;
  KeptAttention kept_;
  StepTimer timer_;
  std::vector<std::unique_ptr<DeviceBatch>> batches_;
  std::vector<std::unique_ptr<Buffer>> pinned_masters_;  // from_master: the slots' DMA sources
  std::unique_ptr<Stream> comm_stream_;   // sharded_on_device(): the reduce-scatters
  std::unique_ptr<Event> reduced_[3];     // per accumulator (layer 0, 1; head): its reduce is done
  HostUpdater updater_;  // last: its thread stops before the rest goes

  std::map<std::pair<int, Pass>, Schedule> schedules_;
  // The step being run.
  const std::vector<Batch>* chunks_ = nullptr;
  std::vector<int64_t> chunk_off_;  // token offset of each chunk in the step
  float grad_scale_ = 0;
  bool backward_ = false;
};

}  // namespace sf
