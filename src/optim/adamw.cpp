// AdamW front end: validates the step, computes its constants once, cuts the work into
// kAdamWChunk-element tasks (never straddling a parameter range) and runs the chosen kernel
// on each over the thread pool. Results are elementwise, so they do not depend on the pool.
#include "optim/adamw.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/kernel_table.h"

namespace sf {

namespace ok = optim_kernels;
static_assert(sizeof(AdamWConstants) == sizeof(ok::Consts) &&
              offsetof(AdamWConstants, eps) == offsetof(ok::Consts, eps) &&
              offsetof(AdamWConstants, decay) == offsetof(ok::Consts, decay));

AdamWConstants adamw_constants(const AdamWStep& s, bool decay) {
  SF_REQUIRE(s.step >= 1, "AdamW: step must be >= 1 (1-based, for bias correction), got ",
             s.step);
  SF_REQUIRE(std::isfinite(s.lr) && s.lr >= 0, "AdamW: lr must be finite and >= 0, got ", s.lr);
  SF_REQUIRE(s.beta1 >= 0 && s.beta1 < 1, "AdamW: beta1 must be in [0, 1), got ", s.beta1);
  SF_REQUIRE(s.beta2 >= 0 && s.beta2 < 1, "AdamW: beta2 must be in [0, 1), got ", s.beta2);
  SF_REQUIRE(std::isfinite(s.eps) && s.eps >= 0, "AdamW: eps must be finite and >= 0, got ",
             s.eps);
  SF_REQUIRE(std::isfinite(s.weight_decay) && s.weight_decay >= 0,
             "AdamW: weight_decay must be finite and >= 0, got ", s.weight_decay);
  SF_CHECK(std::isfinite(s.grad_scale),
           "AdamW: grad_scale is ", s.grad_scale,
           " (a non-finite gradient norm?); the caller must skip this step instead");
  AdamWConstants c;
  c.grad_scale = s.grad_scale;
  c.beta1 = s.beta1;
  c.one_minus_beta1 = 1.0f - s.beta1;
  c.beta2 = s.beta2;
  c.one_minus_beta2 = 1.0f - s.beta2;
  c.decay = decay ? 1.0f - s.lr * s.weight_decay : 1.0f;
  const double bc1 = 1.0 - std::pow(double(s.beta1), double(s.step));
  const double bc2 = 1.0 - std::pow(double(s.beta2), double(s.step));
  c.step_size = float(double(s.lr) / bc1);
  c.bc2_sqrt = float(std::sqrt(bc2));
  c.eps = s.eps;
  return c;
}

namespace {

struct Task {
  int64_t begin, end;
  bool decay;
};

template <class G>
void run(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
         std::span<const ParamRange> ranges, const AdamWStep& s, ThreadPool* pool,
         CpuIsa isa) {
  const auto kernel = ok::kernels_for<G>(isa).adamw;
  const AdamWConstants cd = adamw_constants(s, true), cn = adamw_constants(s, false);
  ok::Consts consts[2];
  static_assert(sizeof(consts[0]) == sizeof(cd));
  std::memcpy(&consts[0], &cn, sizeof cn);
  std::memcpy(&consts[1], &cd, sizeof cd);

  check_param_ranges(ranges, n, "AdamW");
  std::vector<Task> tasks;
  for (const ParamRange& r : ranges)
    for (int64_t b = r.offset; b < r.offset + r.numel; b += kAdamWChunk)
      tasks.push_back({b, std::min(r.offset + r.numel, b + kAdamWChunk), r.decay});
  if (tasks.empty()) return;
  SF_CHECK(p && m && v && g, "AdamW: null p/m/v/grad pointer for ", n, " elements");

  auto one = [&](int64_t t) {
    const Task& k = tasks[size_t(t)];
    kernel(p + k.begin, m + k.begin, v + k.begin, g + k.begin, out ? out + k.begin : nullptr,
           k.end - k.begin, consts[k.decay ? 1 : 0]);
  };
  if (pool && tasks.size() > 1)
    pool->run_tasks(int64_t(tasks.size()), one);
  else
    for (size_t t = 0; t < tasks.size(); ++t) one(int64_t(t));
}

}  // namespace

void adamw_update(float* p, float* m, float* v, const float* grad, uint16_t* bf16_out,
                  int64_t n, const AdamWStep& s, ThreadPool* pool, CpuIsa isa) {
  const ParamRange all{0, n, true};
  run(p, m, v, grad, bf16_out, n, {&all, 1}, s, pool, isa);
}
void adamw_update(float* p, float* m, float* v, const uint16_t* grad_bf16, uint16_t* bf16_out,
                  int64_t n, const AdamWStep& s, ThreadPool* pool, CpuIsa isa) {
  const ParamRange all{0, n, true};
  run(p, m, v, grad_bf16, bf16_out, n, {&all, 1}, s, pool, isa);
}
void adamw_update_ranges(float* p, float* m, float* v, const float* grad, uint16_t* bf16_out,
                         int64_t n, std::span<const ParamRange> ranges, const AdamWStep& s,
                         ThreadPool* pool, CpuIsa isa) {
  run(p, m, v, grad, bf16_out, n, ranges, s, pool, isa);
}
void adamw_update_ranges(float* p, float* m, float* v, const uint16_t* grad_bf16,
                         uint16_t* bf16_out, int64_t n, std::span<const ParamRange> ranges,
                         const AdamWStep& s, ThreadPool* pool, CpuIsa isa) {
  run(p, m, v, grad_bf16, bf16_out, n, ranges, s, pool, isa);
}

}  // namespace sf
