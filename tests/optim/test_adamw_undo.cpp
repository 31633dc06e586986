// AdamW undo and redo (optim/adamw_undo.h): bitwise agreement of every SIMD variant with
// scalar, of scalar undo with the engine's rollback formula and of the fused redo with undo
// followed by adamw_update_ranges; undo(update(x)) restores x within a few ulps; padding is
// not touched; steps that cannot be undone are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/adamw.h"
#include "optim/adamw_undo.h"
#include "test_util.h"

using namespace sf;

namespace sf {
inline void PrintTo(CpuIsa isa, std::ostream* os) { *os << cpu_isa_name(isa); }
}  // namespace sf

namespace {

constexpr uint16_t kSentinel = 0xdead;

// A mid-training step as the engine speculates it: clip coefficient 1.
AdamWStep step_at(int64_t step, float grad_scale = 1.0f) {
  AdamWStep s;
  s.lr = 1e-3f;
  s.weight_decay = 0.1f;
  s.step = step;
  s.grad_scale = grad_scale;
  return s;
}

// Several parameter groups over n elements, decay and no-decay, with padding between them
// (and a chunk boundary inside the big ones), like a unit's layout.
std::vector<ParamRange> ranges_for(int64_t n) {
  if (n < 16) return {{0, n, true}};
  const int64_t a = n / 5, b = n / 2;
  return {{0, a, false}, {a + 3, b - a - 3, true}, {b + 1, n - b - 5, false}, {n - 3, 3, true}};
}

// Gradients of realistic, varied magnitudes: sign * 10^U(-3, 0).
std::vector<float> random_grads(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> e(-3.f, 0.f);
  std::vector<float> g(n);
  for (float& x : g) x = (rng() & 1 ? 1.f : -1.f) * std::pow(10.f, e(rng));
  return g;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& g) {
  std::vector<uint16_t> h(g.size());
  for (size_t i = 0; i < g.size(); ++i) h[i] = f32_to_bf16(g[i]);
  return h;
}

// The optimizer state before the step under test: p ~ U(-0.04, 0.04) (|p| ~ 0.02), m and v
// from `prior` earlier AdamW steps (none: m = v = 0, for step 1). g: the gradient of the
// step under test; gh its bf16 bits.
struct State {
  std::vector<float> p, m, v, g;
  std::vector<uint16_t> gh;
  State(int64_t n, uint64_t seed, int prior) {
    p = test::random_vec(size_t(n), seed, -0.04f, 0.04f);
    m.assign(size_t(n), 0.f);
    v.assign(size_t(n), 0.f);
    const auto ranges = ranges_for(n);
    for (int k = 1; k <= prior; ++k) {
      const auto gk = random_grads(size_t(n), seed * 131 + uint64_t(k));
      adamw_update_ranges(p.data(), m.data(), v.data(), gk.data(), nullptr, n, ranges,
                          step_at(k), nullptr, CpuIsa::scalar);
    }
    g = random_grads(size_t(n), seed * 7 + 1);
    gh = to_bf16(g);
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}
// p, m and v bitwise equal (the gradients are inputs only); names the first that differs.
::testing::AssertionResult same_state(const State& got, const State& want) {
  if (!same_bits(got.p, want.p)) return ::testing::AssertionFailure() << "p differs";
  if (!same_bits(got.m, want.m)) return ::testing::AssertionFailure() << "m differs";
  if (!same_bits(got.v, want.v)) return ::testing::AssertionFailure() << "v differs";
  return ::testing::AssertionSuccess();
}

// Values at the edges of the undo's arithmetic, written into the first slots (each with at
// most one NaN source, so no variant has to choose between two NaN payloads).
void add_edge_cases(std::vector<float>& p, std::vector<float>& m, std::vector<float>& v,
                    std::vector<float>& g) {
  const float nan_a = std::bit_cast<float>(0x7fc01234u), nan_b = std::bit_cast<float>(0xffc00777u);
  const float den = std::numeric_limits<float>::denorm_min();
  struct E {
    float p, m, v, g;
  };
  const E edges[] = {
      {0.01f, 0.001f, 1e-10f, 0.9f},   // (v - (1-b2) g^2) < 0: clamped to +0
      {0.01f, 0.001f, nan_a, 0.1f},    // NaN v: p, p' NaN, v -> +0 (std::max(0, NaN) = 0)
      {0.01f, 0.001f, 1e-6f, nan_b},   // NaN gradient: m NaN, v -> +0
      {nan_a, 0.001f, 1e-6f, 0.1f},    // NaN p propagates alone
      {0.01f, nan_b, 1e-6f, 0.1f},     // NaN m
      {0.01f, -0.f, 0.f, 0.f},         // v = 0: denominator eps; -0 moment
      {0.01f, 0.001f, 1e-6f, 3e30f},   // g * g overflows: v - inf -> -inf -> +0
      {3.4028e38f, 0.5f, 1e-12f, 1e-3f},  // p / decay (0.9999) overflows to inf
      {den, -den, den, -den * 3},      // denormals
      {-0.f, 0.f, 0.f, -0.f},          // signed zeros: v = 0 - 0 stays +0
  };
  for (size_t i = 0; i < std::size(edges) && i < p.size(); ++i) {
    p[i] = edges[i].p;
    m[i] = edges[i].m;
    v[i] = edges[i].v;
    g[i] = edges[i].g;
  }
}

// The engine's first (scalar) rollback arithmetic, transcribed operation for operation (scalar,
// one thread): the reference the optim undo must match bit for bit. (Built, like that file,
// for baseline x86-64, which has no FMA instructions to contract into.)
void rollback_reference(float* p, float* m, float* v, const float* grad, int64_t n,
                        std::span<const ParamRange> ranges, const AdamWStep& s) {
  (void)n;
  for (const ParamRange& r : ranges) {
    const AdamWConstants k = adamw_constants(s, r.decay);
    for (int64_t i = r.offset; i < r.offset + r.numel; ++i) {
      float g = grad[i];
      g *= k.grad_scale;
      const float denom = std::sqrt(v[i]) / k.bc2_sqrt + k.eps;
      const float p_decayed = p[i] + k.step_size * m[i] / denom;
      p[i] = p_decayed / k.decay;
      m[i] = (m[i] - k.one_minus_beta1 * g) / k.beta1;
      v[i] = std::max(0.0f, (v[i] - k.one_minus_beta2 * g * g) / k.beta2);
    }
  }
}

// A bf16 output buffer pre-filled with the sentinel: `aligned` puts element 0 on a 64-byte
// boundary (the SIMD kernels stream it), otherwise 2 bytes past one.
struct OutBuf {
  std::vector<uint16_t> buf;
  uint16_t* ptr = nullptr;
  OutBuf(int64_t n, int mode) {  // mode 0: none, 1: aligned, 2: unaligned
    if (mode == 0) return;
    buf.assign(size_t(n) + 128, kSentinel);
    uint16_t* base = buf.data() + 32 + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) / 2;
    ptr = base + (mode == 2 ? 1 : 0);
  }
  // The n elements and 8 on either side (to see writes out of bounds); empty for mode 0.
  std::vector<uint16_t> window(int64_t n) const {
    if (!ptr) return {};
    return std::vector<uint16_t>(ptr - 8, ptr + n + 8);
  }
};

class AdamWUndoIsa : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (!cpu_isa_supported(GetParam()))
      GTEST_SKIP() << "CPU lacks " << cpu_isa_name(GetParam());
  }
};

const int64_t kSizes[] = {1, 15, 17, 1000, 65536 + 37, 2 * kAdamWChunk + 77};

// Undo on arbitrary (not necessarily reachable) states with edge values: every variant, with
// and without a pool, f32 and bf16 gradients, equals the scalar rollback formula bit for bit,
// and leaves the padding between ranges alone.
TEST_P(AdamWUndoIsa, UndoBitwiseEqualToRollbackFormula) {
  ThreadPool pool1(1), pool3(3);
  const AdamWStep s = step_at(5);
  for (int64_t n : kSizes) {
    const auto ranges = ranges_for(n);
    for (bool bf16_grad : {false, true}) {
      State st(n, 1000 + uint64_t(n), 0);
      st.m = test::random_vec(size_t(n), 7 + uint64_t(n), -0.1f, 0.1f);
      st.v = test::random_vec(size_t(n), 8 + uint64_t(n), 0.f, 0.01f);
      add_edge_cases(st.p, st.m, st.v, st.g);
      if (bf16_grad) {  // the reference reads f32: give it the bf16 values
        st.gh = to_bf16(st.g);
        for (size_t i = 0; i < st.g.size(); ++i) st.g[i] = bf16_to_f32(st.gh[i]);
      }
      State want = st;
      rollback_reference(want.p.data(), want.m.data(), want.v.data(), want.g.data(), n, ranges,
                         s);
      for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool1, &pool3}) {
        SCOPED_TRACE(testing::Message() << "n=" << n << " bf16_grad=" << bf16_grad
                                        << " threads=" << (pool ? pool->size() : 0));
        State got = st;
        if (bf16_grad)
          adamw_undo_ranges(got.p.data(), got.m.data(), got.v.data(), got.gh.data(), n, ranges,
                            s, pool, GetParam());
        else
          adamw_undo_ranges(got.p.data(), got.m.data(), got.v.data(), got.g.data(), n, ranges, s,
                            pool, GetParam());
        // The reference leaves the padding as it was, so equality covers it too.
        ASSERT_TRUE(same_state(got, want));
      }
    }
  }
  // The edge cases did what their comments say (so the comparison above covers them).
  State st(16, 3, 0);
  add_edge_cases(st.p, st.m, st.v, st.g);
  const ParamRange all{0, 16, true};
  adamw_undo_ranges(st.p.data(), st.m.data(), st.v.data(), st.g.data(), 16, {&all, 1}, s,
                    nullptr, GetParam());
  for (int i : {0, 1, 2, 6}) EXPECT_EQ(std::bit_cast<uint32_t>(st.v[size_t(i)]), 0u) << i;
  EXPECT_TRUE(std::isnan(st.p[1]));
  EXPECT_TRUE(std::isnan(st.m[2]));
  EXPECT_EQ(st.p[7], std::numeric_limits<float>::infinity());
}

// Redo: every variant, with and without a pool, f32 and bf16 gradients, bf16 output absent,
// aligned (streamed) or not, equals the scalar undo(done) followed by the scalar
// adamw_update_ranges(redo) bit for bit, bf16 copy and untouched padding included.
TEST_P(AdamWUndoIsa, RedoBitwiseEqualToUndoThenUpdate) {
  ThreadPool pool1(1), pool3(3);
  const AdamWStep done = step_at(4);
  for (float redo_scale : {0.37f, 1.0f}) {
    const AdamWStep again = step_at(4, redo_scale);
    for (int64_t n : kSizes) {
      const auto ranges = ranges_for(n);
      State before(n, 2000 + uint64_t(n), 3);
      add_edge_cases(before.p, before.m, before.v, before.g);
      before.gh = to_bf16(before.g);
      for (bool bf16_grad : {false, true}) {
        // The state after the speculative step.
        State after = before;
        if (bf16_grad)
          adamw_update_ranges(after.p.data(), after.m.data(), after.v.data(), after.gh.data(),
                              nullptr, n, ranges, done, nullptr, CpuIsa::scalar);
        else
          adamw_update_ranges(after.p.data(), after.m.data(), after.v.data(), after.g.data(),
                              nullptr, n, ranges, done, nullptr, CpuIsa::scalar);
        for (int out_mode : {0, 1, 2}) {
          State want = after;
          OutBuf want_out(n, out_mode);
          if (bf16_grad) {
            adamw_undo_ranges(want.p.data(), want.m.data(), want.v.data(), want.gh.data(), n,
                              ranges, done, nullptr, CpuIsa::scalar);
            adamw_update_ranges(want.p.data(), want.m.data(), want.v.data(), want.gh.data(),
                                want_out.ptr, n, ranges, again, nullptr, CpuIsa::scalar);
          } else {
            adamw_undo_ranges(want.p.data(), want.m.data(), want.v.data(), want.g.data(), n,
                              ranges, done, nullptr, CpuIsa::scalar);
            adamw_update_ranges(want.p.data(), want.m.data(), want.v.data(), want.g.data(),
                                want_out.ptr, n, ranges, again, nullptr, CpuIsa::scalar);
          }
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool1, &pool3}) {
            SCOPED_TRACE(testing::Message()
                         << "redo_scale=" << redo_scale << " n=" << n << " bf16_grad="
                         << bf16_grad << " out_mode=" << out_mode
                         << " threads=" << (pool ? pool->size() : 0));
            State got = after;
            OutBuf got_out(n, out_mode);
            if (bf16_grad)
              adamw_redo_ranges(got.p.data(), got.m.data(), got.v.data(), got.gh.data(),
                                got_out.ptr, n, ranges, done, again, pool, GetParam());
            else
              adamw_redo_ranges(got.p.data(), got.m.data(), got.v.data(), got.g.data(),
                                got_out.ptr, n, ranges, done, again, pool, GetParam());
            ASSERT_TRUE(same_state(got, want));
            // The copy of the ranges, sentinels in the padding and around.
            ASSERT_EQ(got_out.window(n), want_out.window(n));
          }
        }
      }
    }
  }
}

// The one-pass update + redo gives the bits of the update (written out) followed by the redo:
// the engine relies on it so that a clipped step's result does not depend on which units were
// updated speculatively.
TEST_P(AdamWUndoIsa, UpdateRedoBitwiseEqualToUpdateThenRedo) {
  ThreadPool pool3(3);
  const AdamWStep done = step_at(4);
  for (float redo_scale : {0.37f, 1.0f}) {
    const AdamWStep again = step_at(4, redo_scale);
    for (int64_t n : kSizes) {
      const auto ranges = ranges_for(n);
      State before(n, 3000 + uint64_t(n), 3);
      add_edge_cases(before.p, before.m, before.v, before.g);
      before.gh = to_bf16(before.g);
      for (bool bf16_grad : {false, true}) {
        for (int out_mode : {0, 1, 2}) {
          State want = before;
          OutBuf want_out(n, out_mode);
          if (bf16_grad) {
            adamw_update_ranges(want.p.data(), want.m.data(), want.v.data(), want.gh.data(),
                                nullptr, n, ranges, done, nullptr, CpuIsa::scalar);
            adamw_redo_ranges(want.p.data(), want.m.data(), want.v.data(), want.gh.data(),
                              want_out.ptr, n, ranges, done, again, nullptr, CpuIsa::scalar);
          } else {
            adamw_update_ranges(want.p.data(), want.m.data(), want.v.data(), want.g.data(),
                                nullptr, n, ranges, done, nullptr, CpuIsa::scalar);
            adamw_redo_ranges(want.p.data(), want.m.data(), want.v.data(), want.g.data(),
                              want_out.ptr, n, ranges, done, again, nullptr, CpuIsa::scalar);
          }
          for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &pool3}) {
            SCOPED_TRACE(testing::Message() << "redo_scale=" << redo_scale << " n=" << n
                                            << " bf16_grad=" << bf16_grad
                                            << " out_mode=" << out_mode);
            State got = before;
            OutBuf got_out(n, out_mode);
            if (bf16_grad)
              adamw_update_redo_ranges(got.p.data(), got.m.data(), got.v.data(), got.gh.data(),
                                       got_out.ptr, n, ranges, done, again, pool, GetParam());
            else
              adamw_update_redo_ranges(got.p.data(), got.m.data(), got.v.data(), got.g.data(),
                                       got_out.ptr, n, ranges, done, again, pool, GetParam());
            ASSERT_TRUE(same_state(got, want));
            ASSERT_EQ(got_out.window(n), want_out.window(n));
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, AdamWUndoIsa,
                         ::testing::Values(CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512),
                         [](const auto& info) { return std::string(cpu_isa_name(info.param)); });

// Largest |got - orig| / (2^-22 (|orig| + |after|)) over the ranges, for one array. The bound, per element: for x in {p, m, v} the update computes
// x1 = fl(fl(a*x0) - t) or fl(fl(a*x0) + t) (a = decay or beta, t the step's term) and the
// undo, recomputing the very same t (and, for p, the same denominator, from the same v1),
// gives fl(fl(x1 -/+ t) / a). With unit roundoff u = 2^-24 per operation that is
// x0 (1 + 3u) + u |x1| / a to first order; a >= 0.9 here, so the error is at most
// 3u |x0| + 1.12u |x1| < 4u (|x0| + |x1|) = 2^-22 (|x0| + |x1|): a few ulps of the larger of
// the values before and after the step (more relative to x0 only when the step itself
// dwarfs x0, where x0 is cancelled out of x1).
double worst_ratio(const std::vector<float>& got, const std::vector<float>& orig,
                   const std::vector<float>& after, std::span<const ParamRange> ranges) {
  double worst = 0;
  for (const ParamRange& r : ranges)
    for (int64_t i = r.offset; i < r.offset + r.numel; ++i) {
      const size_t j = size_t(i);
      const double bound = std::ldexp(std::abs(double(orig[j])) + std::abs(double(after[j])), -22);
      worst = std::max(worst, std::abs(double(got[j]) - double(orig[j])) / bound);
    }
  return worst;
}

// undo(update(x)) gives x back within the bound above, for realistic states (a few prior
// steps, step >= 2) and at step 1, where m = v = 0 come back exactly (m1 = fl(0 + t) = t and
// fl(t - t) = +0), f32 and bf16 gradients, decay and no-decay ranges, scalar and the best ISA.
TEST(AdamWUndo, UndoOfUpdateRestoresTheState) {
  ThreadPool pool(3);
  const int64_t n = 65536 + 37;
  const auto ranges = ranges_for(n);
  for (int prior : {0, 1, 4}) {
    for (bool bf16_grad : {false, true}) {
      for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::automatic}) {
        SCOPED_TRACE(testing::Message() << "step=" << prior + 1 << " bf16_grad=" << bf16_grad
                                        << " isa=" << cpu_isa_name(isa));
        const State orig(n, 3000 + uint64_t(prior), prior);
        const AdamWStep s = step_at(prior + 1);
        State after = orig;
        if (bf16_grad)
          adamw_update_ranges(after.p.data(), after.m.data(), after.v.data(), after.gh.data(),
                              nullptr, n, ranges, s, &pool, isa);
        else
          adamw_update_ranges(after.p.data(), after.m.data(), after.v.data(), after.g.data(),
                              nullptr, n, ranges, s, &pool, isa);
        State got = after;
        if (bf16_grad)
          adamw_undo_ranges(got.p.data(), got.m.data(), got.v.data(), got.gh.data(), n, ranges,
                            s, &pool, isa);
        else
          adamw_undo_ranges(got.p.data(), got.m.data(), got.v.data(), got.g.data(), n, ranges, s,
                            &pool, isa);
        EXPECT_LE(worst_ratio(got.p, orig.p, after.p, ranges), 1.0);
        EXPECT_LE(worst_ratio(got.m, orig.m, after.m, ranges), 1.0);
        EXPECT_LE(worst_ratio(got.v, orig.v, after.v, ranges), 1.0);
        if (prior == 0) {
          EXPECT_TRUE(same_bits(got.m, orig.m));  // +0 everywhere, padding included
          EXPECT_TRUE(same_bits(got.v, orig.v));
        }
        // The step did move everything (so the checks above can fail)...
        EXPECT_GT(worst_ratio(after.p, orig.p, after.p, ranges), 100.0);
        EXPECT_GT(worst_ratio(after.m, orig.m, after.m, ranges), 100.0);
        // ...and undoing it with a different clip coefficient leaves a far larger error.
        State wrong = after;
        AdamWStep ws = s;
        ws.grad_scale = 0.999f;
        adamw_undo_ranges(wrong.p.data(), wrong.m.data(), wrong.v.data(), wrong.g.data(), n,
                          ranges, ws, &pool, isa);
        EXPECT_GT(worst_ratio(wrong.m, orig.m, after.m, ranges), 100.0);
      }
    }
  }
}

// redo(done, done) is an undo and the same update again: back where it started, within
// twice the round trip's bound (relative to the state before and after `done`): the undo's
// error passes through an update whose factors are <= 1, which adds its own rounding of the
// slightly different inputs (about an ulp of the result).
TEST(AdamWUndo, RedoWithTheSameStepIsNearlyANoOp) {
  const int64_t n = 4099;
  const auto ranges = ranges_for(n);
  State st(n, 77, 3);
  const State before = st;
  const AdamWStep s = step_at(4);
  adamw_update_ranges(st.p.data(), st.m.data(), st.v.data(), st.g.data(), nullptr, n, ranges, s,
                      nullptr);
  const State after = st;
  std::vector<uint16_t> out(size_t(n), kSentinel);
  adamw_redo_ranges(st.p.data(), st.m.data(), st.v.data(), st.g.data(), out.data(), n, ranges, s,
                    s, nullptr);
  EXPECT_LE(worst_ratio(st.p, after.p, before.p, ranges), 2.0);
  EXPECT_LE(worst_ratio(st.m, after.m, before.m, ranges), 2.0);
  EXPECT_LE(worst_ratio(st.v, after.v, before.v, ranges), 2.0);
  for (const ParamRange& r : ranges)
    for (int64_t i = r.offset; i < r.offset + r.numel; ++i)
      ASSERT_EQ(out[size_t(i)], f32_to_bf16(st.p[size_t(i)])) << i;
}

// A zero beta (or a decay factor of 0) makes the step non-invertible: refused with
// Error(internal) before anything is written; a zero beta in the redo step itself is fine.
TEST(AdamWUndo, RefusesStepsThatCannotBeUndone) {
  const int64_t n = 33;
  const auto ranges = ranges_for(n);
  State st(n, 5, 2);
  const State orig = st;
  auto expect_refused = [&](const AdamWStep& done, const char* what) {
    SCOPED_TRACE(what);
    try {
      adamw_undo_ranges(st.p.data(), st.m.data(), st.v.data(), st.g.data(), n, ranges, done,
                        nullptr);
      ADD_FAILURE() << "undo accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::internal) << e.what();
    }
    EXPECT_THROW(adamw_redo_ranges(st.p.data(), st.m.data(), st.v.data(), st.gh.data(), nullptr,
                                   n, ranges, done, step_at(3), nullptr),
                 Error);
    EXPECT_TRUE(same_bits(st.p, orig.p));
    EXPECT_TRUE(same_bits(st.m, orig.m));
    EXPECT_TRUE(same_bits(st.v, orig.v));
  };
  AdamWStep s = step_at(3);
  s.beta1 = 0.f;
  expect_refused(s, "beta1 = 0");
  s = step_at(3);
  s.beta2 = 0.f;
  expect_refused(s, "beta2 = 0");
  s = step_at(3);
  s.lr = 1.f;
  s.weight_decay = 1.f;  // decay = 1 - lr * wd = 0
  expect_refused(s, "decay 0");
  // ... which only matters where a range decays.
  const ParamRange plain{0, n, false};
  EXPECT_NO_THROW(adamw_undo_ranges(st.p.data(), st.m.data(), st.v.data(), st.g.data(), n,
                                    {&plain, 1}, s, nullptr));
  // Invalid steps are refused as by adamw_update (step 0, NaN grad_scale).
  s = step_at(3);
  s.step = 0;
  EXPECT_THROW(adamw_undo_ranges(st.p.data(), st.m.data(), st.v.data(), st.g.data(), n, ranges,
                                 s, nullptr),
               Error);
  AdamWStep again = step_at(3);
  again.grad_scale = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(adamw_redo_ranges(st.p.data(), st.m.data(), st.v.data(), st.g.data(), nullptr, n,
                                 ranges, step_at(3), again, nullptr),
               Error);
  // The redo step may have a zero beta (it is applied, not undone).
  again = step_at(3);
  again.beta1 = 0.f;
  EXPECT_NO_THROW(adamw_redo_ranges(st.p.data(), st.m.data(), st.v.data(), st.g.data(), nullptr,
                                    n, ranges, step_at(3), again, nullptr));
  const std::vector<ParamRange> outside = {{30, 5, true}};
  EXPECT_THROW(adamw_undo_ranges(st.p.data(), st.m.data(), st.v.data(), st.g.data(), n, outside,
                                 step_at(3), nullptr),
               Error);
}

}  // namespace
