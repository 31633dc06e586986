// AdamW undo/redo front end: validates the steps (and that `done` can be undone), computes
// their constants once per decay flag, cuts the ranges into kAdamWChunk-element tasks (as
// adamw.cpp does) and runs the chosen kernel on each over the thread pool. Elementwise, so
// the result does not depend on the pool.
#include "optim/adamw_undo.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/kernel_table.h"

namespace sf {

namespace ok = optim_kernels;

namespace {

// Constants of `s` for no-decay [0] and decay [1] ranges (layout checked in adamw.cpp).
struct StepConsts {
  ok::Consts c[2];
};
StepConsts consts_of(const AdamWStep& s) {
  static_assert(sizeof(AdamWConstants) == sizeof(ok::Consts));
  const AdamWConstants cn = adamw_constants(s, false), cd = adamw_constants(s, true);
  StepConsts k;
  std::memcpy(&k.c[0], &cn, sizeof cn);
  std::memcpy(&k.c[1], &cd, sizeof cd);
  return k;
}

// The constants of a step to undo: dividing by beta1, beta2 and the decay factor needs them
// non-zero.
StepConsts undo_consts_of(const AdamWStep& s, std::span<const ParamRange> ranges) {
  const StepConsts k = consts_of(s);
  SF_CHECK(s.beta1 > 0 && s.beta2 > 0, "AdamW undo: beta1 = ", s.beta1, ", beta2 = ", s.beta2,
           ": a step with a zero beta forgets the previous moment and cannot be undone; the "
           "caller must not update speculatively with such betas");
  const bool any_decay =
      std::any_of(ranges.begin(), ranges.end(), [](const ParamRange& r) { return r.decay; });
  SF_CHECK(!any_decay || k.c[1].decay != 0.0f, "AdamW undo: 1 - lr * weight_decay is 0 (lr ",
           s.lr, ", weight_decay ", s.weight_decay,
           "): the step zeroed the decayed weights and cannot be undone");
  return k;
}

struct Task {
  int64_t begin, end;
  bool decay;
};

// Runs fn(task) for every kAdamWChunk piece of every range, over the pool when there are
// several.
template <class F>
void for_each_task(std::span<const ParamRange> ranges, ThreadPool* pool, F&& fn) {
  std::vector<Task> tasks;
  for (const ParamRange& r : ranges)
    for (int64_t b = r.offset; b < r.offset + r.numel; b += kAdamWChunk)
      tasks.push_back({b, std::min(r.offset + r.numel, b + kAdamWChunk), r.decay});
  auto one = [&](int64_t t) { fn(tasks[size_t(t)]); };
  if (pool && tasks.size() > 1)
    pool->run_tasks(int64_t(tasks.size()), one);
  else
    for (size_t t = 0; t < tasks.size(); ++t) one(int64_t(t));
}

bool has_work(std::span<const ParamRange> ranges) {
  return std::any_of(ranges.begin(), ranges.end(), [](const ParamRange& r) { return r.numel; });
}

template <class G>
void undo(float* p, float* m, float* v, const G* g, int64_t n,
          std::span<const ParamRange> ranges, const AdamWStep& s, ThreadPool* pool,
          CpuIsa isa) {
  const auto kernel = ok::kernels_for<G>(isa).undo;
  const StepConsts k = undo_consts_of(s, ranges);
  check_param_ranges(ranges, n, "AdamW undo");
  if (!has_work(ranges)) return;
  SF_CHECK(p && m && v && g, "AdamW undo: null p/m/v/grad pointer for ", n, " elements");
  for_each_task(ranges, pool, [&](const Task& t) {
    kernel(p + t.begin, m + t.begin, v + t.begin, g + t.begin, t.end - t.begin,
           k.c[t.decay ? 1 : 0]);
  });
}

template <class G>
void redo(float* p, float* m, float* v, const G* g, uint16_t* out, int64_t n,
          std::span<const ParamRange> ranges, const AdamWStep& done, const AdamWStep& again,
          ThreadPool* pool, CpuIsa isa, bool fresh) {
  const auto kernel = ok::kernels_for<G>(isa).redo;
  const StepConsts kd = undo_consts_of(done, ranges), kr = consts_of(again);
  check_param_ranges(ranges, n, "AdamW redo");
  if (!has_work(ranges)) return;
  SF_CHECK(p && m && v && g, "AdamW redo: null p/m/v/grad pointer for ", n, " elements");
  for_each_task(ranges, pool, [&](const Task& t) {
    const int d = t.decay ? 1 : 0;
    kernel(p + t.begin, m + t.begin, v + t.begin, g + t.begin, out ? out + t.begin : nullptr,
           t.end - t.begin, kd.c[d], kr.c[d], fresh);
  });
}

}  // namespace

void adamw_undo_ranges(float* p, float* m, float* v, const float* grad, int64_t n,
                       std::span<const ParamRange> ranges, const AdamWStep& s, ThreadPool* pool,
                       CpuIsa isa) {
  undo(p, m, v, grad, n, ranges, s, pool, isa);
}
void adamw_undo_ranges(float* p, float* m, float* v, const uint16_t* grad_bf16, int64_t n,
                       std::span<const ParamRange> ranges, const AdamWStep& s, ThreadPool* pool,
                       CpuIsa isa) {
  undo(p, m, v, grad_bf16, n, ranges, s, pool, isa);
}
void adamw_redo_ranges(float* p, float* m, float* v, const float* grad, uint16_t* bf16_out,
                       int64_t n, std::span<const ParamRange> ranges, const AdamWStep& done,
                       const AdamWStep& redo_step, ThreadPool* pool, CpuIsa isa) {
  redo(p, m, v, grad, bf16_out, n, ranges, done, redo_step, pool, isa, false);
}
void adamw_redo_ranges(float* p, float* m, float* v, const uint16_t* grad_bf16,
                       uint16_t* bf16_out, int64_t n, std::span<const ParamRange> ranges,
                       const AdamWStep& done, const AdamWStep& redo_step, ThreadPool* pool,
                       CpuIsa isa) {
  redo(p, m, v, grad_bf16, bf16_out, n, ranges, done, redo_step, pool, isa, false);
}
void adamw_update_redo_ranges(float* p, float* m, float* v, const float* grad,
                              uint16_t* bf16_out, int64_t n, std::span<const ParamRange> ranges,
                              const AdamWStep& done, const AdamWStep& redo_step,
                              ThreadPool* pool, CpuIsa isa) {
  redo(p, m, v, grad, bf16_out, n, ranges, done, redo_step, pool, isa, true);
}
void adamw_update_redo_ranges(float* p, float* m, float* v, const uint16_t* grad_bf16,
                              uint16_t* bf16_out, int64_t n, std::span<const ParamRange> ranges,
                              const AdamWStep& done, const AdamWStep& redo_step,
                              ThreadPool* pool, CpuIsa isa) {
  redo(p, m, v, grad_bf16, bf16_out, n, ranges, done, redo_step, pool, isa, true);
}

}  // namespace sf
