#include "engine/window_context.h"

#include <cstring>

#include "core/dtype.h"
#include "optim/state_adamw.h"

namespace sf {

float* WindowContext::f32_weights(int u) const {
  if (!ec.bf16_master()) return store.master(u);
  return static_cast<float*>(bufs.at(BufferRole::master_mirror, u).data());
}

void WindowContext::follow_master(int u, int64_t off, int64_t len) const {
  if (reduced() || !ec.bf16_master()) return;
  state_to_f32(store.state(u), off, len, f32_weights(u) + off, nullptr, nullptr, store.ranges(u));
}

void WindowContext::master_to_compute(int u, void* dst, int64_t b, int64_t e) const {
  const size_t n = size_t(e - b);
  if (!ec.bf16_master()) {
    convert_from_f32(store.master(u) + b, dst, cd, n);
    return;
  }
  const uint16_t* src = store.master_bf16(u) + b;
  if (cd == DType::bf16) {
    std::memcpy(dst, src, n * 2);
    return;
  }
  float* out = static_cast<float*>(dst);
  for (size_t i = 0; i < n; ++i) out[i] = bf16_to_f32(src[i]);
}

}  // namespace sf
