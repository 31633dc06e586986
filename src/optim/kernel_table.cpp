// The per-ISA kernel tables (kernel_table.h), built with baseline flags like every optim file
// but the two kernel files.
#include "optim/kernel_table.h"

#include "core/error.h"

namespace sf::optim_kernels {

namespace {

constexpr KernelTable kScalar{
    .f32 = {.adamw = adamw_f32_scalar, .undo = adamw_undo_f32_scalar,
            .redo = adamw_redo_f32_scalar, .sum_squares = sum_squares_f32_scalar},
    .bf16 = {.adamw = adamw_bf16_scalar, .undo = adamw_undo_bf16_scalar,
             .redo = adamw_redo_bf16_scalar, .sum_squares = sum_squares_bf16_scalar},
};
constexpr KernelTable kAvx2{
    .f32 = {.adamw = adamw_f32_avx2, .undo = adamw_undo_f32_avx2,
            .redo = adamw_redo_f32_avx2, .sum_squares = sum_squares_f32_avx2},
    .bf16 = {.adamw = adamw_bf16_avx2, .undo = adamw_undo_bf16_avx2,
             .redo = adamw_redo_bf16_avx2, .sum_squares = sum_squares_bf16_avx2},
};
constexpr KernelTable kAvx512{
    .f32 = {.adamw = adamw_f32_avx512, .undo = adamw_undo_f32_avx512,
            .redo = adamw_redo_f32_avx512, .sum_squares = sum_squares_f32_avx512},
    .bf16 = {.adamw = adamw_bf16_avx512, .undo = adamw_undo_bf16_avx512,
             .redo = adamw_redo_bf16_avx512, .sum_squares = sum_squares_bf16_avx512},
};

}  // namespace

const KernelTable& kernel_table(CpuIsa isa) {
  switch (resolve_cpu_isa(isa)) {
    case CpuIsa::scalar: return kScalar;
    case CpuIsa::avx2: return kAvx2;
    case CpuIsa::avx512: return kAvx512;
    case CpuIsa::automatic: break;  // resolve_cpu_isa never returns it
  }
  SF_CHECK(false, "optimizer kernels: resolve_cpu_isa(", cpu_isa_name(isa),
           ") gave automatic; cpu_isa.cpp must map it to a variant");
  return kScalar;
}

}  // namespace sf::optim_kernels
