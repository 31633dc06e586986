#include "engine/adamw_rollback.h"

#include <algorithm>
#include <cmath>

#include "core/thread_pool.h"

namespace sf {

void adamw_rollback_ranges(float* p, float* m, float* v, const void* grad, DType gt, int64_t n,
                           std::span<const ParamRange> ranges, const AdamWStep& s,
                           ThreadPool* pool) {
  SF_CHECK(s.beta1 > 0 && s.beta2 > 0, "an AdamW step with a zero beta cannot be undone");
  for (const ParamRange& r : ranges) {
    SF_CHECK(r.offset >= 0 && r.offset + r.numel <= n, "rollback range outside the buffer");
    const AdamWConstants k = adamw_constants(s, r.decay);
    auto body = [&](int64_t b, int64_t e) {
      for (int64_t i = r.offset + b; i < r.offset + e; ++i) {
        float g = gt == DType::f32 ? static_cast<const float*>(grad)[i]
                                   : bf16_to_f32(static_cast<const uint16_t*>(grad)[i]);
        g *= k.grad_scale;
        const float denom = std::sqrt(v[i]) / k.bc2_sqrt + k.eps;
        const float p_decayed = p[i] + k.step_size * m[i] / denom;
        p[i] = p_decayed / k.decay;
        m[i] = (m[i] - k.one_minus_beta1 * g) / k.beta1;
        v[i] = std::max(0.0f, (v[i] - k.one_minus_beta2 * g * g) / k.beta2);
      }
    };
    if (pool) pool->parallel_for(r.numel, body, 1 << 16);
    else body(0, r.numel);
  }
}

}  // namespace sf
