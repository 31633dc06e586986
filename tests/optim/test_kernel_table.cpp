// The one ISA dispatch table (optim/kernel_table.h): each variant's row holds that variant's
// kernels and no other's (a row wired to the scalar kernels would pass every bitwise
// cross-ISA test while never running SIMD code), automatic picks what resolve_cpu_isa picks,
// and a variant this CPU lacks is refused as before.
#include <gtest/gtest.h>

#include "core/error.h"
#include "optim/kernel_table.h"

using namespace sf;
namespace ok = sf::optim_kernels;

namespace {

template <class G>
void expect_row(const ok::KernelSet<G>& got, const ok::KernelSet<G>& want) {
  EXPECT_EQ(got.adamw, want.adamw);
  EXPECT_EQ(got.undo, want.undo);
  EXPECT_EQ(got.redo, want.redo);
  EXPECT_EQ(got.sum_squares, want.sum_squares);
}

TEST(KernelTable, EachVariantRunsItsOwnKernels) {
  const ok::KernelTable scalar{
      {ok::adamw_f32_scalar, ok::adamw_undo_f32_scalar, ok::adamw_redo_f32_scalar,
       ok::sum_squares_f32_scalar},
      {ok::adamw_bf16_scalar, ok::adamw_undo_bf16_scalar, ok::adamw_redo_bf16_scalar,
       ok::sum_squares_bf16_scalar}};
  const ok::KernelTable avx2{
      {ok::adamw_f32_avx2, ok::adamw_undo_f32_avx2, ok::adamw_redo_f32_avx2,
       ok::sum_squares_f32_avx2},
      {ok::adamw_bf16_avx2, ok::adamw_undo_bf16_avx2, ok::adamw_redo_bf16_avx2,
       ok::sum_squares_bf16_avx2}};
  const ok::KernelTable avx512{
      {ok::adamw_f32_avx512, ok::adamw_undo_f32_avx512, ok::adamw_redo_f32_avx512,
       ok::sum_squares_f32_avx512},
      {ok::adamw_bf16_avx512, ok::adamw_undo_bf16_avx512, ok::adamw_redo_bf16_avx512,
       ok::sum_squares_bf16_avx512}};
  const std::pair<CpuIsa, const ok::KernelTable*> rows[] = {
      {CpuIsa::scalar, &scalar}, {CpuIsa::avx2, &avx2}, {CpuIsa::avx512, &avx512}};
  for (const auto& [isa, want] : rows) {
    SCOPED_TRACE(cpu_isa_name(isa));
    if (!cpu_isa_supported(isa)) {
      EXPECT_THROW(ok::kernel_table(isa), Error);  // refused, as resolve_cpu_isa refuses it
      continue;
    }
    expect_row(ok::kernel_table(isa).f32, want->f32);
    expect_row(ok::kernel_table(isa).bf16, want->bf16);
    expect_row(ok::kernels_for<float>(isa), want->f32);
    expect_row(ok::kernels_for<uint16_t>(isa), want->bf16);
  }
  EXPECT_EQ(&ok::kernel_table(CpuIsa::automatic),
            &ok::kernel_table(resolve_cpu_isa(CpuIsa::automatic)));
}

}  // namespace
