// NcclCommunicator on real GPUs (CUDA builds; skipped without a GPU or libnccl): one rank runs
// every collective; one rank per GPU (threads) sums small integers exactly (any summation
// order gives the same bits), uneven shards included; a rank that never joins makes the
// formation time out with an Error instead of a hang.
#include <gtest/gtest.h>

#if SF_DIST_CUDA
#include <cuda_runtime.h>

#include <memory>

#include "dist/cuda/nccl_communicator.h"
#include "dist/dist_test_util.h"

namespace sf::dist {
namespace {

constexpr Timeout kLong{60000};  // a correct collective takes milliseconds; only formation is slow

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

#define SF_NEED_NCCL_GPUS(n)                                                          \
  auto lib = test::toolkit_nccl();                                                    \
  if (!lib) GTEST_SKIP() << "no libnccl.so.2";                                        \
  if (gpu_count() < (n)) GTEST_SKIP() << "needs " << (n) << " GPUs, has " << gpu_count()

// Small integers as floats: every partial sum is exact, so NCCL's order gives the serial bits.
std::vector<float> integers(size_t n, int seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(int((i * 7 + size_t(seed) * 13) % 41) - 20);
  return v;
}

TEST(NcclCommunicator, OneRankRunsEveryCollective) {
  SF_NEED_NCCL_GPUS(1);
  NcclCommunicator comm(*lib, lib->unique_id(), 1, 0, 0, kLong);
  std::vector<float> x = integers(1000, 1);
  const auto want = x;
  comm.all_reduce_sum(std::span<float>(x));
  EXPECT_EQ(x, want);
  std::vector<double> d{1.25, -3.5, 1e300};
  comm.all_reduce_sum(std::span<double>(d));
  EXPECT_EQ(d, (std::vector<double>{1.25, -3.5, 1e300}));
  std::vector<float> shard(7, -1.0f);
  comm.reduce_scatter_sum(std::span<const float>(want.data(), 7), shard);
  EXPECT_EQ(shard, std::vector<float>(want.begin(), want.begin() + 7));
  std::vector<float> out(7, -1.0f);
  comm.all_gather(shard, out);
  EXPECT_EQ(out, shard);
  std::vector<std::byte> bytes(5, std::byte(9));
  comm.broadcast(bytes, 0);
  EXPECT_EQ(bytes, std::vector<std::byte>(5, std::byte(9)));
  comm.barrier();
}

TEST(NcclCommunicator, OneRankPerGpuSumsExactly) {
  SF_NEED_NCCL_GPUS(2);
  const int world = std::min(gpu_count(), 4);
  const NcclUniqueId id = lib->unique_id();
  const size_t n = 13;  // uneven over 2, 3 and 4 ranks
  std::vector<std::vector<float>> in;
  for (int r = 0; r < world; ++r) in.push_back(integers(n, r));
  std::vector<float> sum(n, 0.0f);
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < n; ++i) sum[i] += in[size_t(r)][i];
  std::vector<std::vector<float>> reduced(world), shards(world), gathered(world);
  std::vector<double> norms(world);
  const auto errors = test::run_ranks(world, [&](int r) {
    NcclCommunicator comm(*lib, id, world, r, r, kLong);
    reduced[size_t(r)] = in[size_t(r)];
    comm.all_reduce_sum(std::span<float>(reduced[size_t(r)]));
    shards[size_t(r)].assign(shard_range(n, world, r).size(), -1.0f);
    comm.reduce_scatter_sum(in[size_t(r)], shards[size_t(r)]);
    gathered[size_t(r)].assign(n, -1.0f);
    comm.all_gather(shards[size_t(r)], gathered[size_t(r)]);
    double sq = double(r + 1);
    comm.all_reduce_sum(std::span<double>(&sq, 1));
    norms[size_t(r)] = sq;
    comm.barrier();
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[size_t(r)], "") << "rank " << r;
    EXPECT_EQ(reduced[size_t(r)], sum) << "rank " << r;
    const ShardRange s = shard_range(n, world, r);
    EXPECT_EQ(shards[size_t(r)], std::vector<float>(sum.begin() + long(s.begin), sum.begin() + long(s.end)));
    EXPECT_EQ(gathered[size_t(r)], sum) << "rank " << r;
    EXPECT_EQ(norms[size_t(r)], world * (world + 1) / 2.0);
  }
}

// Last in the file: the abandoned formation's thread stays blocked until the process exits.
TEST(NcclCommunicator, ARankThatNeverJoinsTimesTheFormationOut) {
  SF_NEED_NCCL_GPUS(1);
  try {
    NcclCommunicator comm(*lib, lib->unique_id(), 2, 0, 0, Timeout(3000));  // rank 1 never comes
    FAIL() << "formed without rank 1";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::io);
    EXPECT_NE(std::string(e.what()).find("did not form within 3000 ms"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace sf::dist
#endif  // SF_DIST_CUDA
