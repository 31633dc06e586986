// Undo one AdamW step (the optim/adamw.h formula) given the gradient it used, for the
// speculative update: parameters updated during the backward with clip coefficient 1 are
// restored when the final global norm turns out to need clipping, then updated again with the
// right coefficient. The inverse is algebraic, so the restored state equals the original up to
// fp32 rounding (a few ulps), which is what "exact within fp32 rounding" allows; steps that
// need no clipping never come here and stay bit-exact.
#pragma once
#include <cstdint>
#include <span>

#include "backend/backend.h"
#include "optim/adamw.h"

namespace sf {

class ThreadPool;

// p, m, v (overwritten): the state after adamw with step `s`; grad: f32 or bf16 (raw bits).
void adamw_rollback_ranges(float* p, float* m, float* v, const void* grad, DType grad_dtype,
                           int64_t n, std::span<const ParamRange> ranges, const AdamWStep& s,
                           ThreadPool* pool);

}  // namespace sf
