// The sliding-window engine on the GPU: bf16 compute, homes on the device and in pinned host
// memory, three streams. Checked against the plain resident step on the same GPU: same loss
// trajectory and the same weight updates up to bf16 gradient rounding (the engine stores
// gradients in bf16 homes, the resident step keeps them in f32).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "backend/cuda/cuda_backend.h"
#include "cuda_engine_test_util.h"
#include "cuda_test_util.h"
#include "engine/resident_executor.h"
#include "engine/sliding_executor.h"
#include "model/model_init.h"

using namespace sf;

namespace {

using sf::test::random_batch;
using sf::test::small_config;

struct EngineCase {
  Arch arch;
  bool tied;
  int resident_layers;
  bool acts_on_device;
  bool speculative = false;
  int next_units = -1;  // units with a "next" buffer (-1 all): the rest update after the backward
  bool spec_all = false;   // phase A speculates every unit it can (deterministic redo coverage)
  int dev_adamw = 0;  // the first layers' master, m, v and AdamW on the device
  bool grads_stream = false;  // EngineConfig::grads_stream (the default; off: the older path)
};

class CudaEngine : public ::testing::TestWithParam<EngineCase> {};

TEST_P(CudaEngine, MatchesResidentStep) {
  SF_REQUIRE_GPU();
  const EngineCase tc = GetParam();
  ModelConfig cfg = small_config(tc.arch, tc.tied);
  const int rows = 2, seq = 96;
  CudaBackend be_ref, be_eng;
  ResidentExecutor ref(be_ref, cfg, rows * seq);
  EngineConfig ec;
  ec.n_slots = 2;
  ec.max_chunk_tokens = seq;  // each micro-batch splits into 2 chunks
  ec.max_chunks = 4;
  ec.activations_on_device = tc.acts_on_device;
  ec.resident_layers = tc.resident_layers;
  ec.head_resident = true;
  // always: every step speculates, so the clipping cases exercise the redo.
  ec.speculation = tc.speculative ? EngineConfig::Speculation::always : EngineConfig::Speculation::off;
  ec.next_units = tc.next_units;
  EngineTestModes test;
  test.speculate_everything = tc.spec_all;
  ec.device_adamw_layers = tc.dev_adamw;
  ec.grads_stream = tc.grads_stream;
  ec.ring_piece = 777;  // device homes' update trips in many pieces (odd size: ragged last one)
  SlidingWindowExecutor eng(be_eng, cfg, ec, test);
  ModelLayout layout = ModelLayout::build(cfg);
  std::vector<std::vector<float>> w0;
  for (int u = 0; u < ref.params().n_units(); ++u) {
    init_unit(layout.units[size_t(u)], ref.params().master(u), 5);
    init_unit(layout.units[size_t(u)], eng.params().master(u), 5);
    w0.emplace_back(ref.params().master(u), ref.params().master(u) + ref.params().numel(u));
  }
  ref.params_changed();
  eng.params_changed();
  OptimHyper h;
  h.lr = 1e-3;
  h.max_grad_norm = 1.0f;
  std::vector<Batch> micro = {random_batch(cfg, rows, seq, 1), random_batch(cfg, rows, seq, 2)};
  for (int step = 0; step < 4; ++step) {
    StepStats a = ref.train_step(micro, h);
    StepStats b = eng.train_step(micro, h);
    // bf16 compute on both sides; only gradient storage precision differs: 2e-3 relative.
    EXPECT_NEAR(b.loss(), a.loss(), 2e-3 * a.loss()) << "step " << step;
    EXPECT_NEAR(b.grad_norm, a.grad_norm, 2e-2 * a.grad_norm) << "step " << step;
    std::printf("[ENGINE] step %d loss resident %.5f sliding %.5f gnorm %.4f %.4f\n", step,
                a.loss(), b.loss(), a.grad_norm, b.grad_norm);
  }
  // The updates agree: relative L2 of (sliding - resident) against the resident update.
  double num = 0, den = 0;
  for (int u = 0; u < ref.params().n_units(); ++u)
    for (int64_t i = 0; i < ref.params().numel(u); ++i) {
      double a = ref.params().master(u)[i], b = eng.params().master(u)[i], o = w0[size_t(u)][size_t(i)];
      ASSERT_TRUE(std::isfinite(b));
      num += (a - b) * (a - b);
      den += (a - o) * (a - o);
    }
  double rel = std::sqrt(num / den);
  std::printf("[ERR] engine %s tied=%d resident=%d speculative=%d dev_adamw=%d: weight-update rel L2 %.3e\n",
              std::string(arch_name(tc.arch)).c_str(), tc.tied, tc.resident_layers,
              tc.speculative, tc.dev_adamw, rel);
  // AdamW normalises each element's step, so bf16 gradient rounding moves tiny-gradient
  // elements by a visible fraction of lr; the bulk of the update must agree.
  EXPECT_LT(rel, 0.1);
  EXPECT_LE(be_eng.peak_bytes_in_use(), be_ref.peak_bytes_in_use() * 4);
}

// Weights from the fp32 master (cast on the device, each gradient applied as it lands) with
// one layer gradient buffer against the same window with host copies: the same bf16 weights
// reach the slots and the same gradients the same AdamW, so every bit of the state agrees.
TEST(CudaEngineFromMaster, MatchesTheWindowWithHostCopiesBitwise) {
  SF_REQUIRE_GPU();
  for (bool tied : {false, true}) {
    ModelConfig cfg = small_config(tied ? Arch::qwen3 : Arch::llama, tied);
    const int seq = 96;  // the helper's micro-batches: 2 x 96, one chunk each
    CudaBackend be_a, be_b;
    EngineConfig ec;
    ec.n_slots = 2;
    ec.max_chunk_tokens = seq;
    ec.max_chunks = 4;
    ec.head_resident = true;
    ec.ring_piece = 777;  // the master's pieces through the stage: many, the last one ragged
    SlidingWindowExecutor copies(be_a, cfg, ec);
    ec.host_weights = EngineConfig::HostWeights::master;
    ec.layer_grad_buffers = 1;
    SlidingWindowExecutor master(be_b, cfg, ec);
    sf::test::expect_same_three_steps(copies, master, cfg, 5);
    std::printf("[ENGINE] from the master, tied=%d: bitwise equal to host copies after 3 steps\n", tied);
  }
}

// In a clipped speculative step only the units phase A could speculate (those with a `next`
// buffer, and the embedding) get the speculated-and-redone bits; the others get the plain
// update: the bits of a deferred executor. (The host backend computes in f32, where every
// unit can be speculated without a `next` buffer, so only the GPU shows this.)
TEST(CudaEngineClipped, UnitsWithoutNextGetThePlainUpdate) {
  SF_REQUIRE_GPU();
  for (bool everything : {false, true}) {
    SCOPED_TRACE(everything ? "phase A takes every unit" : "phase A stops at the backward's end");
    ModelConfig cfg = small_config(Arch::llama, false);
    CudaBackend be_a, be_b;
    be_a.set_gemm_tuning(false);  // the heuristic's GEMMs on both: the same bits
    be_b.set_gemm_tuning(false);
    EngineConfig ec;
    ec.n_slots = 2;
    ec.max_chunk_tokens = 96;
    ec.max_chunks = 4;
    ec.resident_layers = 1;
    ec.head_resident = true;
    ec.ring_piece = 777;
    EngineConfig spec = ec;
    spec.speculation = EngineConfig::Speculation::always;
    spec.next_units = 1;  // layer 0 only
    EngineTestModes test;
    test.speculate_everything = everything;
    SlidingWindowExecutor a(be_a, cfg, spec, test), b(be_b, cfg, ec);
    ModelLayout layout = ModelLayout::build(cfg);
    for (int u = 0; u < a.params().n_units(); ++u) {
      init_unit(layout.units[size_t(u)], a.params().master(u), 7);
      init_unit(layout.units[size_t(u)], b.params().master(u), 7);
    }
    a.params_changed();
    b.params_changed();
    OptimHyper h;
    h.lr = 1e-3;
    h.max_grad_norm = 1e-3f;  // every step clips
    std::vector<Batch> micro = {random_batch(cfg, 2, 96, 3)};
    StepStats sa = a.train_step(micro, h), sb = b.train_step(micro, h);
    ASSERT_LT(sa.clip_coef, 1.0);
    ASSERT_EQ(sa.grad_norm, sb.grad_norm);
    ParamStore &pa = a.params(), &pb = b.params();
    for (int u = 2; u < pa.n_units(); ++u) {  // layers 1-3 and the head: no `next`
      SCOPED_TRACE(cat("unit ", u));
      const size_t bytes = size_t(pa.numel(u)) * 4;
      EXPECT_EQ(std::memcmp(pa.master(u), pb.master(u), bytes), 0);
      EXPECT_EQ(std::memcmp(pa.m(u), pb.m(u), bytes), 0);
      EXPECT_EQ(std::memcmp(pa.v(u), pb.v(u), bytes), 0);
    }
  }
}

// A compact state speculates without undo (HostUpdater::finish_compact): phase A writes only
// the weights into `next`, a kept step takes them and commits the state behind the round, a
// clipped step runs the plain update. Either way every bit of the state and every loss must be
// the deferred window's (the same arithmetic on the same inputs), in each compact format, with
// phase A stopping at the backward's end or taking every unit; kept steps first, then clipped.
TEST(CudaEngineCompact, SpeculationGivesTheDeferredBits) {
  SF_REQUIRE_GPU();
  const StateFormat formats[] = {{MomentFormat::int8, MasterFormat::bf16},
                                 {MomentFormat::int8, MasterFormat::f32},
                                 {MomentFormat::bf16, MasterFormat::bf16}};
  for (StateFormat f : formats)
    for (bool everything : {false, true}) {
      SCOPED_TRACE(cat(moment_format_name(f.moments), " moments, ", master_format_name(f.master), " master, ",
                       everything ? "phase A takes every unit" : "phase A stops at the backward's end"));
      ModelConfig cfg = small_config(Arch::llama, false);
      CudaBackend be_a, be_b;
      be_a.set_gemm_tuning(false);  // the heuristic's GEMMs on both: the same bits
      be_b.set_gemm_tuning(false);
      EngineConfig ec;
      ec.state_format = f;
      ec.n_slots = 2;
      ec.max_chunk_tokens = 96;
      ec.max_chunks = 4;
      ec.resident_layers = 1;  // layer 3 resident: no `next`, the plain update
      ec.head_resident = true;
      ec.ring_piece = 777;
      EngineConfig spec = ec;
      spec.speculation = EngineConfig::Speculation::always;
      EngineTestModes test;
      test.speculate_everything = everything;
      SlidingWindowExecutor a(be_a, cfg, spec, test), b(be_b, cfg, ec);
      const int n_units = a.params().n_units();
      ASSERT_TRUE(spec.has_next(1, n_units) && spec.has_next(3, n_units));
      ASSERT_FALSE(spec.has_next(4, n_units) || spec.has_next(0, n_units));
      ModelLayout layout = ModelLayout::build(cfg);
      for (int u = 0; u < n_units; ++u) {
        std::vector<float> w(size_t(a.params().numel(u)), 0.f);
        init_unit(layout.units[size_t(u)], w.data(), 7);
        a.params().write_master_f32(u, w.data());
        b.params().write_master_f32(u, w.data());
      }
      a.params_changed();
      b.params_changed();
      OptimHyper h;
      h.lr = 1e-3;
      h.weight_decay = 0.1f;
      std::vector<Batch> micro = {random_batch(cfg, 2, 96, 3), random_batch(cfg, 2, 96, 4)};
      int kept = 0, clipped = 0;
      for (int step = 0; step < 5; ++step) {
        h.max_grad_norm = step < 3 ? 1e4f : 1e-3f;  // kept (never clips), then every step clips
        StepStats sa = a.train_step(micro, h), sb = b.train_step(micro, h);
        ASSERT_EQ(sa.loss(), sb.loss()) << "step " << step;
        ASSERT_EQ(sa.grad_norm, sb.grad_norm) << "step " << step;
        ASSERT_EQ(sa.clip_coef, sb.clip_coef) << "step " << step;
        if (sa.clip_coef < 1) ++clipped;
        else if (sa.spec_units_left < n_units) ++kept;  // something was speculated and kept
      }
      if (everything) {
        EXPECT_EQ(kept, 3);  // else phase A may close before it takes a unit
      }
      EXPECT_EQ(clipped, 2);
      ParamStore &pa = a.params(), &pb = b.params();
      for (int u = 0; u < n_units; ++u) {
        SCOPED_TRACE(cat("unit ", u));
        const UnitStateView x = pa.state(u), y = pb.state(u);
        const UnitStateLayout& L = pa.layout(u);
        EXPECT_EQ(std::memcmp(x.master, y.master, L.master_bytes), 0);
        EXPECT_EQ(std::memcmp(x.m, y.m, L.moment_bytes), 0);
        EXPECT_EQ(std::memcmp(x.v, y.v, L.moment_bytes), 0);
        if (L.scale_count > 0) {
          EXPECT_EQ(std::memcmp(x.m_scale, y.m_scale, size_t(L.scale_count) * 4), 0);
          EXPECT_EQ(std::memcmp(x.v_scale, y.v_scale, size_t(L.scale_count) * 4), 0);
        }
      }
      std::printf("[ENGINE] compact speculation (%s/%s, everything=%d): %d kept, %d clipped steps, the deferred bits\n",
                  moment_format_name(f.moments), master_format_name(f.master), everything, kept, clipped);
    }
}

INSTANTIATE_TEST_SUITE_P(Engine, CudaEngine,
                         ::testing::Values(EngineCase{Arch::llama, false, 0, false},
                                           EngineCase{Arch::qwen3, true, 2, true},
                                           EngineCase{Arch::qwen2, false, 4, false},
                                           EngineCase{Arch::mistral, true, 1, false},
                                           EngineCase{Arch::llama, false, 2, false, true},
                                           EngineCase{Arch::qwen3, true, 0, true, true},
                                           EngineCase{Arch::llama, false, 2, false, true, 2, true},
                                           EngineCase{Arch::qwen2, false, 0, true, true, -1, true},
                                           EngineCase{Arch::llama, false, 0, false, false, -1, false, 1},
                                           EngineCase{Arch::qwen3, true, 2, false, true, -1, false, 1},
                                           EngineCase{Arch::mistral, false, 1, true, true, -1, true, 1},
                                           EngineCase{Arch::llama, false, 0, false, true, -1, false, 3},
                                           // The grads stream: host homes, resident homes and
                                           // device AdamW, speculative and deferred.
                                           EngineCase{Arch::llama, false, 0, false, true, -1, false, 0, true},
                                           EngineCase{Arch::qwen3, true, 2, true, false, -1, false, 1, true},
                                           EngineCase{Arch::mistral, false, 1, false, true, -1, true, 3, true}),
                         [](const auto& info) {
                           const EngineCase& c = info.param;
                           return cat(arch_name(c.arch), c.tied ? "_tied" : "", "_resident",
                                      c.resident_layers, c.acts_on_device ? "_devacts" : "",
                                      c.speculative ? "_speculative" : "",
                                      c.next_units >= 0 ? cat("_next", c.next_units) : "",
                                      c.spec_all ? "_specall" : "", c.dev_adamw ? cat("_devadamw", c.dev_adamw) : "",
                                      c.grads_stream ? "_gradsstream" : "");
                         });

}  // namespace
