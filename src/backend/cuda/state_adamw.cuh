// Launcher of the compact-state AdamW step on the GPU (kernel in state_adamw.cu), for
// device-resident layers: optim/state_adamw.h's adamw_update_state with the state, gradient
// and output in device memory. Same window rules (optim/state_adamw.h), same encodings
// (optim/state_format.h) and the same IEEE operations in the same order (correctly rounded
// _rn intrinsics, no FMA), so the state it leaves is bitwise the host scalar kernel's.
//   master, m, v, m_scale, v_scale   updated in place (overwrite) inside the window's ranges
//   weights_out (bf16, overwrite; may be null)   the new master's bf16 bits, at the window's
//                                               first element, like bf16_out on the host
// Enqueued on `s`; checks the launch; NVTX range "adamw_state".
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "optim/adamw_step.h"
#include "optim/param_range.h"
#include "optim/state_format.h"

namespace sf::cuda {

void launch_adamw_state(cudaStream_t s, const UnitStateView& state, int64_t off, int64_t len,
                        const float* grad, uint16_t* weights_out,
                        std::span<const ParamRange> ranges, const AdamWStep& step);

}  // namespace sf::cuda
