// Deterministic sum of squares over fixed blocks, and the clipping coefficient.
#include "optim/grad_norm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/kernel_table.h"

namespace sf {

namespace ok = optim_kernels;

namespace {

// Blocks per parallel task: 4 blocks = 1 MiB of f32, plenty to amortise scheduling.
constexpr int64_t kBlocksPerTask = 4;

// Sum over ranges in order of (sum over the range's blocks in order, from 0.0): exactly
// what summing sum_squares() of each range in turn gives.
template <class G>
double run(const G* g, int64_t n, std::span<const ParamRange> ranges, ThreadPool* pool,
           CpuIsa isa) {
  const auto block = ok::kernels_for<G>(isa).sum_squares;
  check_param_ranges(ranges, n, "sum_squares");
  struct Block {
    int64_t begin, size;
  };
  std::vector<Block> blocks;
  std::vector<size_t> first;  // first block of each range, then blocks.size()
  for (const ParamRange& r : ranges) {
    first.push_back(blocks.size());
    for (int64_t b = 0; b < r.numel; b += kSumSquaresBlock)
      blocks.push_back({r.offset + b, std::min(kSumSquaresBlock, r.numel - b)});
  }
  first.push_back(blocks.size());
  if (blocks.empty()) return 0.0;
  SF_CHECK(g, "sum_squares: null gradient pointer for ", n, " elements");

  std::vector<double> sums(blocks.size());
  const int64_t n_blocks = int64_t(blocks.size());
  auto one_task = [&](int64_t t) {
    const int64_t b1 = std::min(n_blocks, (t + 1) * kBlocksPerTask);
    for (int64_t b = t * kBlocksPerTask; b < b1; ++b)
      sums[size_t(b)] = block(g + blocks[size_t(b)].begin, blocks[size_t(b)].size);
  };
  const int64_t n_tasks = (n_blocks + kBlocksPerTask - 1) / kBlocksPerTask;
  if (pool && n_tasks > 1)
    pool->run_tasks(n_tasks, one_task);
  else
    for (int64_t t = 0; t < n_tasks; ++t) one_task(t);
  // Fixed order, independent of who computed which block.
  double total = 0.0;
  for (size_t r = 0; r + 1 < first.size(); ++r) {
    double range_sum = 0.0;
    for (size_t b = first[r]; b < first[r + 1]; ++b) range_sum += sums[b];
    total += range_sum;
  }
  return total;
}

}  // namespace

double sum_squares(const float* g, int64_t n, ThreadPool* pool, CpuIsa isa) {
  const ParamRange all{0, n, true};
  return run(g, n, {&all, 1}, pool, isa);
}
double sum_squares(const uint16_t* g_bf16, int64_t n, ThreadPool* pool, CpuIsa isa) {
  const ParamRange all{0, n, true};
  return run(g_bf16, n, {&all, 1}, pool, isa);
}
double sum_squares_ranges(const float* g, int64_t n, std::span<const ParamRange> ranges,
                          ThreadPool* pool, CpuIsa isa) {
  return run(g, n, ranges, pool, isa);
}
double sum_squares_ranges(const uint16_t* g_bf16, int64_t n,
                          std::span<const ParamRange> ranges, ThreadPool* pool, CpuIsa isa) {
  return run(g_bf16, n, ranges, pool, isa);
}

float clip_coefficient(double total_norm, double max_norm) {
  if (!std::isfinite(total_norm)) return std::numeric_limits<float>::quiet_NaN();
  if (!(max_norm > 0)) return 1.0f;
  return float(std::min(1.0, max_norm / (total_norm + 1e-6)));
}

}  // namespace sf
