// Undoing a host AdamW step (adamw.h), and replacing one applied step by another in a single
// pass: for the speculative update, which steps parameters with clip coefficient 1 while the
// backward still runs and must redo them when the final global gradient norm needs clipping.
// p, m, v are updated in place (overwritten); the optional bf16 copy is overwritten.
//
// The undo inverts the update algebraically, per element, all in fp32, in exactly this order
// (the one of the engine's first, scalar rollback) and without fused multiply-add, using the
// constants c = adamw_constants(s, range.decay) of the step being undone:
//     g  = grad * grad_scale
//     denom = sqrt(v) / bc2_sqrt + eps                   (v after the step: the update's denom)
//     p_decayed = p + step_size * m / denom              ((step_size * m) / denom)
//     p  = p_decayed / decay
//     m  = (m - one_minus_beta1 * g) / beta1
//     v  = std::max(0.0f, (v - one_minus_beta2 * g * g) / beta2)   ((one_minus_beta2 * g) * g);
//                                                        a NaN or negative quotient gives +0
// Rounding makes the restored state equal the original only up to a few ulps (relative to
// the larger of the values before and after the step; see tests/optim/test_adamw_undo.cpp).
// Scalar, AVX2 and AVX-512 give bitwise identical results, independent of the thread count.
#pragma once
#include <cstdint>
#include <span>

#include "optim/adamw.h"

namespace sf {

class ThreadPool;

// Undo one AdamW step `s` on the ranges (param_range.h) of flat buffers of n elements: p, m,
// v hold the state after the step and are overwritten with the state before it, given the
// gradient the step used (f32, or bf16 raw bits). Elements outside the ranges are not
// touched. Needs s.beta1 > 0 and s.beta2 > 0 (a zero beta forgets the old moment: throws
// Error(internal), the caller must not speculate then) and, for decay ranges,
// 1 - lr * weight_decay != 0; s is otherwise validated as by adamw_constants.
void adamw_undo_ranges(float* p, float* m, float* v, const float* grad, int64_t n,
                       std::span<const ParamRange> ranges, const AdamWStep& s, ThreadPool* pool,
                       CpuIsa isa = CpuIsa::automatic);
void adamw_undo_ranges(float* p, float* m, float* v, const uint16_t* grad_bf16, int64_t n,
                       std::span<const ParamRange> ranges, const AdamWStep& s, ThreadPool* pool,
                       CpuIsa isa = CpuIsa::automatic);

// Replace step `done` (already applied to p, m, v) by step `redo` with the same gradient
// (typically the same step with another grad_scale): per element exactly the undo above with
// done's constants then the adamw.h update with redo's, in registers, in one pass over
// memory. Writes bf16_out (may be null) like adamw_update_ranges. Bitwise identical to
// adamw_undo_ranges(done) followed by adamw_update_ranges(redo). `done` must be undoable as
// above; `redo` is validated by adamw_constants.
void adamw_redo_ranges(float* p, float* m, float* v, const float* grad, uint16_t* bf16_out,
                       int64_t n, std::span<const ParamRange> ranges, const AdamWStep& done,
                       const AdamWStep& redo, ThreadPool* pool, CpuIsa isa = CpuIsa::automatic);
void adamw_redo_ranges(float* p, float* m, float* v, const uint16_t* grad_bf16,
                       uint16_t* bf16_out, int64_t n, std::span<const ParamRange> ranges,
                       const AdamWStep& done, const AdamWStep& redo, ThreadPool* pool,
                       CpuIsa isa = CpuIsa::automatic);

// The bits of adamw_update_ranges(done) followed by adamw_redo_ranges(done, redo), in one
// pass (the first update stays in registers): for state that was NOT updated speculatively
// when others were, so that a clipped step gives the same bits whichever units the
// speculation reached.
void adamw_update_redo_ranges(float* p, float* m, float* v, const float* grad,
                              uint16_t* bf16_out, int64_t n, std::span<const ParamRange> ranges,
                              const AdamWStep& done, const AdamWStep& redo, ThreadPool* pool,
                              CpuIsa isa = CpuIsa::automatic);
void adamw_update_redo_ranges(float* p, float* m, float* v, const uint16_t* grad_bf16,
                              uint16_t* bf16_out, int64_t n, std::span<const ParamRange> ranges,
                              const AdamWStep& done, const AdamWStep& redo, ThreadPool* pool,
                              CpuIsa isa = CpuIsa::automatic);
}  // namespace sf
