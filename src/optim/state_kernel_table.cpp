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
                     {state_bf16_int8_f32_##ISA, state_bf16_int8_bf16_##ISA}}}, \
                   int8_encode_##ISA, int8_decode_##ISA}
constexpr StateKernelTable kScalar = SF_STATE_TABLE(scalar);
constexpr StateKernelTable kAvx2 = SF_STATE_TABLE(avx2);
constexpr StateKernelTable kAvx512 = SF_STATE_TABLE(avx512);
#undef SF_STATE_TABLE

}  // namespace

const StateKernelTable& state_kernel_table(CpuIsa isa) {
  switch (resolve_cpu_isa(isa)) {
    case CpuIsa::scalar: return kScalar;
    case CpuIsa::avx2: return kAvx2;
    case CpuIsa::avx512: return kAvx512;
    case CpuIsa::automatic: break;  // resolve_cpu_isa never returns it
  }
  SF_CHECK(false, "state kernels: resolve_cpu_isa(", cpu_isa_name(isa),
           ") gave automatic; cpu_isa.cpp must map it to a variant");
  return kScalar;
}

}  // namespace sf::optim_kernels
