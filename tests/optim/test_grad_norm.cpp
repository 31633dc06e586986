// Gradient norm: sum of squares against a long-double reference, bitwise identical over
// ISAs, thread counts and gradient dtypes; the clipping coefficient.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/grad_norm.h"
#include "test_util.h"

using namespace sf;

namespace {
long double reference(const std::vector<float>& g) {
  long double s = 0;
  for (float x : g) s += (long double)x * x;
  return s;
}
const CpuIsa kIsas[] = {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512};
}  // namespace

TEST(SumSquares, MatchesLongDoubleReference) {
  for (int64_t n : {1, 15, 63, 64, 1000003}) {
    SCOPED_TRACE(n);
    const auto g = test::random_vec(size_t(n), 300 + uint64_t(n), -3.f, 3.f);
    const double got = sum_squares(g.data(), n, nullptr, CpuIsa::scalar);
    // All terms are >= 0 and exact, so each of our sums of k terms is within (k-1) * 2^-53
    // relative; the longest chain is 8192 lane adds + 3 combines + 16 block adds, so
    // 1e-12 relative is a rigorous bound (the long-double reference adds ~1e-15 more).
    EXPECT_NEAR(got, double(reference(g)), 1e-12 * double(reference(g)));
  }
}

TEST(SumSquares, IdenticalForEveryIsaThreadCountAndDtype) {
  ThreadPool one(1), four(4);
  for (int64_t n : {int64_t(1), int64_t(15), int64_t(63), int64_t(64), int64_t(1000003),
                    3 * kSumSquaresBlock * 4 + 5}) {
    SCOPED_TRACE(n);
    auto g = test::random_vec(size_t(n), 400 + uint64_t(n), -2.f, 2.f);
    for (float& x : g) x = round_bf16(x);  // so the bf16 copy holds the same values
    std::vector<uint16_t> gh(g.size());
    for (size_t i = 0; i < g.size(); ++i) gh[i] = f32_to_bf16(g[i]);
    const double want = sum_squares(g.data(), n, nullptr, CpuIsa::scalar);
    for (CpuIsa isa : kIsas) {
      if (!cpu_isa_supported(isa)) continue;
      SCOPED_TRACE(cpu_isa_name(isa));
      for (ThreadPool* pool : {&one, &four}) {
        EXPECT_EQ(sum_squares(g.data(), n, pool, isa), want);  // bitwise: EQ on doubles
        EXPECT_EQ(sum_squares(gh.data(), n, pool, isa), want);
      }
    }
  }
}

// Blocks really change the summation order, so equality above is not vacuous: a plain
// double running sum of the same data differs in the last bits.
TEST(SumSquares, BlockOrderIsNotAPlainRunningSum) {
  const int64_t n = 1000003;
  const auto g = test::random_vec(size_t(n), 77, -1.f, 1.f);
  double running = 0;
  for (float x : g) running += double(x) * x;
  EXPECT_NE(sum_squares(g.data(), n), running);
}

TEST(ClipCoefficient, FollowsTorchClipGradNorm) {
  // Gradients {3, 4} (norm 5) in two buffers, clipped to max_norm 1.
  const float a[] = {3.f}, b[] = {4.f};
  const double norm = std::sqrt(sum_squares(a, 1) + sum_squares(b, 1));
  EXPECT_EQ(norm, 5.0);
  const float c = clip_coefficient(norm, 1.0);
  EXPECT_EQ(c, float(1.0 / (5.0 + 1e-6)));  // 0.19999996
  EXPECT_NEAR(c * 5.0, 1.0, 1e-6);          // scaled norm lands on max_norm (within 1e-6/5)
  EXPECT_EQ(clip_coefficient(norm, 10.0), 1.0f);   // below the limit: untouched
  EXPECT_EQ(clip_coefficient(norm, 0.0), 1.0f);    // clipping off
  EXPECT_EQ(clip_coefficient(0.0, 1.0), 1.0f);     // zero gradients
  EXPECT_TRUE(std::isnan(clip_coefficient(INFINITY, 1.0)));  // caller must skip the step
  EXPECT_TRUE(std::isnan(clip_coefficient(NAN, 1.0)));
}

// Ranges skip padding and equal the per-range sums added in order, for any pool and ISA.
TEST(SumSquares, RangesEqualPerRangeSumsInOrder) {
  const int64_t n = 5 * kSumSquaresBlock + 1000;
  auto g = test::random_vec(size_t(n), 91, -1.f, 1.f);
  const std::vector<ParamRange> ranges = {
      {0, 7, false}, {64, 3 * kSumSquaresBlock + 5, true}, {3 * kSumSquaresBlock + 128, 900, false},
      {5 * kSumSquaresBlock, 1000, true}};
  double want = 0;
  for (const ParamRange& r : ranges) want += sum_squares(g.data() + r.offset, r.numel);
  // Garbage in the padding must not count.
  std::vector<bool> covered(size_t(n), false);
  for (const ParamRange& r : ranges)
    for (int64_t i = 0; i < r.numel; ++i) covered[size_t(r.offset + i)] = true;
  for (size_t i = 0; i < size_t(n); ++i)
    if (!covered[i]) g[i] = 1e30f;
  ThreadPool four(4);
  for (CpuIsa isa : kIsas) {
    if (!cpu_isa_supported(isa)) continue;
    SCOPED_TRACE(cpu_isa_name(isa));
    EXPECT_EQ(sum_squares_ranges(g.data(), n, ranges, nullptr, isa), want);
    EXPECT_EQ(sum_squares_ranges(g.data(), n, ranges, &four, isa), want);
  }
  const std::vector<ParamRange> bad = {{10, 5, true}, {12, 5, true}};
  EXPECT_THROW(sum_squares_ranges(g.data(), n, bad), Error);
}
