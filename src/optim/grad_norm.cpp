// Deterministic sum of squares over fixed blocks, and the clipping coefficient.
#include "optim/grad_norm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/kernels.h"

namespace sf {

namespace ok = optim_kernels;

namespace {

template <class G>
using BlockFn = double (*)(const G*, int64_t);

BlockFn<float> pick(CpuIsa isa, const float*) {
  switch (resolve_cpu_isa(isa)) {
    case CpuIsa::avx512: return ok::sum_squares_f32_avx512;
    case CpuIsa::avx2: return ok::sum_squares_f32_avx2;
    default: return ok::sum_squares_f32_scalar;
  }
}
BlockFn<uint16_t> pick(CpuIsa isa, const uint16_t*) {
  switch (resolve_cpu_isa(isa)) {
    case CpuIsa::avx512: return ok::sum_squares_bf16_avx512;
    case CpuIsa::avx2: return ok::sum_squares_bf16_avx2;
    default: return ok::sum_squares_bf16_scalar;
  }
}

// Blocks per parallel task: 4 blocks = 1 MiB of f32, plenty to amortise scheduling.
constexpr int64_t kBlocksPerTask = 4;

template <class G>
double run(const G* g, int64_t n, ThreadPool* pool, CpuIsa isa) {
  SF_CHECK(n >= 0, "sum_squares: negative element count ", n);
  const BlockFn<G> block = pick(isa, g);
  if (n == 0) return 0.0;
  SF_CHECK(g, "sum_squares: null gradient pointer for ", n, " elements");
  const int64_t n_blocks = (n + kSumSquaresBlock - 1) / kSumSquaresBlock;
  std::vector<double> sums(static_cast<size_t>(n_blocks));
  auto one_task = [&](int64_t t) {
    const int64_t b1 = std::min(n_blocks, (t + 1) * kBlocksPerTask);
    for (int64_t b = t * kBlocksPerTask; b < b1; ++b) {
      const int64_t off = b * kSumSquaresBlock;
      sums[size_t(b)] = block(g + off, std::min(kSumSquaresBlock, n - off));
    }
  };
  const int64_t n_tasks = (n_blocks + kBlocksPerTask - 1) / kBlocksPerTask;
  if (pool && n_tasks > 1)
    pool->run_tasks(n_tasks, one_task);
  else
    for (int64_t t = 0; t < n_tasks; ++t) one_task(t);
  double total = 0.0;
  for (double s : sums) total += s;  // block order: independent of who computed what
  return total;
}

}  // namespace

double sum_squares(const float* g, int64_t n, ThreadPool* pool, CpuIsa isa) {
  return run(g, n, pool, isa);
}
double sum_squares(const uint16_t* g_bf16, int64_t n, ThreadPool* pool, CpuIsa isa) {
  return run(g_bf16, n, pool, isa);
}

float clip_coefficient(double total_norm, double max_norm) {
  if (!std::isfinite(total_norm)) return std::numeric_limits<float>::quiet_NaN();
  if (!(max_norm > 0)) return 1.0f;
  return float(std::min(1.0, max_norm / (total_norm + 1e-6)));
}

}  // namespace sf
