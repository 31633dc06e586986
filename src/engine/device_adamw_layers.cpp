#include "engine/device_adamw_layers.h"

#include "engine/device_state.h"

namespace sf {

float* DeviceAdamWLayers::master(int u) const {
  return static_cast<float*>(w_.bufs.at(BufferRole::device_adamw_state, u - 1).data());
}

UnitStateView DeviceAdamWLayers::compact_view(int u) const {
  return device_state_view(w_.bufs.at(BufferRole::device_adamw_state, u - 1).data(), w_.store.layout(u),
                           w_.store.rounding_seed, u);
}

void DeviceAdamWLayers::adamw(int u, const AdamWStep& s) {
  Stream& st = *w_.streams.upd_h2d;
  const int k = u - 1;
  const int64_t n = w_.store.numel(u);
  const float* g = static_cast<const float*>(w_.layer_grad(k).data());
  // The new weights go to the home, except for an f32 compute dtype reading the fp32 master.
  char* out = w_.reduced() || w_.ec.bf16_master() ? static_cast<char*>(homes_.home(u)->data()) : nullptr;
  w_.ev.grads_home[size_t(u)]->wait(st);
  if (!w_.store.format().is_fp32()) {
    w_.be.adamw_state(st, compact_view(u), 0, n, g, out, w_.store.ranges(u), s);
  } else {
    float* p = master(u);
    adamw_fp32(st, u, p, p + n, p + 2 * n, g, out, s);
  }
  w_.ev.home_ready[size_t(u)]->record(st);
  // A shared accumulator is free for the next backward's layer k + 2 (layers 0 and 1).
  if (k < 2) w_.ev.grads_copied[k % 2]->record(st);
  host_stale_ = true;
}

// Per decay range, as adamw_update_ranges does on the host.
void DeviceAdamWLayers::adamw_fp32(Stream& st, int u, float* p, float* m, float* v, const float* g,
                                   char* out, const AdamWStep& s) {
  for (const ParamRange& r : w_.store.ranges(u)) {
    AdamWStep sr = s;
    if (!r.decay) sr.weight_decay = 0.f;
    w_.be.adamw(st, p + r.offset, m + r.offset, v + r.offset, g + r.offset,
                out ? out + size_t(r.offset) * dtype_size(w_.cd) : nullptr, r.numel, sr);
  }
}

void DeviceAdamWLayers::copy_state(Copy direction) {
  const bool to_host = direction == Copy::to_host;
  Stream& h2d = *w_.streams.h2d;
  for (int k = 0; k < w_.ec.device_adamw_layers; ++k) {
    const int u = k + 1;
    if (!w_.store.format().is_fp32()) {
      sf::copy_state(w_.be, h2d, w_.store.state(u), w_.bufs.at(BufferRole::device_adamw_state, k).data(),
                     to_host ? StateCopy::to_host : StateCopy::to_device);
      continue;
    }
    const size_t n = size_t(w_.store.numel(u)) * 4;
    char* d = reinterpret_cast<char*>(master(u));
    float* host[3] = {w_.store.master(u), w_.store.m(u), w_.store.v(u)};
    for (int i = 0; i < 3; ++i) {
      if (to_host) w_.be.copy_to_host(h2d, host[i], d + size_t(i) * n, n);
      else w_.be.copy_to_device(h2d, d + size_t(i) * n, host[i], n);
    }
  }
  h2d.synchronize();
}

void DeviceAdamWLayers::bring_home_if_stale() {
  if (!host_stale_) return;
  w_.streams.upd_h2d->synchronize();
  copy_state(Copy::to_host);
  host_stale_ = false;
}

void DeviceAdamWLayers::host_is_truth() {
  copy_state(Copy::to_device);
  host_stale_ = false;
}

}  // namespace sf
