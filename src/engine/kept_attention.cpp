// The attention store's bindings and trips (see kept_attention.h for the contract).
#include "engine/kept_attention.h"

#include "core/error.h"

namespace sf {

KeptAttention::KeptAttention(const WindowContext& w)
    : w_(w), store_(kept_attention_layout(w.cfg, w.ec.max_chunk_tokens, w.ec.max_chunks, w.cd)),
      stage_(kept_attention_layout(w.cfg, w.ec.max_chunk_tokens, 1, w.cd)) {
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

KeptAttention::Place KeptAttention::in_store(const KeptChunk& ch) const {
  SF_CHECK(ch.c < w_.ec.max_chunks && ch.t0 + ch.T <= w_.max_step_tokens && ch.T <= w_.ec.max_chunk_tokens,
           "kept attention: chunk ", ch.c, " (tokens [", ch.t0, ", ", ch.t0 + ch.T, ")) is beyond the store's ",
           w_.ec.max_chunks, " chunks of ", w_.ec.max_chunk_tokens);
  return {att_bytes(ch.t0), store_.lse_offset + size_t(ch.c) * store_.lse_stride};
}

void KeptAttention::bind(LayerActs& a, void* base, Place p) const {
  char* b = static_cast<char*>(base);
  a.att = Mat(b + p.att, w_.cd, a.T, w_.cfg.q_dim());
  a.lse = reinterpret_cast<float*>(b + p.lse);
}

LayerActs KeptAttention::for_forward(LayerActs a, int k, const KeptChunk& ch, int n_chunks, Stream& compute) {
  if (w_.ec.kept_attention_on_device) {
    bind(a, store(k), in_store(ch));
    return a;
  }
  const int i = stage_of(k, ch.c, n_chunks);
  stage_sent_[i]->wait(compute);
  bind(a, stage(i), in_stage());
  return a;
}

void KeptAttention::after_forward(int k, const KeptChunk& ch, int n_chunks, Stream& compute, Stream& d2h) {
  if (w_.ec.kept_attention_on_device) return;
  const int i = stage_of(k, ch.c, n_chunks);
  stage_written_[i]->record(compute);
  stage_written_[i]->wait(d2h);
  const Place from = in_stage(), to = in_store(ch);
  char *src = static_cast<char*>(stage(i)), *dst = static_cast<char*>(store(k));
  w_.be.copy_to_host(d2h, dst + to.att, src + from.att, att_bytes(ch.T));
  w_.be.copy_to_host(d2h, dst + to.lse, src + from.lse, lse_bytes(ch.T));
  stage_sent_[i]->record(d2h);
}

void KeptAttention::fetch(int k, const KeptChunk& ch, int buf, Stream& h2d) {
  if (w_.ec.kept_attention_on_device) return;
  const Place from = in_store(ch), to = in_stage();
  char *src = static_cast<char*>(store(k)), *dst = static_cast<char*>(stage(buf));
  w_.be.copy_to_device(h2d, dst + to.att, src + from.att, att_bytes(ch.T));
  w_.be.copy_to_device(h2d, dst + to.lse, src + from.lse, lse_bytes(ch.T));
}

LayerActs KeptAttention::for_backward(LayerActs a, int k, const KeptChunk& ch, int buf) const {
  if (w_.ec.kept_attention_on_device) bind(a, store(k), in_store(ch));
  else bind(a, stage(buf), in_stage());
  return a;
}

}  // namespace sf
