// The sliding window's attention store (EngineConfig::kept_attention_layers): for each kept
// layer and chunk, the attention output att [T, Q] and its log-sum-exp [Hq, T] from the
// layer's forward, read again by its backward, which then recomputes every other part of the
// forward but not the attention (model/recipes.h: Recompute::all_but_attention).
//
// Device store: the forward's att and lse are bound straight into the layer's store and the
// backward reads them there: no copies, compute stream only. Host store (pinned): the forward
// writes into one of two device stages (alternating per layer visit) which then goes out on
// d2h, the next forward into that stage waiting for the trip (stage_sent); the backward's
// fetch_input brings a chunk back on h2d into the stage paired with its saved-input buffer,
// ordered like that buffer (buf_free before, buf_ready after: the caller's events). The
// forward's last trips out precede the backward's first fetch: both follow every forward op
// on d2h, which the first fetch waits for (offloads_done).
//
// Owns only its two pairs of events; the buffers are the window's (window_buffers.h:
// kept_attention, kept_attention_stage, laid out by kept_attention_layout). Used by the
// executor's thread alone. Evaluation passes do not use it (no backward).
#pragma once
#include <memory>

#include "engine/window_context.h"
#include "model/recipes.h"

namespace sf {

// One chunk of a step: its index, token offset in the step and tokens.
struct KeptChunk {
  int c = 0;
  int64_t t0 = 0, T = 0;
};

class KeptAttention {
 public:
  explicit KeptAttention(const WindowContext& w);

  bool keeps(int layer) const { return w_.ec.keeps_attention(layer); }
  // Layer k's forward of chunk ch (n_chunks in the step): a's att and lse rebound to where the
  // forward writes them; a host store's stage first waits (on compute) until what it held
  // has left.
  LayerActs for_forward(LayerActs a, int k, const KeptChunk& ch, int n_chunks, Stream& compute);
  // After that forward was enqueued on compute: a host store's stage goes out on d2h.
  void after_forward(int k, const KeptChunk& ch, int n_chunks, Stream& compute, Stream& d2h);
  // With layer k's saved input of chunk ch into buffer `buf` on h2d (after its buf_free wait,
  // before its buf_ready record): a host store's chunk into stage `buf`.
  void fetch(int k, const KeptChunk& ch, int buf, Stream& h2d);
  // Layer k's backward of chunk ch, its saved input in buffer `buf`: a's att and lse rebound
  // to the kept values.
  LayerActs for_backward(LayerActs a, int k, const KeptChunk& ch, int buf) const;

 private:
  // Where chunk ch's att and lse lie in a store (chunk = ch) or a stage (one chunk: 0).
  struct Place {
    size_t att = 0, lse = 0;
  };
  Place in_store(const KeptChunk& ch) const;
  Place in_stage() const { return {0, stage_.lse_offset}; }
  void bind(LayerActs& a, void* base, Place p) const;
  void* store(int k) const;
  void* stage(int i) const;
  int stage_of(int k, int c, int n_chunks) const { return (k * n_chunks + c) % 2; }
  size_t att_bytes(int64_t T) const;
  size_t lse_bytes(int64_t T) const;

  const WindowContext& w_;
  KeptAttentionLayout store_, stage_;
  std::unique_ptr<Event> stage_written_[2], stage_sent_[2];
};

}  // namespace sf
