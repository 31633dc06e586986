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
    const EngineConfig ec = sf::test::small_window(kc.chunk);
    EngineConfig kept = ec;
    kept.kept_attention_layers = kc.layers;
    kept.kept_attention_on_device = !kc.on_host;
    SlidingWindowExecutor recompute(be_a, cfg, ec), keeping(be_b, cfg, kept);
    sf::test::expect_same_three_steps(recompute, keeping, cfg, 9);
    std::printf("[ENGINE] kept attention %s, chunk %lld, %d layers: bitwise equal to the recompute after 3 steps\n",
                kc.on_host ? "on the host" : "on the device", static_cast<long long>(kc.chunk), kc.layers);
  }
}

}  // namespace
