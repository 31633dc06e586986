// Saved inputs of every 2nd or 3rd layer only (EngineConfig::checkpoint_every) on the GPU: the
// backward replays the forward of each saved layer (and of the unsaved one above it) into the
// activation buffers to give the unsaved layers their inputs. The forward is deterministic, so
// the replayed inputs are the bits the forward computed and the step is the window's that
// saves every input: the losses and every bit of master, m and v agree after 3 steps (bf16, the
// store on the device or the host, one chunk or two per micro-batch, after kept-attention
// layers, deferred or speculative). Deterministic attention as in every test_cuda engine test;
// GEMM tuning off on both backends; no clipping (an ulp of the norm's reduction order).
#include <gtest/gtest.h>

#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "cuda_engine_test_util.h"
#include "cuda_test_util.h"
#include "engine/sliding_executor.h"
#include "model/model_init.h"

using namespace sf;

namespace {

using sf::test::small_config;

TEST(CudaCheckpointEvery, ReplayedInputsGiveTheSavedInputsBits) {
  SF_REQUIRE_GPU();
  struct Case {
    Arch arch;
    int every;        // of 4 layers: 2 saves layers 0 and 2, 3 saves 0 and 3
    bool on_device;   // the activation store's tier
    int64_t chunk;    // 192: each micro-batch of 2 x 96 in one chunk; 96: in two
    int kept;         // kept-attention layers (host store)
    bool speculative;
    int from = 0;     // EngineConfig::strided_from (2: layers 0, 1, 2 saved, 3 replayed)
  };
  for (const Case& tc : {Case{Arch::llama, 2, false, 192, 0, false}, Case{Arch::qwen3, 3, true, 96, 0, false},
                         Case{Arch::llama, 2, false, 96, 1, true}, Case{Arch::qwen3, 2, true, 192, 0, true},
                         Case{Arch::llama, 2, true, 96, 0, true, 2}}) {
    SCOPED_TRACE(cat(arch_name(tc.arch), ", every ", tc.every, tc.on_device ? ", device store" : ", host store",
                     ", chunk ", tc.chunk, ", ", tc.kept, " kept", tc.speculative ? ", speculative" : "",
                     ", from layer ", tc.from));
    ModelConfig cfg = small_config(tc.arch);
    CudaBackend be_a, be_b;
    be_a.set_gemm_tuning(false);
    be_b.set_gemm_tuning(false);
    EngineConfig ec = sf::test::small_window(tc.chunk);
    ec.activations_on_device = tc.on_device;
    ec.kept_attention_layers = tc.kept;
    ec.kept_attention_on_device = false;
    ec.speculation = tc.speculative ? EngineConfig::Speculation::always : EngineConfig::Speculation::off;
    EngineConfig sparse = ec;
    sparse.checkpoint_every = tc.every;
    sparse.strided_from = tc.from;
    SlidingWindowExecutor saving(be_a, cfg, ec), replaying(be_b, cfg, sparse);
    sf::test::expect_same_three_steps(saving, replaying, cfg, 9);
    // The store holds only the saved layers' inputs: less device memory when it is there.
    if (tc.on_device) EXPECT_LT(be_b.peak_bytes_in_use(), be_a.peak_bytes_in_use());
    else EXPECT_LE(be_b.peak_bytes_in_use(), be_a.peak_bytes_in_use());
    std::printf("[ENGINE] every %d layer's input saved from layer %d (%s), chunk %lld: bitwise equal to saving all after 3 steps\n",
                tc.every, tc.from, tc.on_device ? "device" : "host", static_cast<long long>(tc.chunk));
  }
}

}  // namespace
