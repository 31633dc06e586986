// CudaBackend::device_used_bytes: the device's bytes in use as the driver counts them
// (cudaMemGetInfo), next to the backend's own counter (bytes_in_use), as the per-step memory
// sampler reads them (report/memory_sampler.h).
#include "cuda_test_util.h"

namespace sf::test {
namespace {

// Assumes the GPU machine's usual state: no other process allocates or frees device memory
// while the test runs (the driver's count is device-wide).
TEST(CudaMemoryQuery, DriverCountFollowsAllocationsAndExceedsOurs) {
  SF_REQUIRE_GPU();
  CudaBackend& be = gpu();
  const size_t n = size_t(256) << 20;
  const size_t used0 = be.device_used_bytes();
  // The driver counts our buffers and, beyond them, at least the CUDA context.
  EXPECT_GT(used0, be.bytes_in_use());
  size_t used1 = 0;
  {
    auto a = be.alloc(n, "query probe");
    used1 = be.device_used_bytes();
    // cudaMalloc takes whole pages (2 MiB granules): at least n more, not much beyond.
    EXPECT_GE(used1, used0 + n);
    EXPECT_LE(used1, used0 + n + (size_t(64) << 20));
  }
  // cudaFree hands the pages back to the driver at once (no caching allocator in between).
  EXPECT_LE(be.device_used_bytes(), used1 - n);
  // The host backend has no device memory of its own.
  EXPECT_EQ(host().device_used_bytes(), 0u);
}

}  // namespace
}  // namespace sf::test
