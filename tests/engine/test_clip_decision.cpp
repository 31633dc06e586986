// The clip/skip decision (engine/clip_decision.h) on its own: norm below / at / above the
// limit, clipping off, zero and non-finite gradients; the speculation gates; the step
// counter; and, through every executor, that a skipped step leaves the counter where it was
// while a taken one advances it by exactly one.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "backend/host/host_backend.h"
#include "core/error.h"
#include "engine/clip_decision.h"
#include "engine/device_resident_executor.h"
#include "engine/resident_executor.h"
#include "engine/sliding_executor.h"
#include "model/model_init.h"
#include "model/model_presets.h"

using namespace sf;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// torch's clip_grad_norm_ coefficient, written out here independently of grad_norm.cpp.
float torch_coef(double norm, double max) { return float(std::min(1.0, max / (norm + 1e-6))); }

TEST(ClipDecision, BelowTheLimitIsUnclipped) {
  const ClipDecision d = decide_clip(0.25, 1.0f);  // norm 0.5
  EXPECT_EQ(d.norm, 0.5);  // sqrt of an exact square: exact
  EXPECT_EQ(d.coef, 1.0f);
  EXPECT_FALSE(d.skip);
}

TEST(ClipDecision, AboveTheLimitScalesToIt) {
  const ClipDecision d = decide_clip(16.0, 2.0f);  // norm 4, limit 2
  EXPECT_EQ(d.norm, 4.0);
  EXPECT_FALSE(d.skip);
  EXPECT_EQ(d.coef, torch_coef(4.0, 2.0));  // bitwise: the same double ops, one rounding
  EXPECT_LT(d.coef, 0.5f);                  // 2 / (4 + 1e-6) rounds below one half
  EXPECT_GT(d.coef, 0.4999f);
}

// At exactly the limit torch still scales, by max / (max + 1e-6): 1 - 1e-6 is representable
// apart from 1 in float (spacing 6e-8 below 1), so the coefficient is not 1.
TEST(ClipDecision, AtTheLimitScalesByTheEpsilon) {
  const ClipDecision d = decide_clip(1.0, 1.0f);
  EXPECT_EQ(d.norm, 1.0);
  EXPECT_FALSE(d.skip);
  EXPECT_EQ(d.coef, torch_coef(1.0, 1.0));
  EXPECT_LT(d.coef, 1.0f);
}

TEST(ClipDecision, ZeroOrNegativeLimitTurnsClippingOff) {
  for (float max : {0.0f, -1.0f}) {
    SCOPED_TRACE(max);
    const ClipDecision d = decide_clip(1e12, max);
    EXPECT_EQ(d.norm, 1e6);
    EXPECT_EQ(d.coef, 1.0f);
    EXPECT_FALSE(d.skip);
  }
}

TEST(ClipDecision, ZeroGradientIsUnclipped) {
  const ClipDecision d = decide_clip(0.0, 1.0f);
  EXPECT_EQ(d.norm, 0.0);
  EXPECT_EQ(d.coef, 1.0f);
  EXPECT_FALSE(d.skip);
}

// Skip means a non-finite norm, clipping on or off; the coefficient then reads 0 (never the
// NaN clip_coefficient gives, which AdamW would refuse).
TEST(ClipDecision, NonFiniteNormSkipsTheStep) {
  for (double sumsq : {kInf, kNaN}) {
    for (float max : {1.0f, 0.0f}) {
      SCOPED_TRACE(testing::Message() << "sumsq " << sumsq << ", max " << max);
      const ClipDecision d = decide_clip(sumsq, max);
      EXPECT_TRUE(d.skip);
      EXPECT_EQ(d.coef, 0.0f);
      EXPECT_FALSE(std::isfinite(d.norm));
      EXPECT_EQ(std::isnan(d.norm), std::isnan(sumsq));
    }
  }
  // The largest finite sum is not skipped: its coefficient underflows float to 0, an update
  // of decay and moments only (as torch would do).
  const ClipDecision big = decide_clip(std::numeric_limits<double>::max(), 1.0f);
  EXPECT_FALSE(big.skip);
  EXPECT_EQ(big.coef, torch_coef(std::sqrt(std::numeric_limits<double>::max()), 1.0));
}

TEST(ClipDecision, ReportsNormAndCoefficient) {
  StepStats st;
  decide_clip(16.0, 2.0f).report(st);
  EXPECT_EQ(st.grad_norm, 4.0);
  EXPECT_EQ(st.clip_coef, double(torch_coef(4.0, 2.0)));
  decide_clip(kInf, 2.0f).report(st);
  EXPECT_FALSE(std::isfinite(st.grad_norm));
  EXPECT_EQ(st.clip_coef, 0.0);
}

TEST(MaySpeculate, WhileTheNormSoFarStaysBelowTheLimit) {
  EXPECT_TRUE(may_speculate(0.0, 1.0f));
  EXPECT_TRUE(may_speculate(0.25, 1.0f));
  // Within 1e-6 of the limit the coefficient could already be below 1.
  EXPECT_FALSE(may_speculate(0.9999995 * 0.9999995, 1.0f));
  EXPECT_FALSE(may_speculate(1.0, 1.0f));
  EXPECT_FALSE(may_speculate(4.0, 1.0f));
  // Clipping off: any finite sum.
  EXPECT_TRUE(may_speculate(1e300, 0.0f));
  EXPECT_TRUE(may_speculate(1e300, -2.0f));
  // The tests' speculate-everything ignores the limit, not finiteness.
  EXPECT_TRUE(may_speculate(4.0, 1.0f, true));
  for (double bad : {kInf, kNaN})
    for (bool ignore : {false, true}) {
      EXPECT_FALSE(may_speculate(bad, 1.0f, ignore));
      EXPECT_FALSE(may_speculate(bad, 0.0f, ignore));
    }
}

// Whenever the gate lets phase A speculate with the full step's sum, the decision agrees that
// the coefficient is 1 (the gate never speculates what the decision would clip at once).
TEST(MaySpeculate, AgreesWithTheDecision) {
  std::mt19937_64 g(1616);
  std::uniform_real_distribution<double> norm(0.0, 3.0);
  int allowed = 0, refused = 0;
  for (int i = 0; i < 20000; ++i) {
    const double n = norm(g);
    const float max = (i % 5 == 0) ? 0.0f : float(norm(g));
    const double sumsq = n * n;
    const ClipDecision d = decide_clip(sumsq, max);
    if (may_speculate(sumsq, max)) {
      ++allowed;
      ASSERT_EQ(d.coef, 1.0f) << "norm " << n << ", max " << max;
    } else {
      ++refused;
      ASSERT_GT(max, 0.0f);  // clipping off always allows
    }
  }
  EXPECT_GT(allowed, 1000);  // both branches really ran
  EXPECT_GT(refused, 1000);
}

TEST(StepMaySpeculate, OnlyWithNonZeroBetas) {
  OptimHyper h;
  EXPECT_TRUE(step_may_speculate(h));
  h.beta1 = 0;
  EXPECT_FALSE(step_may_speculate(h));
  h.beta1 = 0.9f;
  h.beta2 = 0;
  EXPECT_FALSE(step_may_speculate(h));
}

TEST(StepCounter, NextStepIsOneBasedAndAdvanceTakesExactlyIt) {
  const ModelLayout layout = ModelLayout::build(model_preset("tiny"));
  ParamStore store(state_units(layout));
  OptimHyper h;
  h.lr = 2e-3;
  h.beta1 = 0.8f;
  h.beta2 = 0.95f;
  h.eps = 1e-6f;
  h.weight_decay = 0.1f;
  store.step = 41;
  const AdamWStep s = next_adamw_step(h, store, 0.25f);
  EXPECT_EQ(store.step, 41);  // peeking does not advance
  EXPECT_EQ(s.step, 42);
  EXPECT_EQ(s.grad_scale, 0.25f);
  EXPECT_EQ(s.lr, float(h.lr));
  EXPECT_EQ(s.beta1, h.beta1);
  EXPECT_EQ(s.beta2, h.beta2);
  EXPECT_EQ(s.eps, h.eps);
  EXPECT_EQ(s.weight_decay, h.weight_decay);
  advance_step(store, s);
  EXPECT_EQ(store.step, 42);
  // The same step twice, or one from another count, is a bug in the executor.
  EXPECT_THROW(advance_step(store, s), Error);
  AdamWStep far = s;
  far.step = 44;
  EXPECT_THROW(advance_step(store, far), Error);
  EXPECT_EQ(store.step, 42);
}

// Packed rows of random tokens, every label valid.
Batch random_batch(const ModelConfig& cfg, int rows, int seq_len, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::vector<int32_t>> r(static_cast<size_t>(rows));
  for (auto& row : r)
    for (int i = 0; i < seq_len; ++i) row.push_back(int32_t(g() % uint64_t(cfg.vocab_size)));
  return Batch::from_rows(r);
}

// Every executor: a taken step advances params().step by one, a step with a non-finite
// gradient (one weight poisoned with inf) leaves it, and training goes on from there.
TEST(StepCounter, EveryExecutorAdvancesOnlyOnTakenSteps) {
  const ModelConfig cfg = tiny_config(Arch::llama, false);
  for (int kind = 0; kind < 4; ++kind) {
    const char* names[] = {"resident", "device-resident", "sliding deferred", "sliding speculative"};
    SCOPED_TRACE(names[kind]);
    HostBackend be;
    std::unique_ptr<StepExecutor> ex;
    if (kind == 0) ex = std::make_unique<ResidentExecutor>(be, cfg, 64);
    if (kind == 1) ex = std::make_unique<DeviceResidentExecutor>(be, cfg, 64);
    if (kind >= 2) {
      EngineConfig ec;
      ec.max_chunk_tokens = 64;
      ec.max_chunks = 2;
      if (kind == 3) ec.speculation = EngineConfig::Speculation::always;
      ex = std::make_unique<SlidingWindowExecutor>(be, cfg, ec);
    }
    const ModelLayout layout = ModelLayout::build(cfg);
    for (int u = 0; u < ex->params().n_units(); ++u)
      init_unit(layout.units[size_t(u)], ex->params().master(u), 3);
    ex->params_changed();
    OptimHyper h;
    h.lr = 1e-3;
    h.max_grad_norm = 1.0f;
    std::vector<Batch> micro = {random_batch(cfg, 2, 10, 4)};

    StepStats st = ex->train_step(micro, h);
    EXPECT_FALSE(std::isnan(st.clip_coef));
    EXPECT_GT(st.clip_coef, 0.0);
    EXPECT_EQ(ex->params().step, 1);

    ParamStore& ps = ex->params();
    const int last = ps.n_units() - 2;  // the last layer
    const float keep = ps.master(last)[3];
    ps.master(last)[3] = std::numeric_limits<float>::infinity();
    ex->params_changed();
    st = ex->train_step(micro, h);
    EXPECT_FALSE(std::isfinite(st.grad_norm));
    EXPECT_EQ(st.clip_coef, 0.0);
    EXPECT_EQ(ex->params().step, 1);  // skipped: not counted

    ex->params().master(last)[3] = keep;
    ex->params_changed();
    st = ex->train_step(micro, h);
    EXPECT_TRUE(std::isfinite(st.grad_norm));
    EXPECT_EQ(ex->params().step, 2);
  }
}

}  // namespace
