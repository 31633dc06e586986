#include "engine/sliding_executor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "core/stopwatch.h"
#include "core/thread_pool.h"
#include "engine/clip_decision.h"
#include "engine/sliding_internal.h"

namespace sf {


SlidingWindowExecutor::SlidingWindowExecutor(Backend& be, const ModelConfig& cfg,
                                             const EngineConfig& ec)
    : be_(be), cfg_(cfg), layout_(ModelLayout::build(cfg)), ec_(ec),
      cd_(be.compute_dtype()), store_(layout_, ec.moments_dir, ec.moments_streamed) {
  SF_REQUIRE(ec.n_slots >= 2, "sliding window: at least 2 weight slots are needed");
  SF_REQUIRE(ec.max_chunk_tokens > 0 && ec.max_chunks >= 1, "sliding window: empty chunks");
  SF_CHECK(cd_ == DType::f32 || cd_ == DType::bf16, "compute dtype must be f32 or bf16");
  name_ = cat("sliding window (", ec.n_slots, " slots) on ", be.name());
  const int64_t C = cfg.hidden_size, V = cfg.vocab_size, Tc = ec.max_chunk_tokens;
  const size_t es = dtype_size(cd_);
  max_step_tokens_ = Tc * ec.max_chunks;
  const size_t xbytes = size_t(max_step_tokens_) * size_t(C) * es;
  const int n_units = int(layout_.units.size());
  const int head_unit = n_units - 1;

  compute_ = be.create_stream("compute");
  h2d_ = be.create_stream("h2d");
  d2h_ = be.create_stream("d2h");
  grads_ = be.create_stream("grads");
  upd_d2h_ = be.create_stream("update d2h");
  upd_h2d_ = be.create_stream("update h2d");
  ev_ = std::make_unique<Events>(be, ec.n_slots, ec.max_chunks, n_units);

  int64_t max_layer = 0;
  for (int k = 0; k < layout_.n_layers; ++k) max_layer = std::max(max_layer, layout_.layer(k).numel);
  SF_REQUIRE(ec.resident_layers >= 0 && ec.resident_layers <= layout_.n_layers,
             "resident_layers must be in [0, n_layers]");
  SF_REQUIRE(ec.head_resident || cd_ == DType::f32,
             "with a reduced-precision compute dtype the head's home must be resident");

  // Homes. [0] holds the tied table's compute-dtype weights when the head needs them.
  home_on_device_.assign(size_t(n_units), 0);
  for (int k = layout_.n_layers - ec.resident_layers; k < layout_.n_layers; ++k)
    home_on_device_[size_t(k + 1)] = 1;
  home_on_device_[size_t(head_unit)] = ec.head_resident;
  SF_REQUIRE(ec.device_adamw_layers >= 0 && ec.device_adamw_layers <= layout_.n_layers,
             "device_adamw_layers must be in [0, n_layers]");
  dev_state_.resize(size_t(layout_.n_layers));
  dev_grad_.resize(size_t(layout_.n_layers));
  for (int k = 0; k < ec.device_adamw_layers; ++k) {
    home_on_device_[size_t(k + 1)] = 1;
    const size_t n = size_t(layout_.layer(k).numel);
    dev_state_[size_t(k)] = be.alloc(n * 12, cat("layer ", k, " master, AdamW m and v"));
    if (k >= 2) dev_grad_[size_t(k)] = be.alloc(n * 4, cat("layer ", k, " gradient accumulator"));
  }
  bool any_resident = false;
  for (int u = 0; u < n_units; ++u) {
    size_t n = size_t(layout_.units[size_t(u)].numel);
    if (u == 0) {
      homes_.push_back(layout_.tied && cd_ != DType::f32 ? be.alloc_host(n * es, "tied table staging")
                                                          : nullptr);
      continue;
    }
    any_resident |= resident(u);
    homes_.push_back(resident(u) ? be.alloc(n * es, cat("home of unit ", u))
                                 : be.alloc_host(n * es, cat("home of unit ", u)));
  }
  {
    const auto& r0 = store_.ranges(0);
    SF_CHECK(r0.size() == 1 && r0[0].offset == 0 && r0[0].numel == V * C,
             "the embedding unit must hold exactly the [V, C] table");
    const int64_t rows = EmbeddingGrad::max_rows(V, max_step_tokens_, layout_.tied);
    emb_grad_buf_ = be.alloc_host(size_t(rows * C) * 4, "embedding gradient");
    emb_grad_ = std::make_unique<EmbeddingGrad>(V, C, max_step_tokens_, layout_.tied,
                                                static_cast<float*>(emb_grad_buf_->data()));
  }
  if (layout_.tied) table_grad_host_ = be.alloc_host(size_t(V * C) * 4, "tied table gradient");
  // The forward gathers its rows straight from the fp32 master (the device reads them over
  // PCIe; no host thread and no staging copy between the update and layer 0).
  emb_table_ = be.map_host(store_.master(0), size_t(V * C) * 4, "the embedding table");
  if (!device_scatter()) emb_stage_ = be.alloc_host(xbytes, "embedding gradient staging");
  if (device_scatter()) {
    emb_rows_dev_ = be.alloc(size_t(2 * max_step_tokens_) * 4, "embedding rows of the tokens");
    emb_rows_host_ = be.alloc_host(size_t(2 * max_step_tokens_) * 4, "embedding rows of the tokens");
  }
  int64_t max_home = 0;
  for (int u = 1; u < n_units; ++u)
    if (resident(u)) max_home = std::max(max_home, layout_.units[size_t(u)].numel);
  SF_REQUIRE(ec.ring_piece > 0, "sliding window: ring_piece must be positive");
  ring_piece_ = std::min(max_home, ec.ring_piece);
  for (int i = 0; i < 2; ++i) {
    if (any_resident) ring_[i] = be.alloc_host(size_t(ring_piece_) * es, cat("update ring ", i));
    if (cd_ != DType::f32) gstage_[i] = be.alloc(size_t(max_layer) * es, cat("gradient cast ", i));
  }
  norms_ = be.alloc(size_t(n_units) * 4, "resident gradient norms");
  upload_next_.assign(size_t(n_units), 0);
  if (ec.speculative()) {
    spec_ = std::make_unique<Spec>();
    for (int u = 0; u < n_units; ++u)
      next_.push_back(ec.has_next(u, n_units) && cd_ != DType::f32
                          ? be.alloc_host(size_t(layout_.units[size_t(u)].numel) * es,
                                          cat("next weights of unit ", u))
                          : nullptr);
    if (!ring_[0]) {  // phase A reads device-home gradients through the ring
      for (int i = 0; i < 2 && max_home > 0; ++i)
        ring_[i] = be.alloc_host(size_t(ring_piece_) * es, cat("update ring ", i));
    }
  }

  for (int s = 0; s < ec.n_slots; ++s)
    slots_.push_back(be.alloc(size_t(max_layer) * es, cat("weight slot ", s)));
  slot_unit_.assign(size_t(ec.n_slots), -1);
  if (!resident(head_unit) || cd_ == DType::f32) head_w_ = be.alloc(size_t(layout_.head().numel) * es, "head weights");
  head_g_ = be.alloc(size_t(layout_.head().numel) * 4, "head gradients");
  if (layout_.tied) {
    table_w_ = be.alloc(size_t(V * C) * es, "tied embedding table");
    table_g_ = be.alloc(size_t(V * C) * 4, "tied embedding table gradient");
  }
  for (int i = 0; i < 2; ++i) {
    grad_[i] = be.alloc(size_t(max_layer) * 4, cat("layer gradient buffer ", i));
    x_[i] = be.alloc(xbytes, cat("layer activations ", i));
    xin_[i] = be.alloc(size_t(Tc * C) * es, cat("saved-input buffer ", i));
  }
  dx_ = be.alloc(xbytes, "activation gradient");
  scratch_ = be.alloc(std::max(layer_acts_bytes(cfg, Tc, cd_),
                               head_acts_bytes(cfg, Tc, cd_, std::min(ec.head_chunk_rows, Tc))),
                      "layer and head scratch");
  loss_ = be.alloc(4, "loss");
  for (int k = 0; k < layout_.n_layers; ++k)
    act_store_.push_back(ec.act_on_device(k)
                             ? be.alloc(xbytes, cat("saved inputs of layer ", k))
                             : be.alloc_host(xbytes, cat("saved inputs of layer ", k)));
  for (int c = 0; c < ec.max_chunks; ++c)
    batches_.push_back(std::make_unique<DeviceBatch>(be, *h2d_, cfg, Tc));
  h2d_->synchronize();
}

SlidingWindowExecutor::~SlidingWindowExecutor() {
  if (spec_) spec_->abandon();
  try {
    updates_.wait_all();
  } catch (...) {
  }
}

ParamStore& SlidingWindowExecutor::params() {
  updates_.wait_all();
  if (host_state_stale_) {  // the device-AdamW layers' state comes home
    upd_h2d_->synchronize();
    device_state_copy(true);
    host_state_stale_ = false;
  }
  return store_;
}

void SlidingWindowExecutor::device_state_copy(bool to_host) {
  for (int k = 0; k < ec_.device_adamw_layers; ++k) {
    const int u = k + 1;
    const size_t n = size_t(store_.numel(u)) * 4;
    char* d = static_cast<char*>(dev_state_[size_t(k)]->data());
    float* host[3] = {store_.master(u), store_.m(u), store_.v(u)};
    for (int i = 0; i < 3; ++i) {
      if (to_host) be_.copy_to_host(*h2d_, host[i], d + size_t(i) * n, n);
      else be_.copy_to_device(*h2d_, d + size_t(i) * n, host[i], n);
    }
  }
  h2d_->synchronize();
}

const void* SlidingWindowExecutor::host_weights(int unit) const {
  if (cd_ == DType::f32) return store_.master(unit);
  SF_CHECK(!(unit > 0 && resident(unit)), "resident unit ", unit, " has no host weights");
  return homes_[size_t(unit)]->data();
}

void* SlidingWindowExecutor::weights_on_device(const Op& op) const {
  if (device_adamw(op.unit) && cd_ == DType::f32) return dev_state_[size_t(op.unit - 1)]->data();  // the master
  if (op.unit > 0 && resident(op.unit) && cd_ != DType::f32) return homes_[size_t(op.unit)]->data();
  return slots_[size_t(op.slot)]->data();
}

Mat SlidingWindowExecutor::x_mat(int which, int chunk) const {
  int64_t T = batches_[size_t(chunk)]->inputs().n_tokens;
  return Mat(x_[which]->data(), cd_, max_step_tokens_, cfg_.hidden_size).row_block(chunk_off_[size_t(chunk)], T);
}
Mat SlidingWindowExecutor::dx_mat(int chunk) const {
  int64_t T = batches_[size_t(chunk)]->inputs().n_tokens;
  return Mat(dx_->data(), cd_, max_step_tokens_, cfg_.hidden_size).row_block(chunk_off_[size_t(chunk)], T);
}
Mat SlidingWindowExecutor::store_mat(int layer, int chunk) const {
  int64_t T = batches_[size_t(chunk)]->inputs().n_tokens;
  return Mat(act_store_[size_t(layer)]->data(), cd_, max_step_tokens_, cfg_.hidden_size)
      .row_block(chunk_off_[size_t(chunk)], T);
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

void SlidingWindowExecutor::exec(const Op& op, const std::vector<Batch>& chunks,
                                 float grad_scale) {
  const int64_t C = cfg_.hidden_size, V = cfg_.vocab_size;
  const int head_unit = int(layout_.units.size()) - 1;
  const int n_chunks = int(chunks.size());
  Events& ev = *ev_;
  auto acts_for = [&](int c) {
    int64_t T = batches_[size_t(c)]->inputs().n_tokens;
    return bind_layer_acts(cfg_, T, cd_, scratch_->data(), scratch_->bytes());
  };
  auto head_params = [&](Buffer& w, DType dt, Buffer* table) {
    Mat t = table ? Mat(table->data(), dt, V, C) : Mat();
    return bind_head(layout_.head(), w.data(), dt, t);
  };

  switch (op.kind) {
    case OpKind::load_weights: {
      if (op.unit == head_unit) {
        updates_.wait(head_unit);
        if (!resident(head_unit) || cd_ == DType::f32) {
          be_.copy_to_device(*h2d_, head_w_->data(), host_weights(head_unit),
                             size_t(layout_.head().numel) * dtype_size(cd_));
        } else {
          ev.home_ready[size_t(head_unit)]->wait(*h2d_);
          home_from_next(head_unit);
        }
        if (layout_.tied) {
          updates_.wait(0);
          be_.copy_to_device(*h2d_, table_w_->data(), host_weights(0), table_w_->bytes());
        }
        ev.head_ready->record(*h2d_);
        return;
      }
      updates_.wait(op.unit);  // this unit's AdamW of the previous step
      if (op.unit <= 2) trace_mark("load_weights: update ready, unit", op.unit);
      if ((resident(op.unit) && cd_ != DType::f32) || device_adamw(op.unit)) {
        // Weights are home already (or wait in `next`); the slot is not used. Order after
        // their trip home.
        ev.home_ready[size_t(op.unit)]->wait(*h2d_);
        home_from_next(op.unit);
        ev.slot_ready[size_t(op.slot)]->record(*h2d_);
        return;
      }
      ev.slot_free[size_t(op.slot)]->wait(*h2d_);
      size_t bytes = size_t(layout_.units[size_t(op.unit)].numel) * dtype_size(cd_);
      be_.copy_to_device(*h2d_, slots_[size_t(op.slot)]->data(), host_weights(op.unit), bytes);
      ev.slot_ready[size_t(op.slot)]->record(*h2d_);
      slot_unit_[size_t(op.slot)] = op.unit;
      return;
    }
    case OpKind::embed_forward: {
      trace_mark("embed_forward: waiting for the embedding's update");
      updates_.wait(0);
      trace_mark("embed_forward: update ready");
      // The step's rows: the previous update of the table (which used the old ones) is done.
      if (op.chunk == 0) {
        emb_grad_->set_rows(chunks);
        if (device_scatter()) {  // each token's gradient row, for the backward's scatter
          const int64_t R = emb_grad_->touched_rows();
          const int64_t B = emb_block_ =
              ec_.split_embedding_scatter ? std::max<int64_t>(1, (R + 1) / 2) : emb_block_rows();
          SF_CHECK(B <= emb_block_rows(), "embedding scatter: block of ", B, " rows > ", emb_block_rows());
          int32_t* rows = static_cast<int32_t*>(emb_rows_host_->data());
          emb_grad_->token_rows(chunks, 0, B, rows);
          emb_grad_->token_rows(chunks, B, B, rows + max_step_tokens_);
          be_.copy_to_device(*h2d_, emb_rows_dev_->data(), rows, emb_rows_host_->bytes());
        }
      }
      const Mat table(emb_table_->data(), DType::f32, V, C);
      be_.embedding_forward(*h2d_, x_mat(0, op.chunk), batches_[size_t(op.chunk)]->inputs().tokens,
                            table);
      trace_mark("embed_forward: gather enqueued");
      ev.emb_done[size_t(op.chunk)]->record(*h2d_);
      return;
    }
    case OpKind::layer_forward: {
      const int k = op.layer, c = op.chunk;
      ev.slot_ready[size_t(op.slot)]->wait(*compute_);
      if (k == 0) ev.emb_done[size_t(c)]->wait(*compute_);
      // x_out held layer k-1's input: its copy to the store must have left.
      else ev.off_done[size_t(((k + 1) % 2) * n_chunks + c)]->wait(*compute_);
      LayerWeights w = bind_layer(layout_.layer(k), weights_on_device(op), cd_);
      const int t = busy_begin();
      layer_forward(be_, *compute_, cfg_, w, acts_for(c), batches_[size_t(c)]->inputs(),
                    x_mat(k % 2, c), x_mat((k + 1) % 2, c));
      busy_end(t);
      ev.slot_free[size_t(op.slot)]->record(*compute_);
      ev.out_ready[size_t(c)]->record(*compute_);  // the next layer's input, chunk c
      return;
    }
    case OpKind::offload_input: {
      // Enqueued before layer k's forward, so the copy overlaps it: waits only for the input.
      const int k = op.layer, c = op.chunk;
      (k == 0 ? ev.emb_done : ev.out_ready)[size_t(c)]->wait(*d2h_);
      Mat src = x_mat(k % 2, c), dst = store_mat(k, c);
      if (ec_.act_on_device(k)) be_.copy_on_device(*d2h_, dst.data, src.data, src.bytes());
      else be_.copy_to_host(*d2h_, dst.data, src.data, src.bytes());
      ev.off_done[size_t((k % 2) * n_chunks + c)]->record(*d2h_);
      return;
    }
    case OpKind::head: {
      const int c = op.chunk;
      ev.head_ready->wait(*compute_);
      Buffer& hw = resident(head_unit) && cd_ != DType::f32 ? *homes_[size_t(head_unit)] : *head_w_;
      HeadWeights w = head_params(hw, cd_, layout_.tied ? table_w_.get() : nullptr);
      HeadGrads g = head_params(*head_g_, DType::f32, layout_.tied ? table_g_.get() : nullptr);
      int64_t T = batches_[size_t(c)]->inputs().n_tokens;
      int64_t rows = std::min(ec_.head_chunk_rows, ec_.max_chunk_tokens);
      HeadActs acts = bind_head_acts(cfg_, T, cd_, rows, scratch_->data(), scratch_->bytes());
      bool backward = !schedule_.empty() && schedule_.back().kind != OpKind::head;
      const int t = busy_begin();
      head_forward_backward(be_, *compute_, cfg_, w, g, acts, batches_[size_t(c)]->inputs(),
                            x_mat(layout_.n_layers % 2, c), backward ? dx_mat(c) : Mat(),
                            static_cast<float*>(loss_->data()), grad_scale);
      busy_end(t);
      if (c == n_chunks - 1) ev.head_done->record(*compute_);
      return;
    }
    case OpKind::grads_out: {
      // The unit's fp32 gradient goes home in the compute dtype, on the grads stream once the
      // unit's last backward (or head) op is done, while the compute stream goes on with the
      // next layer. Resident homes: a cast plus the sum of squares for the global norm. Host
      // homes: cast into a staging buffer, then d2h. (The accumulator's next user, two layers
      // on, waits for grads_copied; finish_update reads the norms after run() synchronised
      // every stream.)
      const bool is_head = op.unit == head_unit;
      const int g = is_head ? 0 : op.layer % 2;
      const size_t n = size_t(layout_.units[size_t(op.unit)].numel);
      Buffer& acc = is_head ? *head_g_ : grad_acc(op.layer);
      Mat src(acc.data(), DType::f32, 1, int64_t(n));
      Stream& gs = ec_.grads_stream ? *grads_ : *compute_;
      Event& done = is_head ? *ev.head_done : *ev.grads_done[g];
      done.wait(gs);
      if (is_head && layout_.tied) {
        ev.head_done->wait(*d2h_);
        be_.copy_to_host(*d2h_, table_grad_host_->data(), table_g_->data(), table_g_->bytes());
      }
      if (device_adamw(op.unit)) {
        // Stays in its accumulator for the device AdamW after the norm (device_unit_adamw,
        // which also marks the accumulator free again: grads_copied).
        be_.sum_squares(gs, static_cast<float*>(norms_->data()) + op.unit, src);
        ev.grads_home[size_t(op.unit)]->record(gs);
        mark_grad_ready(op.unit);
        return;
      }
      if (resident(op.unit)) {
        Mat dst(homes_[size_t(op.unit)]->data(), cd_, 1, int64_t(n));
        be_.cast(gs, dst, src);
        be_.sum_squares(gs, static_cast<float*>(norms_->data()) + op.unit, src);
        if (!is_head) ev.grads_copied[g]->record(gs);
        else ev.head_grads_home->record(gs);
        ev.grads_home[size_t(op.unit)]->record(gs);
        mark_grad_ready(op.unit);
        return;
      }
      void* from = acc.data();
      if (cd_ != DType::f32) {
        // Its sum of squares for the global norm, on the device like the resident homes'
        // (f32 homes are summed on the host in double, as the reference step does).
        be_.sum_squares(gs, static_cast<float*>(norms_->data()) + op.unit, src);
        ev.stage_free[g]->wait(gs);
        be_.cast(gs, Mat(gstage_[g]->data(), cd_, 1, int64_t(n)), src);
        from = gstage_[g]->data();
      }
      Event& cast = is_head ? *ev.head_cast : *ev.grads_cast[g];
      cast.record(gs);
      cast.wait(*d2h_);
      be_.copy_to_host(*d2h_, homes_[size_t(op.unit)]->data(), from, n * dtype_size(cd_));
      if (!is_head) ev.grads_copied[g]->record(*d2h_);
      ev.stage_free[g]->record(*d2h_);
      ev.grads_home[size_t(op.unit)]->record(*d2h_);
      mark_grad_ready(op.unit);
      return;
    }
    case OpKind::fetch_input: {
      if (op.layer == layout_.n_layers - 1 && op.chunk == 0) {
        ev.offloads_done->record(*d2h_);  // every offload of the forward is enqueued by now
        ev.offloads_done->wait(*h2d_);
      }
      ev.buf_free[op.buf]->wait(*h2d_);
      Mat src = store_mat(op.layer, op.chunk);
      if (ec_.act_on_device(op.layer)) be_.copy_on_device(*h2d_, xin_[op.buf]->data(), src.data, src.bytes());
      else be_.copy_to_device(*h2d_, xin_[op.buf]->data(), src.data, src.bytes());
      ev.buf_ready[op.buf]->record(*h2d_);
      return;
    }
    case OpKind::layer_backward: {
      const int k = op.layer, c = op.chunk, g = k % 2;
      ev.slot_ready[size_t(op.slot)]->wait(*compute_);
      ev.buf_ready[op.buf]->wait(*compute_);
      const Unit& unit = layout_.layer(k);
      Buffer& acc = grad_acc(k);
      if (c == 0) {
        // A shared accumulator was last copied out two layers ago; a device-AdamW layer's own
        // was last read by its AdamW, which its weights' load in this step's forward followed.
        if (&acc == grad_[g].get()) ev.grads_copied[g]->wait(*compute_);
        be_.fill_zero(*compute_, acc.data(), size_t(unit.numel) * 4);
      }
      int64_t T = batches_[size_t(c)]->inputs().n_tokens;
      LayerWeights w = bind_layer(unit, weights_on_device(op), cd_);
      LayerGrads gr = bind_layer(unit, acc.data(), DType::f32);
      Mat xin(xin_[op.buf]->data(), cd_, T, C);
      if (busy_first_bwd_ < 0) busy_first_bwd_ = busy_used_;
      const int t = busy_begin();
      layer_backward(be_, *compute_, cfg_, w, gr, acts_for(c), batches_[size_t(c)]->inputs(),
                     xin, dx_mat(c), dx_mat(c));
      busy_end(t);
      ev.buf_free[op.buf]->record(*compute_);
      ev.slot_free[size_t(op.slot)]->record(*compute_);
      if (c == n_chunks - 1) {
        ev.grads_done[g]->record(*compute_);
        if (k == 0) ev.layer0_done->record(*compute_);
      }
      return;
    }
    case OpKind::embed_backward: {
      const int c = op.chunk;
      if (device_scatter()) {  // every chunk at once
        if (c == 0) {
          embedding_grad_on_device(chunk_off_.back() + chunks.back().n_tokens());
          trace_mark("embed_backward: rows home");
          embedding_grad_home();
        }
        return;
      }
      const Batch& b = chunks[size_t(c)];
      // The host gets here long before the backward ends: an untied gradient is zeroed
      // meanwhile (a tied one starts from the head's share, which lands with the rest).
      if (c == 0 && !layout_.tied) emb_grad_->zero(nullptr, host_pool());
      if (c == 0) ev.layer0_done->wait(*d2h_);
      Mat d = dx_mat(c);
      char* host = static_cast<char*>(emb_stage_->data()) +
                   size_t(chunk_off_[size_t(c)] * C) * dtype_size(cd_);
      be_.copy_to_host(*d2h_, host, d.data, d.bytes());
      d2h_->synchronize();  // (chunk 0) and every gradient of the step has landed
      if (c == 0 && layout_.tied)
        emb_grad_->zero(static_cast<const float*>(table_grad_host_->data()), host_pool());
      trace_mark("embed_backward: zeroed, dx home", c);
      emb_grad_->scatter(b, host, cd_, host_pool());
      trace_mark("embed_backward: scattered");
      if (c == n_chunks - 1) embedding_grad_home();
      return;
    }
  }
}

int64_t SlidingWindowExecutor::emb_block_rows() const {
  return int64_t(x_[0]->bytes() / (size_t(cfg_.hidden_size) * 4));
}

// The sparse embedding gradient of the step's T tokens: dX (all chunks, on the device after
// layer 0's backward) summed per row in token order by the backend's embedding_backward into
// f32 row blocks carved from the X buffers, then copied into emb_grad_'s storage. Same bits
// as EmbeddingGrad::scatter (zero, then += each token's row in order).
void SlidingWindowExecutor::embedding_grad_on_device(int64_t T) {
  const int64_t C = cfg_.hidden_size, R = emb_grad_->touched_rows(), B = emb_block_;
  SF_CHECK(R <= 2 * B, "embedding gradient: ", R, " rows exceed the device scatter's ", 2 * B);
  const Mat dx(dx_->data(), cd_, T, C);
  char* home = reinterpret_cast<char*>(emb_grad_buf_->data());
  for (int blk = 0; blk < 2; ++blk) {
    const int64_t r0 = blk * B, n = std::min(B, R - r0);
    if (n <= 0) break;
    const Mat rows(x_[blk]->data(), DType::f32, n, C);
    be_.fill_zero(*compute_, rows.data, rows.bytes());
    be_.embedding_backward(*compute_, rows,
                           static_cast<const int32_t*>(emb_rows_dev_->data()) + blk * max_step_tokens_, dx);
    be_.sum_squares(*compute_, static_cast<float*>(norms_->data()), rows);  // the unit's norm
  }
  ev_->emb_rows_done->record(*compute_);
  ev_->emb_rows_done->wait(*d2h_);
  for (int blk = 0; blk < 2; ++blk) {
    const int64_t r0 = blk * B, n = std::min(B, R - r0);
    if (n <= 0) break;
    be_.copy_to_host(*d2h_, home + size_t(r0 * C) * 4, x_[blk]->data(), size_t(n * C) * 4);
  }
  be_.copy_to_host(*d2h_, &emb_sumsq_, norms_->data(), 4);
  d2h_->synchronize();  // and every other gradient of the step has landed
}

// Timing events around one compute op on the compute stream (no-ops where the backend cannot
// time, or past the pairs allocated for the planned schedule).
int SlidingWindowExecutor::busy_begin() {
  if (busy_used_ >= int(ev_->busy_start.size())) return -1;
  ev_->busy_start[size_t(busy_used_)]->record(*compute_);
  return busy_used_++;
}
void SlidingWindowExecutor::busy_end(int t) {
  if (t >= 0) ev_->busy_end[size_t(t)]->record(*compute_);
}
void SlidingWindowExecutor::gpu_times(StepStats& st) {
  if (busy_used_ == 0) return;
  auto& b = ev_->busy_start;
  auto& e = ev_->busy_end;
  const int n = busy_used_, first_bwd = busy_first_bwd_ < 0 ? n : busy_first_bwd_;
  double busy_f = 0, busy_b = 0;
  for (int i = 0; i < n; ++i) {
    const double d = e[size_t(i)]->seconds_since(*b[size_t(i)]);
    if (d < 0) return;  // the backend cannot time
    (i < first_bwd ? busy_f : busy_b) += d;
  }
  st.gpu_busy_seconds = busy_f + busy_b;
  auto span = [](Event& to, Event& from) { return std::max(0.0, to.seconds_since(from)); };
  if (first_bwd > 0) st.gpu_idle_forward_seconds = std::max(0.0, span(*e[size_t(first_bwd - 1)], *b[0]) - busy_f);
  if (first_bwd < n)
    st.gpu_idle_backward_seconds = std::max(0.0, span(*e[size_t(n - 1)], *b[size_t(first_bwd)]) - busy_b);
  // The boundary: this run's end (marked by the previous call) to its first compute op, plus
  // the previous run's tail after its last compute op.
  if (step_end_recorded_) st.gpu_idle_before_seconds = tail_prev_ + span(*b[0], *ev_->step_end);
  ev_->step_end->record(*compute_);  // now: the next step measures from here
  compute_->synchronize();
  tail_prev_ = span(*ev_->step_end, *e[size_t(n - 1)]);
  step_end_recorded_ = true;
}

void SlidingWindowExecutor::run(const std::vector<Op>& ops, const std::vector<Batch>& chunks,
                                float grad_scale) {
  chunk_off_.assign(chunks.size(), 0);
  for (size_t c = 1; c < chunks.size(); ++c)
    chunk_off_[c] = chunk_off_[c - 1] + chunks[c - 1].n_tokens();
  for (size_t c = 0; c < chunks.size(); ++c) batches_[c]->upload(*h2d_, chunks[c]);
  ev_->batch_ready->record(*h2d_);
  ev_->batch_ready->wait(*compute_);
  be_.fill_zero(*compute_, loss_->data(), 4);
  bool backward = ops.back().kind != OpKind::head;
  if (backward) {
    be_.fill_zero(*compute_, norms_->data(), norms_->bytes());
    be_.fill_zero(*compute_, head_g_->data(), head_g_->bytes());
    if (table_g_) be_.fill_zero(*compute_, table_g_->data(), table_g_->bytes());
  }
  schedule_ = ops;
  busy_used_ = 0;
  busy_first_bwd_ = -1;
  auto t0 = std::chrono::steady_clock::now();
  phase_seconds_[0] = phase_seconds_[1] = 0;
  for (const Op& op : ops) {
    if (op.kind == OpKind::fetch_input && op.layer == layout_.n_layers - 1 && op.chunk == 0) {
      compute_->synchronize();  // the forward and head are done: split the timing here
      auto t1 = std::chrono::steady_clock::now();
      phase_seconds_[0] = std::chrono::duration<double>(t1 - t0).count();
      t0 = t1;
    }
    exec(op, chunks, grad_scale);
  }
  compute_->synchronize();
  grads_->synchronize();
  h2d_->synchronize();
  d2h_->synchronize();
  double rest = seconds_since(t0);
  (phase_seconds_[0] == 0 ? phase_seconds_[0] : phase_seconds_[1]) = rest;
}

StepStats SlidingWindowExecutor::train_step(std::span<const Batch> micro, const OptimHyper& h) {
  trace_mark("train_step: start");
  std::vector<Batch> chunks = make_chunks(micro);
  StepStats st = count_step(chunks);
  const float grad_scale = mean_loss_scale(st);
  const bool speculate = spec_ && step_may_speculate(h);
  emb_untouched_done_ = false;
  if (spec_) spec_->abandon();  // left running only by a step that threw
  if (speculate) {
    const AdamWStep s = next_adamw_step(h, store_, 1.f);  // coefficient 1 until the norm is known
    const int n_units = store_.n_units();
    spec_->ready.assign(size_t(n_units), 0);
    spec_->speculated.assign(size_t(n_units), 0);
    spec_->sumsq.assign(size_t(n_units), 0.0);
    spec_->have_sq.assign(size_t(n_units), 0);
    spec_->closing = false;
    spec_->busy_seconds = 0;
    spec_->error = nullptr;
    spec_->step = s;
    spec_->active = true;
    // The previous step's phase B may still be running (it overlaps this forward); it works
    // from its own copy of the flags, and phase A touches nothing before this backward,
    // which starts only after the forward waited for every unit's update.
    spec_->thread = std::thread([this, s, m = h.max_grad_norm] { speculate_loop(s, m); });
  }
  run(build_step_schedule({layout_.n_layers, int(chunks.size()), ec_.n_slots, true}), chunks,
      grad_scale);
  float loss = 0;
  be_.copy_to_host(*compute_, &loss, loss_->data(), 4);
  compute_->synchronize();
  st.loss_sum = loss;
  st.forward_seconds = phase_seconds_[0];
  st.backward_seconds = phase_seconds_[1];
  st.update_wait_seconds = updates_.take_wait_seconds();
  st.update_seconds = updates_.last_round_seconds();
  gpu_times(st);
  trace_mark("train_step: run done");
  const auto t0 = std::chrono::steady_clock::now();
  if (speculate) finish_speculative(h, st);
  else finish_update(h, st);
  st.finish_seconds = seconds_since(t0);
  trace_mark("train_step: update started");
  return st;
}

double SlidingWindowExecutor::eval_loss_sum(const Batch& b) {
  step_end_recorded_ = false;  // an evaluation between steps is not idle time
  std::vector<Batch> chunks = make_chunks(std::span<const Batch>(&b, 1));
  run(build_step_schedule({layout_.n_layers, int(chunks.size()), ec_.n_slots, false}), chunks,
      0.f);
  float loss = 0;
  be_.copy_to_host(*compute_, &loss, loss_->data(), 4);
  compute_->synchronize();
  return loss;
}

}  // namespace sf
