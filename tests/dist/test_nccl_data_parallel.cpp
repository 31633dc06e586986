// The data-parallel GPU path of the sliding window (CUDA builds; skipped without a GPU or
// libnccl): one rank over NCCL (world 1) against the plain one-rank engine on the same GPU.
// With one rank the slice is the whole unit and NCCL's reduce-scatter leaves the accumulator as
// it is, so everything the path adds (the padded accumulators, the comm stream and its event,
// the slice's cast, sum of squares and d2h, the slice update through the ring for resident homes,
// the shared-state counters, the embedding's dense reduce and update) must give the plain
// engine's bits: master, m and v after 3 steps, and the losses. Without clipping: the one rank's
// embedding norm is a device f32 sum of its rows, the sharded one a host double sum of the
// dense slice, so the norms agree only closely (checked), and a clipping coefficient could
// differ in its last bit.
#include <gtest/gtest.h>

#if SF_DIST_CUDA
#include <cuda_runtime.h>

#include <cstring>
#include <memory>

#include "backend/cuda/cuda_backend.h"
#include "cuda/cuda_engine_test_util.h"
#include "dist/cuda/nccl_communicator.h"
#include "dist/dist_test_util.h"
#include "engine/data_parallel.h"
#include "engine/sliding_executor.h"
#include "model/model_init.h"

namespace sf::dist {
namespace {

class NcclDataParallel : public ::testing::TestWithParam<int> {};  // resident layer homes

TEST_P(NcclDataParallel, OneRankGivesThePlainEnginesBits) {
  auto lib = test::toolkit_nccl();
  if (!lib) GTEST_SKIP() << "no libnccl.so.2";
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus < 1) GTEST_SKIP() << "no GPU";
  ModelConfig cfg = sf::test::small_config(Arch::llama);  // head_dim 64: the GPU's attention
  cfg.num_hidden_layers = 3;
  const ModelLayout layout = ModelLayout::build(cfg);
  EngineConfig ec;
  ec.n_slots = 2;
  ec.max_chunk_tokens = 64;
  ec.max_chunks = 2;
  ec.head_resident = true;  // required with bf16
  ec.resident_layers = GetParam();
  ec.ring_piece = 777;  // resident homes' slice trips in many pieces
  ec.data_parallel_world = 1;

  NcclCommunicator comm(*lib, lib->unique_id(), 1, 0, 0, Timeout(60000));
  HostArray state(ParamStore::external_bytes(state_units(layout)), "test state");
  HostArray counters(UpdateCounters::bytes_for(int(layout.units.size()), 1), "test counters");
  DataParallel dp;
  dp.comm = &comm;
  dp.counters = UpdateCounters::create(counters.data(), int(layout.units.size()), 1);
  dp.state = {state.data(), state.bytes()};
  dp.device_reduce_scatter = [&](float* data, size_t shard, Stream& s) {
    comm.reduce_scatter_sum_device(data, data + size_t(comm.rank()) * shard, shard,
                                   reinterpret_cast<cudaStream_t>(CudaBackend::cuda_stream(s)));
  };

  CudaBackend be_plain, be_dp;
  SlidingWindowExecutor plain(be_plain, cfg, ec);
  SlidingWindowExecutor ranked(be_dp, cfg, ec, EngineTestModes{}, dp);
  ASSERT_NE(std::string(ranked.name()).find("rank 0 of 1"), std::string::npos) << ranked.name();
  for (int u = 0; u < int(layout.units.size()); ++u) {
    init_unit(layout.units[size_t(u)], plain.params().master(u), 5);
    std::memcpy(ranked.params().master(u), plain.params().master(u), size_t(plain.params().numel(u)) * 4);
  }
  plain.params_changed();
  ranked.params_changed();
  OptimHyper h;
  h.lr = 1e-3;
  h.weight_decay = 0.1f;
  for (int step = 0; step < 3; ++step) {
    std::vector<Batch> micro = {sf::test::random_batch(cfg, 2, 32, uint64_t(10 * step + 1)),
                                sf::test::random_batch(cfg, 2, 32, uint64_t(10 * step + 2))};
    const StepStats a = plain.train_step(micro, h), b = ranked.train_step(micro, h);
    EXPECT_EQ(a.loss_sum, b.loss_sum) << "step " << step;
    // The embedding's share of the norm is summed on the device in f32 there, on the host in
    // double here: a relative 1e-6 (f32 rounding of a sum of squares).
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-6 * a.grad_norm) << "step " << step;
  }
  ParamStore &pa = plain.params(), &pb = ranked.params();
  for (int u = 0; u < pa.n_units(); ++u) {
    const size_t n = size_t(pa.numel(u)) * 4;
    EXPECT_EQ(std::memcmp(pa.master(u), pb.master(u), n), 0) << "master of unit " << u;
    EXPECT_EQ(std::memcmp(pa.m(u), pb.m(u), n), 0) << "m of unit " << u;
    EXPECT_EQ(std::memcmp(pa.v(u), pb.v(u), n), 0) << "v of unit " << u;
  }
}

INSTANTIATE_TEST_SUITE_P(Homes, NcclDataParallel, ::testing::Values(0, 2),
                         [](const auto& info) { return cat("resident_layers", info.param); });

}  // namespace
}  // namespace sf::dist

#endif  // SF_DIST_CUDA
