// What every part of the sliding-window executor shares: the backend, the model and engine
// settings, the host state, the buffer list, the events and the streams. The executor owns
// all of them and hands this view to its components (homes, embedding path, device-AdamW
// layers, host updater), so that each component states what it owns and reads the rest here.
#pragma once
#include <memory>

#include "backend/backend.h"
#include "engine/engine_config.h"
#include "optim/param_store.h"
#include "engine/window_buffers.h"
#include "engine/window_events.h"
#include "io/model_config.h"
#include "model/param_layout.h"

namespace sf {

// compute: layers and head; h2d / d2h: weights, inputs, activations and gradients for the
// step; grads: grads_out's casts and sums of squares (EngineConfig::grads_stream); upd_d2h /
// upd_h2d: the update thread's trips (resident homes' pieces, device AdamW).
struct WindowStreams {
  std::unique_ptr<Stream> compute, h2d, d2h, grads, upd_d2h, upd_h2d;
  explicit WindowStreams(Backend& be)
      : compute(be.create_stream("compute")), h2d(be.create_stream("h2d")),
        d2h(be.create_stream("d2h")), grads(be.create_stream("grads")),
        upd_d2h(be.create_stream("update d2h")), upd_h2d(be.create_stream("update h2d")) {}
};

struct WindowContext {
  Backend& be;
  const ModelConfig& cfg;
  const ModelLayout& layout;
  const EngineConfig& ec;
  EngineTestModes test;
  DType cd;  // the compute dtype: weights, gradients on their trips, activations
  ParamStore& store;
  WindowBuffers& bufs;
  WindowEvents& ev;
  WindowStreams& streams;
  int64_t max_step_tokens;

  int n_units() const { return int(layout.units.size()); }
  int head_unit() const { return n_units() - 1; }
  bool reduced() const { return cd != DType::f32; }
  // Unit u's weights as an f32 compute dtype reads them: the fp32 master, or its decoded
  // mirror when the master is bf16 (BufferRole::master_mirror).
  float* f32_weights(int u) const;
  // After an update of [off, off + len) of unit u: a mirror follows its bf16 master (a no-op
  // without one).
  void follow_master(int u, int64_t off, int64_t len) const;
  // Elements [b, e) of unit u's master as compute-dtype values into dst (dst[0] is element b).
  void master_to_compute(int u, void* dst, int64_t b, int64_t e) const;
  // Device-reduced gradient sums of squares, f32 [units].
  float* norms() const { return static_cast<float*>(bufs.at(BufferRole::norms).data()); }
  // Layer k's f32 gradient accumulator: the two alternating ones, or its own (device-AdamW
  // layers from 2 on, whose gradient must outlive the backward).
  Buffer& layer_grad(int k) const {
    return k >= 2 && ec.device_adamw(k + 1) ? bufs.at(BufferRole::device_adamw_grad, k)
                                            : bufs.at(BufferRole::layer_grad, k % ec.layer_grad_buffers);
  }
};

}  // namespace sf
