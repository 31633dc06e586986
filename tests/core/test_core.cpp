#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <limits>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"

using namespace sf;

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly half way between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
  // 1 + 3*2^-8 is half way between 1.0078125 (odd) and 1.015625 (even): rounds up.
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-INFINITY)), -INFINITY);
}

TEST(DType, F16RoundTripsEveryHalf) {
  // Every finite f16 value converts to f32 and back to the same bits.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint16_t b = uint16_t(h);
    if (((b >> 10) & 0x1f) == 0x1f) continue;  // inf/nan
    ASSERT_EQ(f32_to_f16(f16_to_f32(b)), b) << std::hex << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00);  // rounds to inf
  EXPECT_EQ(f32_to_f16(65519.f), 0x7bff);
}

TEST(ThreadPool, CoversRangeExactlyOnce) {
  ThreadPool pool(4);
  std::vector<std::atomic<int>> hits(1003);
  pool.parallel_for(1003, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
  }, 16);
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

TEST(ThreadPool, PropagatesExceptions) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(100, [](int64_t b, int64_t) {
    if (b > 0) throw Error(ErrorKind::internal, "boom");
  }), Error);
  // Still usable afterwards.
  std::atomic<int64_t> sum{0};
  pool.parallel_for(10, [&](int64_t b, int64_t e) { for (auto i = b; i < e; ++i) sum += i; });
  EXPECT_EQ(sum.load(), 45);
}

TEST(Error, CheckNamesExpressionAndLocation) {
  try {
    SF_CHECK(1 + 1 == 3, "arithmetic");
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("1 + 1 == 3"), std::string::npos);
    EXPECT_NE(m.find("test_core.cpp"), std::string::npos);
    EXPECT_EQ(e.kind(), ErrorKind::internal);
  }
}
