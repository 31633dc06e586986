// Host AdamW: one pass over fp32 master weights p and Adam moments m, v (all updated in
// place, i.e. overwritten) that reads the gradient (f32 or bf16) and, optionally, writes the
// next step's bf16 weights (overwrite). Scalar, AVX2 and AVX-512 kernels, picked at run time
// (cpu_isa.h), spread over a ThreadPool.
//
// The arithmetic, per element, all in fp32, in exactly this order and without fused
// multiply-add (this file's kernels are built with -ffp-contract=off), mirrors
// torch.optim.AdamW; the CUDA kernel and the host-backend reference must do the same:
//     g  = grad * grad_scale
//     m  = beta1 * m + one_minus_beta1 * g
//     v  = beta2 * v + one_minus_beta2 * g * g          ((one_minus_beta2 * g) * g)
//     p  = p * decay
//     denom = sqrt(v) / bc2_sqrt + eps                   (correctly rounded sqrt and /)
//     p  = p - step_size * m / denom                     ((step_size * m) / denom)
//     out = f32_to_bf16(p)                               (round to nearest even, core/dtype.h)
// with the per-step constants of adamw_constants() below. Since every variant performs the
// same correctly rounded IEEE operations, scalar, AVX2 and AVX-512 results are bitwise
// identical, and (the update being elementwise) independent of the thread count.
#pragma once
#include <cstdint>
#include <span>

#include "optim/adamw_step.h"
#include "optim/cpu_isa.h"
#include "optim/param_range.h"

namespace sf {

class ThreadPool;

// The per-step scalars of the formula above.
struct AdamWConstants {
  float grad_scale;
  float beta1, one_minus_beta1;  // one_minus_beta1 = 1.0f - beta1 (fp32)
  float beta2, one_minus_beta2;  // one_minus_beta2 = 1.0f - beta2 (fp32)
  float decay;                   // 1.0f - lr * weight_decay (fp32); 1.0f for no-decay ranges
  float step_size;               // float(double(lr) / (1 - double(beta1)^step))
  float bc2_sqrt;                // float(sqrt(1 - double(beta2)^step))
  float eps;
};
// Validates `s` (step >= 1, 0 <= beta < 1, lr, eps, weight_decay >= 0 and finite; throws
// Error(input) naming the field otherwise) and a finite grad_scale (Error(internal): a
// non-finite gradient norm must make the caller skip the step, not poison the weights).
AdamWConstants adamw_constants(const AdamWStep& s, bool decay);

// One AdamW step on n contiguous parameters, all with weight decay s.weight_decay.
// bf16_out may be null (no bf16 copy). pool may be null (runs on the calling thread).
// Arrays need no particular alignment and must not overlap each other. The SIMD kernels
// write an aligned bf16_out with non-temporal stores (it is not read here, and in training it
// goes to the GPU next), so it is not left in the CPU caches.
void adamw_update(float* p, float* m, float* v, const float* grad, uint16_t* bf16_out,
                  int64_t n, const AdamWStep& s, ThreadPool* pool,
                  CpuIsa isa = CpuIsa::automatic);
// The same with a bf16 gradient (raw bits, as core/dtype.h carries them).
void adamw_update(float* p, float* m, float* v, const uint16_t* grad_bf16, uint16_t* bf16_out,
                  int64_t n, const AdamWStep& s, ThreadPool* pool,
                  CpuIsa isa = CpuIsa::automatic);

// One AdamW step on the ranges (param_range.h) of flat buffers of n elements, all in one
// parallel sweep; decay = false ranges use weight_decay 0. Elements outside the ranges,
// bf16_out included, are not touched. Same arithmetic and guarantees as adamw_update.
void adamw_update_ranges(float* p, float* m, float* v, const float* grad, uint16_t* bf16_out,
                         int64_t n, std::span<const ParamRange> ranges, const AdamWStep& s,
                         ThreadPool* pool, CpuIsa isa = CpuIsa::automatic);
void adamw_update_ranges(float* p, float* m, float* v, const uint16_t* grad_bf16,
                         uint16_t* bf16_out, int64_t n, std::span<const ParamRange> ranges,
                         const AdamWStep& s, ThreadPool* pool, CpuIsa isa = CpuIsa::automatic);

// Elements per parallel task: a multiple of 64 (whole cache lines and SIMD vectors in every
// array) and large enough (256 KiB of each f32 array) that scheduling costs nothing.
constexpr int64_t kAdamWChunk = 64 * 1024;

}  // namespace sf
