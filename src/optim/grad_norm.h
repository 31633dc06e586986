// Global gradient norm and clipping (torch.nn.utils.clip_grad_norm_ semantics), computed on
// the host, deterministically: the same bits for any thread count and any CPU ISA.
//
// sum_squares() cuts a buffer into kSumSquaresBlock-element blocks; each block is summed in
// double in a fixed order (kernels.h), and the block sums are added in block order. The
// caller adds the per-buffer results in a fixed buffer order (e.g. unit order), takes
// sqrt for the global norm and folds clip_coefficient() into AdamWStep::grad_scale; the
// gradients themselves are never rewritten.
#pragma once
#include <cstdint>
#include <span>

#include "optim/cpu_isa.h"
#include "optim/param_range.h"

namespace sf {

class ThreadPool;

constexpr int64_t kSumSquaresBlock = 64 * 1024;

// Sum of squares (in double; each square is exact) of n f32 / bf16 values. pool may be null.
double sum_squares(const float* g, int64_t n, ThreadPool* pool = nullptr,
                   CpuIsa isa = CpuIsa::automatic);
double sum_squares(const uint16_t* g_bf16, int64_t n, ThreadPool* pool = nullptr,
                   CpuIsa isa = CpuIsa::automatic);
// The sum over the ranges (param_range.h; decay ignored) of a flat buffer of n elements,
// skipping padding: bitwise what adding sum_squares() of each range in range order gives,
// computed in one parallel sweep.
double sum_squares_ranges(const float* g, int64_t n, std::span<const ParamRange> ranges,
                          ThreadPool* pool = nullptr, CpuIsa isa = CpuIsa::automatic);
double sum_squares_ranges(const uint16_t* g_bf16, int64_t n, std::span<const ParamRange> ranges,
                          ThreadPool* pool = nullptr, CpuIsa isa = CpuIsa::automatic);

// min(1, max_norm / (total_norm + 1e-6)), the factor torch's clip_grad_norm_ multiplies the
// gradients by; 1 when max_norm <= 0 (clipping off). A non-finite total_norm gives NaN,
// which adamw_update refuses as grad_scale: the caller must skip that step.
float clip_coefficient(double total_norm, double max_norm);

}  // namespace sf
