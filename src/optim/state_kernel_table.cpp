// The per-ISA compact-state kernel tables (state_kernel_table.h), built with baseline flags.
#include "optim/state_kernel_table.h"

#include "core/error.h"

namespace sf::optim_kernels {

namespace {

#define SF_STATE_TABLE(ISA)                                                   \
  StateKernelTable{{{{state_f32_f32_f32_##ISA, state_f32_f32_bf16_##ISA},      \
                     {state_f32_bf16_f32_##ISA, state_f32_bf16_bf16_##ISA},    \
                     {state_f32_int8_f32_##ISA, state_f32_int8_bf16_##ISA}},   \
                    {{state_bf16_f32_f32_##ISA, state_bf16_f32_bf16_##ISA},    \
                     {state_bf16_bf16_f32_##ISA, state_bf16_bf16_bf16_##ISA},  \
                     {state_bf16_int8_f32_##ISA, state_bf16_int8_bf16_##ISA}}}}
constexpr StateKernelTable kScalar = SF_STATE_TABLE(scalar);
#undef SF_STATE_TABLE

}  // namespace

const StateKernelTable& state_kernel_table(CpuIsa isa) {
  // The SIMD variants are not written yet: every ISA runs the scalar reference.
  (void)resolve_cpu_isa(isa);
  return kScalar;
}

}  // namespace sf::optim_kernels
