// Internal to src/optim: the dispatch from a CpuIsa to its compact-state kernels
// (state_kernels.h), for state_adamw.cpp. Kept out of state_kernels.h for kernel_table.h's
// reason (no templates or inline functions where ISA-flagged files can see them).
#pragma once
#include <cstdint>

#include "optim/cpu_isa.h"
#include "optim/state_kernels.h"

namespace sf::optim_kernels {

// [grad: 0 f32, 1 bf16][moments: 0 f32, 1 bf16, 2 int8][master: 0 f32, 1 bf16].
struct StateKernelTable {
  StateKernel k[2][3][2];
  void (*int8_encode)(const float*, int64_t, bool, const StateConsts&, uint8_t*, float*);
  void (*int8_decode)(const uint8_t*, int64_t, bool, float, const StateConsts&, float*);
};

// The kernels `isa` runs (resolve_cpu_isa picks the variant, as for kernel_table()).
const StateKernelTable& state_kernel_table(CpuIsa isa);

}  // namespace sf::optim_kernels
