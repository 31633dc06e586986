#include "engine/schedule.h"

#include "core/error.h"

namespace sf {

std::string_view op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::load_weights: return "load_weights";
    case OpKind::embed_forward: return "embed_forward";
    case OpKind::layer_forward: return "layer_forward";
    case OpKind::offload_input: return "offload_input";
    case OpKind::head: return "head";
    case OpKind::grads_out: return "grads_out";
    case OpKind::fetch_input: return "fetch_input";
    case OpKind::layer_backward: return "layer_backward";
    case OpKind::embed_backward: return "embed_backward";
  }
  return "?";
}

std::string describe(const Op& op) {
  std::string s(op_kind_name(op.kind));
  if (op.unit >= 0) s += cat(" unit=", op.unit);
  if (op.layer >= 0) s += cat(" layer=", op.layer);
  if (op.chunk >= 0) s += cat(" chunk=", op.chunk);
  if (op.slot >= 0 || op.kind == OpKind::load_weights) s += cat(" slot=", op.slot);
  if (op.buf >= 0) s += cat(" buf=", op.buf);
  return s;
}

std::vector<Op> build_step_schedule(const StepShape& sh) {
  SF_CHECK(sh.n_layers >= 1 && sh.n_chunks >= 1 && sh.n_slots >= 2, "bad step shape");
  const int L = sh.n_layers, C = sh.n_chunks, S = sh.n_slots;
  const int head_unit = L + 1;
  std::vector<Op> ops;
  std::vector<int> slot_layer(size_t(S), -1);  // which layer each slot holds
  auto slot_of = [&](int k) { return k % S; };
  auto load = [&](int k) {
    ops.push_back({OpKind::load_weights, k + 1, k, -1, slot_of(k)});
    slot_layer[size_t(slot_of(k))] = k;
  };

  // ---- forward
  load(0);
  for (int c = 0; c < C; ++c) ops.push_back({OpKind::embed_forward, 0, -1, c});
  for (int k = 0; k < L; ++k) {
    if (k + 1 < L) load(k + 1);  // overlaps with layer k's compute
    else ops.push_back({OpKind::load_weights, head_unit, -1, -1, -1});
    for (int c = 0; c < C; ++c) {
      // The input goes to the store while the layer computes on it (both only read it).
      if (sh.backward) ops.push_back({OpKind::offload_input, k + 1, k, c});
      ops.push_back({OpKind::layer_forward, k + 1, k, c, slot_of(k)});
    }
  }
  // ---- head
  for (int c = 0; c < C; ++c) ops.push_back({OpKind::head, head_unit, -1, c});
  if (!sh.backward) return ops;
  ops.push_back({OpKind::grads_out, head_unit});
  // ---- backward
  // Saved inputs are fetched one chunk ahead into two alternating buffers.
  std::vector<int> buf_of(size_t(L) * size_t(C), -1);
  int next_buf = 0;
  auto fetch = [&](int k, int c) {
    ops.push_back({OpKind::fetch_input, k + 1, k, c, -1, next_buf});
    buf_of[size_t(k) * size_t(C) + size_t(c)] = next_buf;
    next_buf ^= 1;
  };
  fetch(L - 1, 0);
  for (int k = L - 1; k >= 0; --k) {
    if (slot_layer[size_t(slot_of(k))] != k) load(k);
    // Load the next layer down into the other slot while this one computes.
    if (k > 0 && slot_layer[size_t(slot_of(k - 1))] != k - 1) load(k - 1);
    for (int c = 0; c < C; ++c) {
      if (c + 1 < C) fetch(k, c + 1);
      else if (k > 0) fetch(k - 1, 0);
      ops.push_back({OpKind::layer_backward, k + 1, k, c, slot_of(k),
                     buf_of[size_t(k) * size_t(C) + size_t(c)]});
    }
    ops.push_back({OpKind::grads_out, k + 1, k});
  }
  for (int c = 0; c < C; ++c) ops.push_back({OpKind::embed_backward, 0, -1, c});
  return ops;
}

}  // namespace sf
