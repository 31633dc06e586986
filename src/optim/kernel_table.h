// Internal to src/optim: the one dispatch table from a CpuIsa to its kernels (kernels.h), for
// the front ends adamw.cpp, adamw_undo.cpp and grad_norm.cpp.
//
// Kept out of kernels.h on purpose: the ISA-flagged translation units (kernels_avx2.cpp,
// kernels_avx512.cpp) must not include this header, whose templates would otherwise be
// emitted there with AVX code (see kernels.h).
#pragma once
#include <cstdint>
#include <type_traits>

#include "optim/cpu_isa.h"
#include "optim/kernels.h"

namespace sf::optim_kernels {

// One ISA's kernels for gradients of type G: float (f32) or uint16_t (bf16).
template <class G>
struct KernelSet {
  void (*adamw)(float*, float*, float*, const G*, uint16_t*, int64_t, const Consts&);
  void (*undo)(float*, float*, float*, const G*, int64_t, const Consts&);
  void (*redo)(float*, float*, float*, const G*, uint16_t*, int64_t, const Consts&,
               const Consts&, bool);
  double (*sum_squares)(const G*, int64_t);
};

struct KernelTable {
  KernelSet<float> f32;
  KernelSet<uint16_t> bf16;
};

// The kernels `isa` runs: resolve_cpu_isa(isa) (automatic -> SF_ADAMW_ISA or the best this
// CPU supports; throws for a variant it lacks) picks the table. The only place a CpuIsa
// chooses kernels.
const KernelTable& kernel_table(CpuIsa isa);

template <class G>
const KernelSet<G>& kernels_for(CpuIsa isa) {
  static_assert(std::is_same_v<G, float> || std::is_same_v<G, uint16_t>);
  const KernelTable& t = kernel_table(isa);
  if constexpr (std::is_same_v<G, float>)
    return t.f32;
  else
    return t.bf16;
}

}  // namespace sf::optim_kernels
