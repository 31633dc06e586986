// Kept attention (EngineConfig::kept_attention_layers) on the GPU: the sliding window that
// keeps its layers' attention output and lse for the backward (which then skips the
// attention forward) against the same window recomputing it, bf16, the attention store on the
// device and in pinned host memory, one chunk and split chunks. The backward reads the bits
// the forward wrote where the recompute would have written the same bits again (the
// attention forward is deterministic), so the losses and every bit of master, m and v agree,
// as long as the attention backward repeats its bits (our kernels do; cuDNN's only in its
// deterministic form, which test_cuda selects for the whole binary once cuDNN attention is
// in). GEMM tuning is off on both backends (tuned, each may time another tile shape); no
// clipping, so an ulp of the norm's reduction order cannot change an update.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "backend/cuda/cuda_backend.h"
#include "cuda_engine_test_util.h"
#include "cuda_test_util.h"
#include "engine/sliding_executor.h"
#include "model/model_init.h"

using namespace sf;

namespace {

using sf::test::random_batch;
using sf::test::small_config;

TEST(CudaKeptAttention, MatchesTheRecomputingWindowBitwise) {
  SF_REQUIRE_GPU();
  struct KeptCase {
    Arch arch;
    bool on_host;
    int64_t chunk;  // 192: each micro-batch of 2 x 96 in one chunk; 96: in two
    int layers;     // of 4
  };
  for (const KeptCase& kc : {KeptCase{Arch::llama, false, 192, 4}, KeptCase{Arch::llama, true, 96, 4},
                             KeptCase{Arch::qwen3, true, 192, 2}, KeptCase{Arch::qwen3, false, 96, 4}}) {
    SCOPED_TRACE(cat(arch_name(kc.arch), kc.on_host ? ", host store" : ", device store", ", chunk ", kc.chunk,
                     ", ", kc.layers, " layers kept"));
    ModelConfig cfg = small_config(kc.arch);
    CudaBackend be_a, be_b;
    be_a.set_gemm_tuning(false);
    be_b.set_gemm_tuning(false);
    EngineConfig ec;
    ec.n_slots = 2;
    ec.max_chunk_tokens = kc.chunk;
    ec.max_chunks = 4;
    ec.resident_layers = 1;
    ec.head_resident = true;
    ec.ring_piece = 777;
    EngineConfig kept = ec;
    kept.kept_attention_layers = kc.layers;
    kept.kept_attention_on_device = !kc.on_host;
    SlidingWindowExecutor recompute(be_a, cfg, ec), keeping(be_b, cfg, kept);
    ModelLayout layout = ModelLayout::build(cfg);
    for (int u = 0; u < recompute.params().n_units(); ++u) {
      init_unit(layout.units[size_t(u)], recompute.params().master(u), 9);
      init_unit(layout.units[size_t(u)], keeping.params().master(u), 9);
    }
    recompute.params_changed();
    keeping.params_changed();
    OptimHyper h;
    h.lr = 1e-3;
    h.weight_decay = 0.1f;
    h.max_grad_norm = 0.f;
    std::vector<Batch> micro = {random_batch(cfg, 2, 96, 1), random_batch(cfg, 2, 96, 2)};
    for (int step = 0; step < 3; ++step) {
      StepStats a = recompute.train_step(micro, h), b = keeping.train_step(micro, h);
      EXPECT_EQ(a.loss(), b.loss()) << "step " << step;
      // The norm's device reductions may sum in another order: an ulp apart at most.
      EXPECT_NEAR(b.grad_norm, a.grad_norm, 1e-6 * a.grad_norm) << "step " << step;
    }
    ParamStore &pa = recompute.params(), &pb = keeping.params();
    for (int u = 0; u < pa.n_units(); ++u) {
      ASSERT_EQ(0, std::memcmp(pa.master(u), pb.master(u), size_t(pa.numel(u)) * 4)) << "unit " << u;
      ASSERT_EQ(0, std::memcmp(pa.m(u), pb.m(u), size_t(pa.numel(u)) * 4)) << "unit " << u;
      ASSERT_EQ(0, std::memcmp(pa.v(u), pb.v(u), size_t(pa.numel(u)) * 4)) << "unit " << u;
    }
    std::printf("[ENGINE] kept attention %s, chunk %lld, %d layers: bitwise equal to the recompute after 3 steps\n",
                kc.on_host ? "on the host" : "on the device", static_cast<long long>(kc.chunk), kc.layers);
  }
}

}  // namespace
