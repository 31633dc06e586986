#include "engine/embedding_path.h"

#include <algorithm>

#include "core/stopwatch.h"

namespace sf {

EmbeddingPath::EmbeddingPath(WindowContext& w) : w_(w) {
  const int64_t V = w.cfg.vocab_size, C = w.cfg.hidden_size;
  const auto& r0 = w.store.ranges(0);
  SF_CHECK(r0.size() == 1 && r0[0].offset == 0 && r0[0].numel == V * C,
           "the embedding unit must hold exactly the [V, C] table");
  grad_ = std::make_unique<EmbeddingGrad>(V, C, w.max_step_tokens, w.layout.tied,
                                          static_cast<float*>(w.bufs.at(BufferRole::embedding_grad).data()));
  // The forward gathers its rows straight from the fp32 master (the device reads them over
  // PCIe; no host thread and no staging copy between the update and layer 0).
  // A bf16 master is gathered as it is; an f32 compute dtype reads f32 rows (the master, or
  // its decoded mirror).
  table_dtype_ = w.ec.bf16_master() && w.reduced() ? DType::bf16 : DType::f32;
  void* table = table_dtype_ == DType::bf16 ? static_cast<void*>(w.store.master_bf16(0))
                                             : static_cast<void*>(w.f32_weights(0));
  table_ = w.be.map_host(table, size_t(V * C) * dtype_size(table_dtype_), "the embedding table");
}

void EmbeddingPath::forward(const std::vector<Batch>& chunks, int c, Mat x0, const int32_t* tokens) {
  Stream& h2d = *w_.streams.h2d;
  if (c == 0) {
    grad_->set_rows(chunks);
    if (device_scatter()) {  // each token's gradient row, for the backward's scatter
      const int64_t R = grad_->touched_rows();
      const int64_t B = block_ = w_.test.split_embedding_scatter ? std::max<int64_t>(1, (R + 1) / 2) : block_rows();
      SF_CHECK(B <= block_rows(), "embedding scatter: block of ", B, " rows > ", block_rows());
      Buffer& host_rows = w_.bufs.at(BufferRole::embedding_rows_host);
      int32_t* rows = static_cast<int32_t*>(host_rows.data());
      grad_->token_rows(chunks, 0, B, rows);
      grad_->token_rows(chunks, B, B, rows + w_.max_step_tokens);
      w_.be.copy_to_device(h2d, w_.bufs.at(BufferRole::embedding_rows_device).data(), rows, host_rows.bytes());
    }
  }
  const Mat table(table_->data(), table_dtype_, w_.cfg.vocab_size, w_.cfg.hidden_size);
  w_.be.embedding_forward(h2d, x0, tokens, table);
  trace_mark("embed_forward: gather enqueued");
  w_.ev.emb_done[size_t(c)]->record(h2d);
}

bool EmbeddingPath::backward(const std::vector<Batch>& chunks, const std::vector<int64_t>& chunk_off,
                             int c, Mat dx_c) {
  const int n_chunks = int(chunks.size());
  if (device_scatter()) {  // every chunk at once
    if (c != 0) return false;
    grad_on_device(chunk_off.back() + chunks.back().n_tokens());
    trace_mark("embed_backward: rows home");
    return true;
  }
  Stream& d2h = *w_.streams.d2h;
  const bool tied = w_.layout.tied;
  // The host gets here long before the backward ends: an untied gradient is zeroed
  // meanwhile (a tied one starts from the head's share, which lands with the rest).
  if (c == 0 && !tied) grad_->zero(nullptr, host_pool());
  if (c == 0) w_.ev.layer0_done->wait(d2h);
  char* host = static_cast<char*>(w_.bufs.at(BufferRole::embedding_grad_stage).data()) +
               size_t(chunk_off[size_t(c)] * w_.cfg.hidden_size) * dtype_size(w_.cd);
  w_.be.copy_to_host(d2h, host, dx_c.data, dx_c.bytes());
  d2h.synchronize();  // (chunk 0) and every gradient of the step has landed
  if (c == 0 && tied)
    grad_->zero(static_cast<const float*>(w_.bufs.at(BufferRole::tied_table_grad_host).data()), host_pool());
  trace_mark("embed_backward: zeroed, dx home", c);
  grad_->scatter(chunks[size_t(c)], host, w_.cd, host_pool());
  trace_mark("embed_backward: scattered");
  return c == n_chunks - 1;
}

int64_t EmbeddingPath::block_rows() const {
  return int64_t(w_.bufs.at(BufferRole::activations, 0).bytes() / (size_t(w_.cfg.hidden_size) * 4));
}

// The sparse embedding gradient of the step's T tokens: dX (all chunks, on the device after
// layer 0's backward) summed per row in token order by the backend's embedding_backward into
// f32 row blocks carved from the X buffers, then copied into the gradient's storage. Same
// bits as EmbeddingGrad::scatter (zero, then += each token's row in order).
void EmbeddingPath::grad_on_device(int64_t T) {
  const int64_t C = w_.cfg.hidden_size, R = grad_->touched_rows(), B = block_;
  SF_CHECK(R <= 2 * B, "embedding gradient: ", R, " rows exceed the device scatter's ", 2 * B);
  Stream &compute = *w_.streams.compute, &d2h = *w_.streams.d2h;
  const Mat dx(w_.bufs.at(BufferRole::activation_grad).data(), w_.cd, T, C);
  char* home = static_cast<char*>(w_.bufs.at(BufferRole::embedding_grad).data());
  const int32_t* token_rows = static_cast<const int32_t*>(w_.bufs.at(BufferRole::embedding_rows_device).data());
  for (int blk = 0; blk < 2; ++blk) {
    const int64_t r0 = blk * B, n = std::min(B, R - r0);
    if (n <= 0) break;
    const Mat rows(w_.bufs.at(BufferRole::activations, blk).data(), DType::f32, n, C);
    w_.be.fill_zero(compute, rows.data, rows.bytes());
    w_.be.embedding_backward(compute, rows, token_rows + blk * w_.max_step_tokens, dx);
    w_.be.sum_squares(compute, w_.norms(), rows);  // the unit's norm
  }
  w_.ev.emb_rows_done->record(compute);
  w_.ev.emb_rows_done->wait(d2h);
  for (int blk = 0; blk < 2; ++blk) {
    const int64_t r0 = blk * B, n = std::min(B, R - r0);
    if (n <= 0) break;
    w_.be.copy_to_host(d2h, home + size_t(r0 * C) * 4, w_.bufs.at(BufferRole::activations, blk).data(),
                       size_t(n * C) * 4);
  }
  w_.be.copy_to_host(d2h, &sumsq_, w_.norms(), 4);
  d2h.synchronize();  // and every other gradient of the step has landed
}

double EmbeddingPath::sum_squares(ThreadPool& pool) const {
  return device_norm() ? double(sumsq_) : grad_->sum_squares(pool);
}

void EmbeddingPath::adamw(EmbeddingGrad::Kind kind, EmbeddingGrad::Rows rows, const AdamWStep& s,
                          const AdamWStep& done, ThreadPool& pool) {
  Buffer* staging = w_.bufs.find(BufferRole::home, 0);
  uint16_t* out = staging ? static_cast<uint16_t*>(staging->data()) : nullptr;
  if (!w_.store.format().is_fp32()) {
    SF_CHECK(kind == EmbeddingGrad::Kind::update, "a compact optimizer state has no undo or redo");
    grad_->adamw_state(rows, w_.store.state(0), w_.store.ranges(0), out, s, pool,
                       [this](int64_t off, int64_t len) { w_.follow_master(0, off, len); });
    return;
  }
  grad_->adamw(kind, rows, w_.store.master(0), w_.store.m(0), w_.store.v(0), out,
               w_.store.ranges(0)[0].decay, s, done, pool);
}

}  // namespace sf

