#include "engine/kept_attention.h"

#include "core/error.h"

namespace sf {

KeptAttention::KeptAttention(const WindowContext& w) : w_(w), chunk_capacity_(w.ec.max_chunk_tokens) {
  for (int i = 0; i < 2; ++i) {
    stage_written_[i] = w.be.create_event();
    stage_sent_[i] = w.be.create_event();
  }
}

size_t KeptAttention::att_bytes(int64_t T) const {
  return size_t(T) * size_t(w_.cfg.q_dim()) * dtype_size(w_.cd);
}
size_t KeptAttention::lse_bytes(int64_t T) const {
  return size_t(w_.cfg.num_attention_heads) * size_t(T) * 4;
}

void* KeptAttention::store(int k) const { return w_.bufs.at(BufferRole::kept_attention, k).data(); }
void* KeptAttention::stage(int i) const { return w_.bufs.at(BufferRole::kept_attention_stage, i).data(); }

void KeptAttention::bind(LayerActs& a, void* base, int64_t capacity, int64_t t0) const {
  SF_CHECK(t0 + a.T <= capacity, "kept attention: tokens [", t0, ", ", t0 + a.T, ") beyond the buffer's ",
           capacity);
  char* b = static_cast<char*>(base);
  const KeptAttentionLayout l = kept_attention_layout(w_.cfg, capacity, w_.cd);
  a.att = Mat(b + att_bytes(t0), w_.cd, a.T, w_.cfg.q_dim());
  a.lse = reinterpret_cast<float*>(b + l.lse_offset + lse_bytes(t0));
}

LayerActs KeptAttention::for_forward(LayerActs a, int k, int c, int n_chunks, int64_t t0, Stream& compute) {
  if (w_.ec.kept_attention_on_device) {
    bind(a, store(k), w_.max_step_tokens, t0);
    return a;
  }
  const int i = stage_of(k, c, n_chunks);
  stage_sent_[i]->wait(compute);
  bind(a, stage(i), chunk_capacity_, 0);
  return a;
}

void KeptAttention::after_forward(int k, int c, int n_chunks, int64_t t0, int64_t T, Stream& compute,
                                  Stream& d2h) {
  if (w_.ec.kept_attention_on_device) return;
  const int i = stage_of(k, c, n_chunks);
  stage_written_[i]->record(compute);
  stage_written_[i]->wait(d2h);
  const KeptAttentionLayout st = kept_attention_layout(w_.cfg, chunk_capacity_, w_.cd),
                            sl = kept_attention_layout(w_.cfg, w_.max_step_tokens, w_.cd);
  char *from = static_cast<char*>(stage(i)), *to = static_cast<char*>(store(k));
  w_.be.copy_to_host(d2h, to + att_bytes(t0), from, att_bytes(T));
  w_.be.copy_to_host(d2h, to + sl.lse_offset + lse_bytes(t0), from + st.lse_offset, lse_bytes(T));
  stage_sent_[i]->record(d2h);
}

void KeptAttention::fetch(int k, int buf, int64_t t0, int64_t T, Stream& h2d) {
  if (w_.ec.kept_attention_on_device) return;
  const KeptAttentionLayout st = kept_attention_layout(w_.cfg, chunk_capacity_, w_.cd),
                            sl = kept_attention_layout(w_.cfg, w_.max_step_tokens, w_.cd);
  char *to = static_cast<char*>(stage(buf)), *from = static_cast<char*>(store(k));
  w_.be.copy_to_device(h2d, to, from + att_bytes(t0), att_bytes(T));
  w_.be.copy_to_device(h2d, to + st.lse_offset, from + sl.lse_offset + lse_bytes(t0), lse_bytes(T));
}

LayerActs KeptAttention::for_backward(LayerActs a, int k, int buf, int64_t t0) const {
  if (w_.ec.kept_attention_on_device) bind(a, store(k), w_.max_step_tokens, t0);
  else bind(a, stage(buf), chunk_capacity_, 0);
  return a;
}

}  // namespace sf
