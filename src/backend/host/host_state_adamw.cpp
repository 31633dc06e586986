// HostBackend::adamw_state: the compact-state AdamW step (backend.h) on host memory, run by
// optim's front end (optim/state_adamw.h) over host_pool(); weights_out (f32, the host
// compute dtype, overwrite) receives the decoded new master of the window's ranges.
#include "backend/host/host_backend.h"
#include "core/thread_pool.h"
#include "optim/state_adamw.h"

namespace sf {

void HostBackend::adamw_state(Stream&, const UnitStateView& state, int64_t off, int64_t len,
                              const float* grad, void* weights_out,
                              std::span<const ParamRange> ranges, const AdamWStep& step) {
  adamw_update_state(state, off, len, grad, nullptr, ranges, step, &host_pool());
  if (weights_out)
    state_to_f32(state, off, len, static_cast<float*>(weights_out), nullptr, nullptr, ranges);
}

}  // namespace sf
