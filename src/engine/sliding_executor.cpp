#include "engine/sliding_executor.h"

#include <algorithm>

#include "core/stopwatch.h"

namespace sf {

SlidingWindowExecutor::SlidingWindowExecutor(Backend& be, const ModelConfig& cfg, const EngineConfig& ec,
                                             const EngineTestModes& test, const DataParallel& dp)
    : be_(be), cfg_(cfg), layout_(ModelLayout::build(cfg)), ec_(checked_for_ranks(ec, dp, be, cfg)), dp_(dp),
      cd_(be.compute_dtype()),
      name_(cat("sliding window (", ec.n_slots, " slots) on ", be.name(),
                dp.active() ? cat(", rank ", dp.rank(), " of ", dp.world()) : std::string())),
      store_(state_units(layout_), ec.state_format, ec.moments_dir, ec.moments_streamed,
             DiskUnits{ec.disk_moment_units, ec.masters_on_disk}, dp.active() ? dp.state : ExternalStateMemory{}),
      bufs_(be, checked_specs(be, layout_, cfg, ec), dp.homes),
      streams_(be),
      ev_(be, ec.n_slots, ec.max_chunks, int(layout_.units.size())),
      w_{be, cfg_, layout_, ec_, test, cd_, store_, bufs_, ev_, streams_, ec.max_chunk_tokens * ec.max_chunks},
      homes_(w_), emb_(w_), dev_adamw_(w_, homes_), kept_(w_),
      timer_(be, *streams_.compute, (3 * layout_.n_layers + 1) * ec.max_chunks),  // + replays
      updater_(w_, homes_, emb_, dev_adamw_, &dp_) {
  // The masters the slots load from are DMA sources: pinned (a no-op on the host backend).
  for (int u = 1; u < w_.n_units(); ++u)
    if (homes_.from_master(u) && w_.reduced())
      pinned_masters_.push_back(ec.bf16_master()
                                    ? be.map_host(store_.master_bf16(u), size_t(store_.numel(u)) * 2,
                                                  cat("bf16 master of unit ", u))
                                    : be.map_host(store_.master(u), size_t(store_.numel(u)) * 4,
                                                  cat("fp32 master of unit ", u)));
  for (int c = 0; c < ec.max_chunks; ++c)
    batches_.push_back(std::make_unique<DeviceBatch>(be, *streams_.h2d, cfg, ec.max_chunk_tokens,
                                                     &bufs_.at(BufferRole::batch_inputs, c)));
  if (dp.active()) homes_.share_with_ranks(dp.rank(), dp.world());
  if (sharded_on_device()) {
    comm_stream_ = be.create_stream("comm");
    for (auto& e : reduced_) e = be.create_event();
  }
  streams_.h2d->synchronize();
}

// The settings are checked before anything is allocated.
std::vector<BufferSpec> SlidingWindowExecutor::checked_specs(Backend& be, const ModelLayout& layout,
                                                             const ModelConfig& cfg, const EngineConfig& ec) {
  const DType cd = be.compute_dtype();
  SF_REQUIRE(ec.n_slots >= 2, "sliding window: at least 2 weight slots are needed");
  SF_REQUIRE(ec.max_chunk_tokens > 0 && ec.max_chunks >= 1, "sliding window: empty chunks");
  SF_CHECK(cd == DType::f32 || cd == DType::bf16, "compute dtype must be f32 or bf16");
  SF_REQUIRE(ec.resident_layers >= 0 && ec.resident_layers <= layout.n_layers,
             "resident_layers must be in [0, n_layers]");
  SF_REQUIRE(ec.head_resident || cd == DType::f32,
             "with a reduced-precision compute dtype the head's home must be resident");
  SF_REQUIRE(ec.device_adamw_layers >= 0 && ec.device_adamw_layers <= layout.n_layers,
             "device_adamw_layers must be in [0, n_layers]");
  SF_REQUIRE(ec.state_format.is_fp32() || !ec.speculative() || cd != DType::f32,
             "sliding window: a compact optimizer state speculates only the weights, into bf16 `next` "
             "buffers, so a speculative update needs a reduced compute dtype");
  SF_REQUIRE(!ec.masters_on_disk || (ec.bf16_master() && !ec.from_master() && !ec.moments_dir.empty()),
             "sliding window: masters on the disk tier need a bf16 master, an --optimizer-dir and weights "
             "that stream from compute-dtype homes (not from the master)");
  return window_buffer_specs(cfg, ec, cd);
}

// What data parallel is built for so far (docs/MULTI_GPU.md); everything else is refused by
// the flag or mode that asks for it, never run half-right.
const EngineConfig& SlidingWindowExecutor::checked_for_ranks(const EngineConfig& ec, const DataParallel& dp,
                                                             const Backend& be, const ModelConfig& cfg) {
  if (!dp.active()) return ec;
  const char* one = "; train with --gpus 1 for this mode";
  SF_REQUIRE(dp.counters && dp.state.base, "data parallel: the shared state and update counters are missing");
  if (be.compute_dtype() != DType::f32) {  // the GPU path: gradients reduced on the device
    SF_REQUIRE(dp.device_reduce_scatter, "--gpus ", dp.world(), ": data parallel with a ",
               dtype_name(be.compute_dtype()), " compute dtype needs the device reduce-scatter (NCCL); "
               "use --backend host, or --gpus 1");
    SF_REQUIRE(ec.data_parallel_world == dp.world(), "data parallel: the plan's accumulators are padded for ",
               ec.data_parallel_world, " ranks, the run has ", dp.world(), "; re-plan");
  }
  SF_REQUIRE(!ec.speculative(), "data parallel: the speculative update is not built for several ranks "
             "(the plan must use the deferred update)", one);
  SF_REQUIRE(!ec.from_master(), "data parallel: streaming the weights from the master (a --max-grad-norm 0 "
             "plan without gradient copies) is not built for several ranks; give the plan the host memory "
             "for the gradient copies", one);
  SF_REQUIRE(ec.state_format.is_fp32(), "--optimizer-state / --master-weights: data parallel needs the "
             "fp32 optimizer state (fp32 master, m and v)", one);
  SF_REQUIRE(ec.moments_dir.empty(), "--optimizer-dir: data parallel keeps the AdamW moments in the "
             "ranks' shared memory, not on a disk", one);
  SF_REQUIRE(ec.device_adamw_layers == 0, "--device-adamw-layers: data parallel updates every layer on "
             "the host (slices per rank); use --device-adamw-layers 0", one);
  SF_REQUIRE(be.compute_dtype() == DType::f32 || !cfg.tie_word_embeddings, "data parallel on the GPU: "
             "tied embeddings (the head's share of the table's gradient) are not built for several ranks", one);
  return ec;
}

SlidingWindowExecutor::~SlidingWindowExecutor() = default;

ParamStore& SlidingWindowExecutor::params() {
  updater_.wait_all();
  dev_adamw_.bring_home_if_stale();
  return store_;
}

void SlidingWindowExecutor::params_changed() {
  if (dp_.active()) dp_.comm->barrier();  // whichever rank wrote the shared state is done
  updater_.wait_all();
  dev_adamw_.host_is_truth();  // the master is the truth now: device-AdamW layers' too
  homes_.refresh(UnitHomes::DeviceAdamWHomes::refresh);
  if (homes_.any_shared()) dp_.comm->barrier();  // each rank refreshed its slices of the shared homes
  // State on disk just loaded from a checkpoint through the file's mapping: to the file and
  // out of this process before the first sweep (streamed: out of the page cache too, or the
  // sweep would stall in page reclaim; no-op when nothing changed).
  for (int u = 0; u < store_.n_units(); ++u) store_.settle_mapping(u);
}

StepShape SlidingWindowExecutor::step_shape(int n_chunks, Pass pass) const {
  StepShape sh{layout_.n_layers, n_chunks, ec_.n_slots, pass};
  const int n = w_.n_units();
  sh.weights_on_device.assign(size_t(n), 0);
  sh.device_adamw.assign(size_t(n), 0);
  for (int u = 1; u < n; ++u) {
    sh.weights_on_device[size_t(u)] = (homes_.resident(u) && w_.reduced()) || ec_.device_adamw(u);
    sh.device_adamw[size_t(u)] = ec_.device_adamw(u);
  }
  sh.updates_as_gradients_land = ec_.from_master();
  for (int k = 0; k < layout_.n_layers; ++k) sh.saved_input.push_back(ec_.saves_input(k));
  return sh;
}

const SlidingWindowExecutor::Schedule& SlidingWindowExecutor::schedule(int n_chunks, Pass pass) {
  const auto key = std::make_pair(n_chunks, pass);
  if (auto it = schedules_.find(key); it != schedules_.end()) return it->second;
  const StepShape sh = step_shape(n_chunks, pass);
  std::vector<Op> ops = build_step_schedule(sh);
  const std::string wrong = check_schedule(sh, ops);
  SF_CHECK(wrong.empty(), "the step schedule is unsound: ", wrong);
  Schedule s{std::move(ops), {}};
  for (const Op& op : s.ops) s.names.push_back(describe(op));
  const auto fetch = std::find_if(s.ops.begin(), s.ops.end(), [](const Op& o) { return o.kind == OpKind::fetch_input; });
  s.backward_begin = size_t(fetch - s.ops.begin());
  return schedules_.emplace(key, std::move(s)).first->second;
}

Mat SlidingWindowExecutor::rows(Buffer& b, int chunk) const {
  return Mat(b.data(), cd_, w_.max_step_tokens, cfg_.hidden_size)
      .row_block(chunk_off_[size_t(chunk)], chunk_tokens(chunk));
}

LayerActs SlidingWindowExecutor::acts_for(int c) const {
  Buffer& s = bufs_.at(BufferRole::scratch);
  return bind_layer_acts(cfg_, chunk_tokens(c), cd_, s.data(), s.bytes(), ec_.mlp_tile_tokens);
}

void* SlidingWindowExecutor::weights_on_device(const Op& op) const {
  const bool device_adamw = ec_.device_adamw(op.unit);
  if (device_adamw && !w_.reduced() && !ec_.bf16_master()) return dev_adamw_.master(op.unit);
  if (op.unit > 0 && homes_.resident(op.unit) && (w_.reduced() || device_adamw)) return homes_.home(op.unit)->data();
  return bufs_.at(BufferRole::weight_slot, op.slot).data();
}

std::vector<Batch> SlidingWindowExecutor::make_chunks(std::span<const Batch> micro) const {
  std::vector<Batch> chunks;
  for (const Batch& b : micro) {
    if (b.n_tokens() <= ec_.max_chunk_tokens) {
      chunks.push_back(b);
      continue;
    }
    Batch cur;
    cur.cu_seqlens.push_back(0);
    for (int s = 0; s < b.n_seqs(); ++s) {
      int32_t s0 = b.cu_seqlens[size_t(s)], s1 = b.cu_seqlens[size_t(s) + 1];
      SF_REQUIRE(s1 - s0 <= ec_.max_chunk_tokens, "a sequence of ", s1 - s0,
                 " tokens is longer than the engine's chunk of ", ec_.max_chunk_tokens,
                 " tokens; plan with a larger chunk or shorter sequences");
      if (cur.n_tokens() + (s1 - s0) > ec_.max_chunk_tokens) {
        chunks.push_back(std::move(cur));
        cur = Batch();
        cur.cu_seqlens.push_back(0);
      }
      for (int32_t t = s0; t < s1; ++t) {
        cur.tokens.push_back(b.tokens[size_t(t)]);
        cur.labels.push_back(b.labels[size_t(t)]);
        cur.positions.push_back(b.positions[size_t(t)]);
      }
      cur.cu_seqlens.push_back(int32_t(cur.tokens.size()));
    }
    if (cur.n_tokens() > 0) chunks.push_back(std::move(cur));
  }
  SF_REQUIRE(int(chunks.size()) <= ec_.max_chunks, "the step has ", chunks.size(),
             " chunks but the engine was planned for ", ec_.max_chunks,
             "; lower --batch-size or --grad-accum, or re-plan");
  return chunks;
}

// ---- the interpreter -------------------------------------------------------------------

// Each op inside a named profiler range ("layer_forward unit=4 layer=3 chunk=0 slot=1").
void SlidingWindowExecutor::exec(const Op& op, const std::string& name) {
  if (!be_.annotates()) return exec_op(op);
  be_.range_push(name.c_str());
  try {
    exec_op(op);
  } catch (...) {
    be_.range_pop();
    throw;
  }
  be_.range_pop();
}

void SlidingWindowExecutor::exec_op(const Op& op) {
  switch (op.kind) {
    case OpKind::wait_update: return wait_update(op);
    case OpKind::load_weights:
    case OpKind::home_weights: return op.unit == w_.head_unit() ? load_head() : load_weights(op);
    case OpKind::embed_forward: return embed_forward(op);
    case OpKind::layer_forward: return layer_forward(op);
    case OpKind::offload_input: return offload_input(op);
    case OpKind::head: return head(op);
    case OpKind::grads_out: return grads_out(op);
    case OpKind::fetch_input: return fetch_input(op);
    case OpKind::layer_backward: return layer_backward(op);
    case OpKind::embed_backward: return embed_backward(op);
    case OpKind::replay_forward: return replay_forward(op);
    case OpKind::update: SF_FAIL(internal, "update ops run after the step (HostUpdater::finish)");
  }
}

void SlidingWindowExecutor::wait_update(const Op& op) {
  trace_mark("wait_update: waits for unit", op.unit);
  updater_.wait(op.unit);  // this unit's AdamW of the previous step
  trace_mark("wait_update: update ready, unit", op.unit);
  if (op.unit > 0) homes_.expect(op.unit, HomeState::weights, "wait_update");
}

// Layer k's weight transfer: its compute-dtype weights from the host into a slot on h2d, or,
// when they are home on the device already, only the order after their trip home.
void SlidingWindowExecutor::load_weights(const Op& op) {
  Event& ready = *ev_.slot_ready[size_t(op.slot)];
  Stream& h2d = *streams_.h2d;
  if (op.kind == OpKind::home_weights) {
    ev_.home_ready[size_t(op.unit)]->wait(h2d);
    homes_.upload_next(op.unit);  // speculated weights waiting in `next`
    ready.record(h2d);
    return;
  }
  ev_.slot_free[size_t(op.slot)]->wait(h2d);
  void* slot = bufs_.at(BufferRole::weight_slot, op.slot).data();
  if (homes_.from_master(op.unit) && w_.reduced()) {
    load_from_master(op.unit, slot);
  } else {
    const size_t bytes = size_t(layout_.units[size_t(op.unit)].numel) * dtype_size(cd_);
    be_.copy_to_device(h2d, slot, homes_.host_weights(op.unit), bytes);
  }
  ready.record(h2d);
}

// The fp32 master in pieces through the stage, each cast into the slot on h2d (one stream:
// a piece's copy waits for the previous cast, which takes a few percent of the copy's time).
// A bf16 master is the compute dtype's bits already: one copy, half the bytes.
void SlidingWindowExecutor::load_from_master(int u, void* slot) {
  Stream& h2d = *streams_.h2d;
  if (ec_.bf16_master()) {
    SF_CHECK(cd_ == DType::bf16, "a bf16 master streams into bf16 slots only");
    be_.copy_to_device(h2d, slot, store_.master_bf16(u), size_t(store_.numel(u)) * 2);
    return;
  }
  Buffer& stage = bufs_.at(BufferRole::master_stage);
  const int64_t n = store_.numel(u), P = int64_t(stage.bytes() / 4);
  const float* master = store_.master(u);
  for (int64_t off = 0; off < n; off += P) {
    const int64_t len = std::min(P, n - off);
    be_.copy_to_device(h2d, stage.data(), master + off, size_t(len) * 4);
    be_.cast(h2d, Mat(static_cast<char*>(slot) + size_t(off) * dtype_size(cd_), cd_, 1, len),
             Mat(stage.data(), DType::f32, 1, len));
  }
}

void SlidingWindowExecutor::load_head() {
  const int head = w_.head_unit();
  Stream& h2d = *streams_.h2d;
  if (Buffer* hw = bufs_.find(BufferRole::head_weights)) {
    be_.copy_to_device(h2d, hw->data(), homes_.host_weights(head), size_t(layout_.head().numel) * dtype_size(cd_));
  } else {
    ev_.home_ready[size_t(head)]->wait(h2d);
    homes_.upload_next(head);
  }
  if (Buffer* table = bufs_.find(BufferRole::tied_table)) {
    updater_.wait(0);
    be_.copy_to_device(h2d, table->data(), homes_.host_weights(0), table->bytes());
  }
  ev_.head_ready->record(h2d);
}

void SlidingWindowExecutor::embed_forward(const Op& op) {
  emb_.forward(*chunks_, op.chunk, x_mat(0, op.chunk), batches_[size_t(op.chunk)]->inputs().tokens);
}

void SlidingWindowExecutor::layer_forward(const Op& op) {
  const int k = op.layer, c = op.chunk, n_chunks = int(chunks_->size());
  Stream& compute = *streams_.compute;
  ev_.slot_ready[size_t(op.slot)]->wait(compute);
  if (k == 0) ev_.emb_done[size_t(c)]->wait(compute);
  // x_out held layer k-1's input: its copy to the store must have left.
  else if (!backward_ || ec_.saves_input(k - 1)) ev_.off_done[size_t(((k + 1) % 2) * n_chunks + c)]->wait(compute);
  LayerWeights w = bind_layer(layout_.layer(k), weights_on_device(op), cd_);
  // A training step's kept layers write their attention where their backward reads it.
  const bool keep = backward_ && kept_.keeps(k);
  LayerActs acts = acts_for(c);
  if (keep) acts = kept_.for_forward(acts, k, kept_chunk(c), n_chunks, compute);
  const int t = timer_.begin(false);
  sf::layer_forward(be_, compute, cfg_, w, acts, batches_[size_t(c)]->inputs(), x_mat(k % 2, c),
                    x_mat((k + 1) % 2, c));
  timer_.end(t);
  if (keep) kept_.after_forward(k, kept_chunk(c), n_chunks, compute, *streams_.d2h);
  ev_.slot_free[size_t(op.slot)]->record(compute);
  ev_.out_ready[size_t(c)]->record(compute);  // the next layer's input, chunk c
}

// Enqueued before layer k's forward, so the copy overlaps it: waits only for the input.
void SlidingWindowExecutor::offload_input(const Op& op) {
  const int k = op.layer, c = op.chunk, n_chunks = int(chunks_->size());
  Stream& d2h = *streams_.d2h;
  (k == 0 ? ev_.emb_done : ev_.out_ready)[size_t(c)]->wait(d2h);
  Mat src = x_mat(k % 2, c), dst = store_mat(k, c);
  if (ec_.act_on_device(k)) be_.copy_on_device(d2h, dst.data, src.data, src.bytes());
  else be_.copy_to_host(d2h, dst.data, src.data, src.bytes());
  ev_.off_done[size_t((k % 2) * n_chunks + c)]->record(d2h);
}

void SlidingWindowExecutor::head(const Op& op) {
  const int c = op.chunk, head = w_.head_unit();
  const int64_t C = cfg_.hidden_size, V = cfg_.vocab_size;
  Stream& compute = *streams_.compute;
  ev_.head_ready->wait(compute);
  Buffer* hw = bufs_.find(BufferRole::head_weights);
  if (!hw) hw = homes_.home(head);
  Buffer* table_w = bufs_.find(BufferRole::tied_table);
  Buffer* table_g = bufs_.find(BufferRole::tied_table_grad);
  HeadWeights w = bind_head(layout_.head(), hw->data(), cd_, table_w ? Mat(table_w->data(), cd_, V, C) : Mat());
  HeadGrads g = bind_head(layout_.head(), bufs_.at(BufferRole::head_grad).data(), DType::f32,
                          table_g ? Mat(table_g->data(), DType::f32, V, C) : Mat());
  Buffer& scratch = bufs_.at(BufferRole::scratch);
  const int64_t rows = std::min(ec_.head_chunk_rows, ec_.max_chunk_tokens);
  HeadActs acts = bind_head_acts(cfg_, chunk_tokens(c), cd_, rows, scratch.data(), scratch.bytes());
  const int t = timer_.begin(false);
  head_forward_backward(be_, compute, cfg_, w, g, acts, batches_[size_t(c)]->inputs(),
                        x_mat(layout_.n_layers % 2, c), backward_ ? dx_mat(c) : Mat(),
                        static_cast<float*>(bufs_.at(BufferRole::loss).data()), grad_scale_);
  timer_.end(t);
  if (c == int(chunks_->size()) - 1) ev_.head_done->record(compute);
}

// The unit's fp32 gradient goes home in the compute dtype, on the grads stream once the unit's
// last backward (or head) op is done, while the compute stream goes on with the next layer.
// (The accumulator's next user, two layers on, waits for grads_copied; the update reads the
// norms after run() synchronised every stream.)
void SlidingWindowExecutor::grads_out(const Op& op) {
  const bool is_head = op.unit == w_.head_unit();
  Buffer& acc = is_head ? bufs_.at(BufferRole::head_grad) : w_.layer_grad(op.layer);
  Mat src(acc.data(), DType::f32, 1, store_.numel(op.unit));
  Stream& gs = ec_.grads_stream ? *streams_.grads : *streams_.compute;
  (is_head ? *ev_.head_done : *ev_.grads_done[op.layer % 2]).wait(gs);
  if (Buffer* tg = is_head ? bufs_.find(BufferRole::tied_table_grad) : nullptr) {
    ev_.head_done->wait(*streams_.d2h);
    be_.copy_to_host(*streams_.d2h, bufs_.at(BufferRole::tied_table_grad_host).data(), tg->data(), tg->bytes());
  }
  if (is_head) updater_.start_landing();  // the step's first gradient (landing only)
  homes_.set(op.unit, HomeState::weights, HomeState::gradient, "grads_out");
  if (sharded_on_device()) grads_out_sharded(op, gs, acc);
  else if (ec_.device_adamw(op.unit)) grads_stay_on_device(op, gs, src);
  else if (homes_.resident(op.unit)) grads_to_resident_home(op, gs, src);
  else grads_to_host_home(op, gs, src);
  updater_.grad_ready(op.unit);
  updater_.reduce_grad(op.unit);  // data parallel: summed over the ranks (else a no-op)
}

// Stays in its accumulator for the device AdamW after the norm (which also marks the
// accumulator free again: grads_copied).
void SlidingWindowExecutor::grads_stay_on_device(const Op& op, Stream& gs, Mat src) {
  be_.sum_squares(gs, w_.norms() + op.unit, src);
  ev_.grads_home[size_t(op.unit)]->record(gs);
}

// A cast into the home plus the sum of squares for the global norm.
void SlidingWindowExecutor::grads_to_resident_home(const Op& op, Stream& gs, Mat src) {
  be_.cast(gs, Mat(homes_.home(op.unit)->data(), cd_, 1, src.cols), src);
  be_.sum_squares(gs, w_.norms() + op.unit, src);
  if (op.unit != w_.head_unit()) ev_.grads_copied[op.layer % 2]->record(gs);
  else ev_.head_grads_home->record(gs);
  ev_.grads_home[size_t(op.unit)]->record(gs);
}

// The comm stream waits for the accumulator (its last chunk, as gs did), reduces it in place
// (equal padded shards: the pad is zero, layer_backward zeroes all of it), and gs then takes
// only this rank's slice: its sum of squares, its cast into the home's slice (resident) or into
// the stage and on to the host home's slice. The accumulator's next user waits for
// grads_copied, recorded after the slice's cast, so after the reduce too.
void SlidingWindowExecutor::grads_out_sharded(const Op& op, Stream& gs, Buffer& acc) {
  const bool is_head = op.unit == w_.head_unit();
  const int g = is_head ? 0 : op.layer % 2;
  Event& reduced = *reduced_[is_head ? 2 : g];
  const int64_t P = store_.numel(op.unit);
  const size_t shard = size_t(padded_for_ranks(P, dp_.world()) / dp_.world());
  const dist::ShardRange sl = dist::shard_range(size_t(P), dp_.world(), dp_.rank(), kSliceAlign);
  Stream& cs = *comm_stream_;
  (is_head ? *ev_.head_done : *ev_.grads_done[g]).wait(cs);
  dp_.device_reduce_scatter(static_cast<float*>(acc.data()), shard, cs);
  reduced.record(cs);
  reduced.wait(gs);
  const Mat src(static_cast<float*>(acc.data()) + size_t(dp_.rank()) * shard, DType::f32, 1, int64_t(sl.size()));
  const size_t es = dtype_size(cd_), off = sl.begin * es;
  be_.sum_squares(gs, w_.norms() + op.unit, src);
  if (homes_.resident(op.unit)) {
    be_.cast(gs, Mat(static_cast<char*>(homes_.home(op.unit)->data()) + off, cd_, 1, src.cols), src);
    if (!is_head) ev_.grads_copied[g]->record(gs);
    else ev_.head_grads_home->record(gs);
    ev_.grads_home[size_t(op.unit)]->record(gs);
    return;
  }
  ev_.stage_free[g]->wait(gs);
  Buffer& stage = bufs_.at(BufferRole::grad_cast, g);
  be_.cast(gs, Mat(stage.data(), cd_, 1, src.cols), src);
  if (!is_head) ev_.grads_copied[g]->record(gs);
  Stream& d2h = *streams_.d2h;
  Event& cast = is_head ? *ev_.head_cast : *ev_.grads_cast[g];
  cast.record(gs);
  cast.wait(d2h);
  be_.copy_to_host(d2h, static_cast<char*>(homes_.home(op.unit)->data()) + off, stage.data(), sl.size() * es);
  ev_.stage_free[g]->record(d2h);
  ev_.grads_home[size_t(op.unit)]->record(d2h);
}

// Cast into a staging buffer (f32 compute: none), then d2h.
void SlidingWindowExecutor::grads_to_host_home(const Op& op, Stream& gs, Mat src) {
  const bool is_head = op.unit == w_.head_unit();
  const int g = is_head ? 0 : op.layer % 2;
  const void* from = src.data;
  if (w_.reduced()) {
    // Its sum of squares for the global norm, on the device like the resident homes' (f32
    // homes are summed on the host in double, as the reference step does).
    be_.sum_squares(gs, w_.norms() + op.unit, src);
    ev_.stage_free[g]->wait(gs);
    Buffer& stage = bufs_.at(BufferRole::grad_cast, g);
    be_.cast(gs, Mat(stage.data(), cd_, 1, src.cols), src);
    from = stage.data();
    if (!is_head) ev_.grads_copied[g]->record(gs);  // the accumulator is free: the trip reads the cast
  }
  Stream& d2h = *streams_.d2h;
  Event& cast = is_head ? *ev_.head_cast : *ev_.grads_cast[g];
  cast.record(gs);
  cast.wait(d2h);
  // From the master: the ring's next buffer, once the update two units back has read it.
  void* dst = homes_.from_master(op.unit) ? homes_.ring().claim(op.unit) : homes_.home(op.unit)->data();
  be_.copy_to_host(d2h, dst, from, size_t(src.cols) * dtype_size(cd_));
  if (!is_head && !w_.reduced()) ev_.grads_copied[g]->record(d2h);
  ev_.stage_free[g]->record(d2h);
  ev_.grads_home[size_t(op.unit)]->record(d2h);
}

void SlidingWindowExecutor::fetch_input(const Op& op) {
  Stream& h2d = *streams_.h2d;
  ev_.buf_free[op.buf]->wait(h2d);
  Mat src = store_mat(op.layer, op.chunk);
  void* dst = bufs_.at(BufferRole::saved_input, op.buf).data();
  if (ec_.act_on_device(op.layer)) be_.copy_on_device(h2d, dst, src.data, src.bytes());
  else be_.copy_to_device(h2d, dst, src.data, src.bytes());
  if (kept_.keeps(op.layer)) kept_.fetch(op.layer, kept_chunk(op.chunk), op.buf, h2d);
  ev_.buf_ready[op.buf]->record(h2d);
}

// The forward of a layer again, in the backward, for the unsaved layer above it (never a
// kept-attention layer: those save their inputs, EngineConfig::saves_input). The compute
// stream orders it after the backward that last read activation buffer `act`; a segment's
// first replay waits for its fetched input, whose fetch follows the forward's offloads (which
// read the activation buffers), and the others follow it on the stream.
void SlidingWindowExecutor::replay_forward(const Op& op) {
  const int k = op.layer, c = op.chunk;
  SF_CHECK(!kept_.keeps(k), "a kept-attention layer is never replayed");
  Stream& compute = *streams_.compute;
  ev_.slot_ready[size_t(op.slot)]->wait(compute);
  if (op.buf >= 0) ev_.buf_ready[op.buf]->wait(compute);
  const Mat xin = op.buf >= 0 ? saved_mat(op.buf, c) : x_mat(op.act - 1, c);
  LayerWeights w = bind_layer(layout_.layer(k), weights_on_device(op), cd_);
  const int t = timer_.begin(true);
  sf::layer_forward(be_, compute, cfg_, w, acts_for(c), batches_[size_t(c)]->inputs(), xin, x_mat(op.act, c));
  timer_.end(t);
  if (op.buf >= 0) ev_.buf_free[op.buf]->record(compute);
  ev_.slot_free[size_t(op.slot)]->record(compute);
}

void SlidingWindowExecutor::layer_backward(const Op& op) {
  const int k = op.layer, c = op.chunk, g = k % 2;
  Stream& compute = *streams_.compute;
  ev_.slot_ready[size_t(op.slot)]->wait(compute);
  if (op.buf >= 0) ev_.buf_ready[op.buf]->wait(compute);
  const Unit& unit = layout_.layer(k);
  Buffer& acc = w_.layer_grad(k);
  if (c == 0) {
    // A shared accumulator was last copied out two layers ago (one, with a single buffer); a
    // device-AdamW layer's own was last read by its AdamW, which its weights' load in this
    // step's forward followed.
    const int n_acc = ec_.layer_grad_buffers, last_user = n_acc == 1 ? (k + 1) % 2 : g;
    if (&acc == &bufs_.at(BufferRole::layer_grad, k % n_acc)) ev_.grads_copied[last_user]->wait(compute);
    // Data parallel on the GPU: the pad too (the device reduce-scatter sums all of it).
    be_.fill_zero(compute, acc.data(), sharded_on_device() ? acc.bytes() : size_t(unit.numel) * 4);
  }
  LayerWeights w = bind_layer(unit, weights_on_device(op), cd_);
  LayerGrads gr = bind_layer(unit, acc.data(), DType::f32);
  const Mat xin = op.buf >= 0 ? saved_mat(op.buf, c) : x_mat(op.act, c);  // saved, or replayed
  // A kept layer's attention comes from the store (or its stage): no attention forward.
  const bool kept = kept_.keeps(k);
  LayerActs acts = acts_for(c);
  if (kept) acts = kept_.for_backward(acts, k, kept_chunk(c), op.buf);
  const int t = timer_.begin(true);
  sf::layer_backward(be_, compute, cfg_, w, gr, acts, batches_[size_t(c)]->inputs(), xin, dx_mat(c), dx_mat(c),
                     kept ? Recompute::all_but_attention : Recompute::all);
  timer_.end(t);
  if (op.buf >= 0) ev_.buf_free[op.buf]->record(compute);
  ev_.slot_free[size_t(op.slot)]->record(compute);
  if (c == int(chunks_->size()) - 1) {
    ev_.grads_done[g]->record(compute);
    if (k == 0) ev_.layer0_done->record(compute);
  }
}

void SlidingWindowExecutor::embed_backward(const Op& op) {
  if (!emb_.backward(*chunks_, chunk_off_, op.chunk, dx_mat(op.chunk))) return;
  // The GPU path: the embedding's reduce is a host-form call on the same communicator, so the
  // layers' device reduce-scatters (on the comm stream) finish first: one order on every rank.
  if (comm_stream_) comm_stream_->synchronize();
  updater_.embedding_grad_home();
}

// ---- a step ------------------------------------------------------------------------------

void SlidingWindowExecutor::run(const Schedule& s, const std::vector<Batch>& chunks, float grad_scale) {
  const std::vector<Op>& ops = s.ops;
  Stream& compute = *streams_.compute;
  chunks_ = &chunks;
  grad_scale_ = grad_scale;
  chunk_off_.assign(chunks.size(), 0);
  for (size_t c = 1; c < chunks.size(); ++c) chunk_off_[c] = chunk_off_[c - 1] + chunks[c - 1].n_tokens();
  for (size_t c = 0; c < chunks.size(); ++c) batches_[c]->upload(*streams_.h2d, chunks[c]);
  ev_.batch_ready->record(*streams_.h2d);
  ev_.batch_ready->wait(compute);
  Buffer& loss = bufs_.at(BufferRole::loss);
  be_.fill_zero(compute, loss.data(), 4);
  backward_ = std::any_of(ops.begin(), ops.end(), [](const Op& o) { return o.kind == OpKind::layer_backward; });
  if (backward_) {
    for (BufferRole r : {BufferRole::norms, BufferRole::head_grad, BufferRole::tied_table_grad})
      if (Buffer* b = bufs_.find(r)) be_.fill_zero(compute, b->data(), b->bytes());
  }
  timer_.start_run();
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    if (op.kind == OpKind::update) break;  // the step's device work is done
    if (i == s.backward_begin) {
      compute.synchronize();  // the forward and head are done: split the timing here
      timer_.forward_done();
      // Every offload of the forward is enqueued by now: the fetches follow them (and so
      // does every replay, which waits for its fetched input).
      ev_.offloads_done->record(*streams_.d2h);
      ev_.offloads_done->wait(*streams_.h2d);
    }
    exec(op, s.names[i]);
  }
  for (Stream* st : {streams_.compute.get(), streams_.grads.get(), streams_.h2d.get(), streams_.d2h.get()})
    st->synchronize();
  if (comm_stream_) comm_stream_->synchronize();
  timer_.run_done();
}

float SlidingWindowExecutor::read_loss() {
  float loss = 0;
  be_.copy_to_host(*streams_.compute, &loss, bufs_.at(BufferRole::loss).data(), 4);
  streams_.compute->synchronize();
  return loss;
}

// Data parallel: a rank whose step fails breaks the group first, so that no other rank waits
// for it until the timeout; the others' calls then throw an Error naming it.
StepStats SlidingWindowExecutor::train_step(std::span<const Batch> micro, const OptimHyper& h) {
  if (!dp_.active()) return step(micro, h);
  try {
    return step(micro, h);
  } catch (const std::exception& e) {
    updater_.abort_ranks(cat("rank ", dp_.rank(), ": ", e.what()));
    throw;
  }
}

StepStats SlidingWindowExecutor::step(std::span<const Batch> micro, const OptimHyper& h) {
  trace_mark("train_step: start");
  std::vector<Batch> chunks = make_chunks(micro);
  StepStats st;
  if (dp_.active()) {  // the global batch's counts: the loss is its mean
    for (const Batch& b : chunks) {
      st.n_valid += b.n_valid_labels();
      st.n_tokens += b.n_tokens();
    }
    all_reduce_counts(*dp_.comm, st.n_valid, st.n_tokens);
    SF_REQUIRE(st.n_valid > 0, "train step: no token of the global batch has a label; check the data");
  } else {
    st = count_step(chunks);
  }
  const Schedule& sched = schedule(int(chunks.size()), Pass::train);
  std::vector<int> order;  // the schedule's update ops, in their order
  for (const Op& op : sched.ops)
    if (op.kind == OpKind::update) order.push_back(op.unit);
  updater_.begin_step(h, std::move(order));
  run(sched, chunks, mean_loss_scale(st));
  st.loss_sum = read_loss();
  if (dp_.active()) st.loss_sum = sum_over_ranks(*dp_.comm, st.loss_sum);
  st.forward_seconds = timer_.forward_seconds();
  st.backward_seconds = timer_.backward_seconds();
  st.update_wait_seconds = updater_.take_wait_seconds();
  st.update_seconds = updater_.last_round_seconds();
  timer_.report(st);
  trace_mark("train_step: run done");
  const auto t0 = std::chrono::steady_clock::now();
  updater_.finish(h, st);
  st.finish_seconds = seconds_since(t0);
  trace_mark("train_step: update started");
  return st;
}

double SlidingWindowExecutor::eval_loss_sum(const Batch& b) {
  timer_.forget_step_end();  // an evaluation between steps is not idle time
  std::vector<Batch> chunks = make_chunks(std::span<const Batch>(&b, 1));
  run(schedule(int(chunks.size()), Pass::evaluate), chunks, 0.f);
  return read_loss();
}

}  // namespace sf
