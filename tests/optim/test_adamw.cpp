// AdamW: hand-computed example, bitwise agreement of the SIMD variants with scalar, thread
// count invariance, parameter groups, bf16 gradients and output, argument checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/adamw.h"
#include "test_util.h"

using namespace sf;

namespace sf {
inline void PrintTo(CpuIsa isa, std::ostream* os) { *os << cpu_isa_name(isa); }
}  // namespace sf

namespace {

// The optimizer state of n parameters, seeded: p in [-1, 1), m in [-0.1, 0.1), v in
// [0, 0.01), gradients in [-1, 1), bf16 output pre-filled with a sentinel.
struct State {
  std::vector<float> p, m, v, g;
  std::vector<uint16_t> out;
  State(size_t n, uint64_t seed)
      : p(test::random_vec(n, seed, -1.f, 1.f)),
        m(test::random_vec(n, seed + 1, -0.1f, 0.1f)),
        v(test::random_vec(n, seed + 2, 0.f, 0.01f)),
        g(test::random_vec(n, seed + 3, -1.f, 1.f)),
        out(n, 0xdead) {}
  std::vector<uint16_t> g_bf16() const {
    std::vector<uint16_t> h(g.size());
    for (size_t i = 0; i < g.size(); ++i) h[i] = f32_to_bf16(g[i]);
    return h;
  }
  // Gradients rounded to bf16 values, so the f32 and bf16 gradient paths see equal inputs.
  void round_grads_to_bf16() {
    for (float& x : g) x = round_bf16(x);
  }
};

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// A realistic mid-training step with every term active.
AdamWStep some_step() {
  AdamWStep s;
  s.lr = 3e-4f;
  s.weight_decay = 0.1f;
  s.step = 7;
  s.grad_scale = 0.37f;
  return s;
}

// Values where the arithmetic is at its edges; written into the first slots of a State.
void add_edge_cases(State& st) {
  const float den = std::numeric_limits<float>::denorm_min();
  const float edge_g[] = {0.f, -0.f, den, -den * 3, 1e-30f, 3e30f, -1e20f, 1e-20f};
  for (size_t i = 0; i < std::size(edge_g) && i < st.g.size(); ++i) {
    st.g[i] = edge_g[i];
    st.v[i] = i % 2 ? 0.f : st.v[i];  // v = 0: denominator is eps
    st.m[i] = i % 3 ? st.m[i] : 0.f;
  }
  if (st.p.size() > 9) {
    st.p[8] = std::bit_cast<float>(0x7fc01234u);  // quiet NaN with a payload: propagates
    st.p[9] = 3.0e38f;                            // rounds to bf16 infinity
  }
}

void expect_near_rel(const std::vector<float>& got, const std::vector<double>& want,
                     double rel, const char* what) {
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], rel * std::abs(want[i])) << what << "[" << i << "]";
}

}  // namespace

// Two steps of the scalar kernel against values computed in double (Python, from the fp32
// constants): lr 1e-2, betas (0.9, 0.999), eps 1e-8, weight_decay 0.1, grad_scale 0.5.
//   step 1: p0 = 1 * (1 - 1e-3) - 1e-2 * m/(sqrt(v)+eps) with m/sqrt(v) = sign(g) -> 0.989.
TEST(AdamW, HandComputedTwoSteps) {
  std::vector<float> p = {1.0f, -0.5f, 0.25f, 2.0f}, m(4, 0.f), v(4, 0.f);
  const std::vector<float> g1 = {0.1f, -0.2f, 0.3f, 0.0f}, g2 = {-0.05f, 0.4f, 0.3f, 1e-3f};
  std::vector<uint16_t> out(4);
  AdamWStep s;
  s.lr = 1e-2f;
  s.weight_decay = 0.1f;
  s.grad_scale = 0.5f;
  s.step = 1;
  adamw_update(p.data(), m.data(), v.data(), g1.data(), out.data(), 4, s, nullptr,
               CpuIsa::scalar);
  // Tolerances: each value is a handful of fp32 roundings (relative 2^-24 each) away from
  // the double result: m, v within 1e-6 relative; p (|p| <= 2, ulp 2.4e-7) within 1e-6
  // absolute. Any real slip (no decay: 1e-3; no bias correction: 1e-2) is far larger.
  expect_near_rel(m, {0.0050000012666, -0.0100000025332, 0.0150000041723, 0}, 1e-6, "m1");
  expect_near_rel(v, {2.499967888e-06, 9.99987155199e-06, 2.24997121095e-05, 0}, 1e-6, "v1");
  const double p1[] = {0.989000002231, -0.489500001227, 0.239750000892, 1.99800000001};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(p[i], p1[i], 1e-6) << "p1[" << i << "]";

  s.step = 2;
  adamw_update(p.data(), m.data(), v.data(), g2.data(), out.data(), 4, s, nullptr,
               CpuIsa::scalar);
  expect_near_rel(m, {0.00200000038743, 0.0110000030249, 0.0285000075698, 5.00000142958e-05},
                  1e-6, "m2");
  expect_near_rel(v, {3.12245992429e-06, 4.99893580171e-05, 4.49769247967e-05,
                      2.49996805098e-10}, 1e-6, "v2");
  const double p2[] = {0.985347632703, -0.492671536319, 0.229510251783, 1.98856084226};
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(p[i], p2[i], 1e-6) << "p2[" << i << "]";
    EXPECT_EQ(out[i], f32_to_bf16(p[i])) << "bf16 copy of p2[" << i << "]";
  }
}

// The constants are those the header documents (bit-exact, so the GPU kernel can match).
TEST(AdamW, ConstantsFollowTheDocumentedFormula) {
  const AdamWStep s = some_step();
  const AdamWConstants c = adamw_constants(s, true), nd = adamw_constants(s, false);
  EXPECT_EQ(c.one_minus_beta1, 1.0f - s.beta1);
  EXPECT_EQ(c.one_minus_beta2, 1.0f - s.beta2);
  EXPECT_EQ(c.decay, 1.0f - s.lr * s.weight_decay);
  EXPECT_EQ(nd.decay, 1.0f);
  EXPECT_EQ(c.step_size, float(double(s.lr) / (1.0 - std::pow(double(s.beta1), 7.0))));
  EXPECT_EQ(c.bc2_sqrt, float(std::sqrt(1.0 - std::pow(double(s.beta2), 7.0))));
}

class AdamWIsa : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (!cpu_isa_supported(GetParam()))
      GTEST_SKIP() << "CPU lacks " << cpu_isa_name(GetParam());
  }
};

// Every SIMD variant equals scalar bit for bit: odd sizes (tails), f32 and bf16 gradients,
// with and without the bf16 output, edge values (denormals, v = 0, NaN, overflow to inf).
TEST_P(AdamWIsa, BitwiseEqualToScalar) {
  const AdamWStep s = some_step();
  for (int64_t n : {1, 15, 63, 64, 1000003}) {
    for (bool bf16_grad : {false, true}) {
      for (bool with_out : {false, true}) {
        SCOPED_TRACE(testing::Message() << "n=" << n << " bf16_grad=" << bf16_grad
                                        << " out=" << with_out);
        State a(size_t(n), 100 + uint64_t(n));
        add_edge_cases(a);
        State b = a;
        const auto gh = a.g_bf16();
        for (auto [st, isa] : {std::pair{&a, CpuIsa::scalar}, std::pair{&b, GetParam()}}) {
          uint16_t* out = with_out ? st->out.data() : nullptr;
          if (bf16_grad)
            adamw_update(st->p.data(), st->m.data(), st->v.data(), gh.data(), out, n, s,
                         nullptr, isa);
          else
            adamw_update(st->p.data(), st->m.data(), st->v.data(), st->g.data(), out, n, s,
                         nullptr, isa);
        }
        EXPECT_TRUE(same_bits(a.p, b.p));
        EXPECT_TRUE(same_bits(a.m, b.m));
        EXPECT_TRUE(same_bits(a.v, b.v));
        EXPECT_EQ(a.out, b.out);
        if (with_out) {  // and the copy is bf16 of the new weights
          for (size_t i = 0; i < a.p.size(); i += 997) ASSERT_EQ(b.out[i], f32_to_bf16(b.p[i]));
        }
      }
    }
  }
}

// lr = 0 leaves p unchanged (decay 1, step 0), so the bf16 output is exactly the conversion
// of arbitrary f32 bit patterns: ties both ways, denormals, inf, NaNs, near FLT_MAX.
TEST_P(AdamWIsa, Bf16OutputRoundsLikeF32ToBf16) {
  std::vector<uint32_t> bits = {0x3f808000u, 0x3f818000u, 0xbf808000u, 0x3f80ffffu,
                                0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u,
                                0x7fc01234u, 0xffc00001u, 0x00000001u, 0x80008000u,
                                0x00018000u, 0x007fffffu, 0x00000000u, 0x80000000u};
  std::mt19937 rng(7);
  while (bits.size() < 4099) {
    uint32_t u = rng();
    if ((u & 0x7fc00000u) == 0x7f800000u && (u & 0x7fffffu)) continue;  // skip signalling NaN
    if (rng() % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;                 // an exact tie
    bits.push_back(u);
  }
  const size_t n = bits.size();
  State st(n, 5);
  for (size_t i = 0; i < n; ++i) st.p[i] = std::bit_cast<float>(bits[i]);
  AdamWStep s = some_step();
  s.lr = 0.f;
  adamw_update(st.p.data(), st.m.data(), st.v.data(), st.g.data(), st.out.data(),
               int64_t(n), s, nullptr, GetParam());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(st.p[i]), bits[i]) << i;
    ASSERT_EQ(st.out[i], f32_to_bf16(st.p[i])) << std::hex << bits[i];
  }
}

// The bf16 copy is right for any alignment of the output array (the SIMD kernels stream
// aligned outputs with non-temporal stores and store unaligned ones plainly), from threads.
TEST_P(AdamWIsa, Bf16OutputAtAnyAlignment) {
  const int64_t n = 2 * kAdamWChunk + 77;
  ThreadPool pool(3);
  State ref(size_t(n), 81);
  const State orig = ref;
  adamw_update(ref.p.data(), ref.m.data(), ref.v.data(), ref.g.data(), ref.out.data(), n,
               some_step(), nullptr, CpuIsa::scalar);
  std::vector<uint16_t> buf(size_t(n) + 64);
  // Offset 0 of a 64-byte aligned address, then every misalignment of 2..30 bytes.
  uint16_t* base = buf.data() + (64 - reinterpret_cast<uintptr_t>(buf.data()) % 64) / 2;
  for (int shift = 0; shift < 16; ++shift) {
    SCOPED_TRACE(shift);
    State st = orig;
    std::fill(buf.begin(), buf.end(), uint16_t(0xdead));
    adamw_update(st.p.data(), st.m.data(), st.v.data(), st.g.data(), base + shift, n,
                 some_step(), &pool, GetParam());
    ASSERT_TRUE(std::equal(ref.out.begin(), ref.out.end(), base + shift));
    ASSERT_EQ(base[shift + n], 0xdead);  // nothing written past the end
    if (shift > 0) {
      ASSERT_EQ(base[shift - 1], 0xdead);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, AdamWIsa,
                         ::testing::Values(CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512),
                         [](const auto& info) { return std::string(cpu_isa_name(info.param)); });

// bf16 gradients give the same bits as f32 gradients holding the same values.
TEST(AdamW, Bf16GradientEqualsF32Gradient) {
  for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
    if (!cpu_isa_supported(isa)) continue;
    SCOPED_TRACE(cpu_isa_name(isa));
    const int64_t n = 4099;
    State a(n, 21);
    a.round_grads_to_bf16();
    State b = a;
    const auto gh = b.g_bf16();
    adamw_update(a.p.data(), a.m.data(), a.v.data(), a.g.data(), a.out.data(), n, some_step(),
                 nullptr, isa);
    adamw_update(b.p.data(), b.m.data(), b.v.data(), gh.data(), b.out.data(), n, some_step(),
                 nullptr, isa);
    EXPECT_TRUE(same_bits(a.p, b.p));
    EXPECT_TRUE(same_bits(a.m, b.m));
    EXPECT_TRUE(same_bits(a.v, b.v));
    EXPECT_EQ(a.out, b.out);
  }
}

// 1 and 4 threads (16 chunks of work) give the same bits, for the automatic ISA.
TEST(AdamW, ThreadCountInvariant) {
  const int64_t n = 1000003;
  ThreadPool one(1), four(4);
  State a(n, 31);
  State b = a;
  adamw_update(a.p.data(), a.m.data(), a.v.data(), a.g.data(), a.out.data(), n, some_step(),
               &one);
  adamw_update(b.p.data(), b.m.data(), b.v.data(), b.g.data(), b.out.data(), n, some_step(),
               &four);
  EXPECT_TRUE(same_bits(a.p, b.p));
  EXPECT_TRUE(same_bits(a.m, b.m));
  EXPECT_TRUE(same_bits(a.v, b.v));
  EXPECT_EQ(a.out, b.out);
  // And the update did something.
  EXPECT_FALSE(same_bits(a.p, State(n, 31).p));
}

// Ranges: decay ranges match a plain update with weight decay, no-decay ranges match one
// with weight_decay = 0, and the padding between ranges is not touched (p, m, v, out).
TEST(AdamW, RangesApplyDecayOnlyWhereAsked) {
  // Like a unit layout: a big decayed matrix spanning several chunks, a norm, padding.
  const std::vector<ParamRange> ranges = {
      {0, 100, false}, {128, 3 * kAdamWChunk + 17, true}, {128 + 3 * kAdamWChunk + 64, 640, false},
      {128 + 3 * kAdamWChunk + 704, 5, true}};
  const int64_t n = 128 + 3 * kAdamWChunk + 768;
  ThreadPool pool(3);
  for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::automatic}) {
    SCOPED_TRACE(cpu_isa_name(isa));
    State got(size_t(n), 41);
    const State orig = got;
    const AdamWStep s = some_step();
    adamw_update_ranges(got.p.data(), got.m.data(), got.v.data(), got.g.data(), got.out.data(),
                        n, ranges, s, &pool, isa);
    std::vector<bool> covered(size_t(n), false);
    for (const ParamRange& r : ranges) {
      State want(size_t(r.numel), 0);
      for (int64_t i = 0; i < r.numel; ++i) {
        const size_t j = size_t(r.offset + i);
        want.p[size_t(i)] = orig.p[j];
        want.m[size_t(i)] = orig.m[j];
        want.v[size_t(i)] = orig.v[j];
        want.g[size_t(i)] = orig.g[j];
        covered[j] = true;
      }
      AdamWStep rs = s;
      if (!r.decay) rs.weight_decay = 0.f;
      adamw_update(want.p.data(), want.m.data(), want.v.data(), want.g.data(), want.out.data(),
                   r.numel, rs, nullptr, CpuIsa::scalar);
      for (int64_t i = 0; i < r.numel; ++i) {
        const size_t j = size_t(r.offset + i);
        ASSERT_EQ(std::bit_cast<uint32_t>(got.p[j]), std::bit_cast<uint32_t>(want.p[size_t(i)]))
            << "p at " << j;
        ASSERT_EQ(got.m[j], want.m[size_t(i)]) << j;
        ASSERT_EQ(got.v[j], want.v[size_t(i)]) << j;
        ASSERT_EQ(got.out[j], want.out[size_t(i)]) << j;
      }
    }
    for (size_t j = 0; j < size_t(n); ++j) {
      if (covered[j]) continue;
      ASSERT_EQ(got.p[j], orig.p[j]) << "padding p at " << j;
      ASSERT_EQ(got.m[j], orig.m[j]) << j;
      ASSERT_EQ(got.v[j], orig.v[j]) << j;
      ASSERT_EQ(got.out[j], 0xdead) << j;
    }
  }
}

// Decay really differs from no decay (so the test above can fail).
TEST(AdamW, DecayChangesTheResult) {
  State a(64, 51);
  State b = a;
  const AdamWStep s = some_step();
  const ParamRange decayed{0, 64, true}, plain{0, 64, false};
  adamw_update_ranges(a.p.data(), a.m.data(), a.v.data(), a.g.data(), nullptr, 64, {&decayed, 1},
                      s, nullptr);
  adamw_update_ranges(b.p.data(), b.m.data(), b.v.data(), b.g.data(), nullptr, 64, {&plain, 1},
                      s, nullptr);
  for (int i = 0; i < 64; ++i) {
    // p * (1 - lr * wd) moves |p| by ~3e-5 * |p|: p values near 0 may round equal.
    if (std::abs(b.p[size_t(i)]) > 0.1f) {
      EXPECT_LT(std::abs(a.p[size_t(i)]), std::abs(b.p[size_t(i)]));
    }
    EXPECT_EQ(a.m[size_t(i)], b.m[size_t(i)]);  // moments do not see decay
  }
}

TEST(AdamW, RejectsBadArguments) {
  State st(8, 61);
  auto upd = [&](const AdamWStep& s) {
    adamw_update(st.p.data(), st.m.data(), st.v.data(), st.g.data(), nullptr, 8, s, nullptr);
  };
  AdamWStep s = some_step();
  s.step = 0;
  EXPECT_THROW(upd(s), Error);
  s = some_step();
  s.beta1 = 1.0f;
  EXPECT_THROW(upd(s), Error);
  s = some_step();
  s.lr = -1.f;
  EXPECT_THROW(upd(s), Error);
  s = some_step();
  s.grad_scale = std::numeric_limits<float>::quiet_NaN();
  try {
    upd(s);
    ADD_FAILURE() << "NaN grad_scale accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("skip"), std::string::npos) << e.what();
  }
  const std::vector<ParamRange> overlap = {{0, 4, true}, {3, 2, true}};
  EXPECT_THROW(adamw_update_ranges(st.p.data(), st.m.data(), st.v.data(), st.g.data(), nullptr,
                                   8, overlap, some_step(), nullptr),
               Error);
  const std::vector<ParamRange> outside = {{4, 5, true}};
  EXPECT_THROW(adamw_update_ranges(st.p.data(), st.m.data(), st.v.data(), st.g.data(), nullptr,
                                   8, outside, some_step(), nullptr),
               Error);
}

TEST(CpuIsa, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(parse_cpu_isa("avx512"), CpuIsa::avx512);
  EXPECT_EQ(parse_cpu_isa("scalar"), CpuIsa::scalar);
  EXPECT_THROW(parse_cpu_isa("sse9"), Error);
  EXPECT_NE(resolve_cpu_isa(CpuIsa::automatic), CpuIsa::automatic);
  EXPECT_TRUE(cpu_isa_supported(best_cpu_isa()));
}

// automatic means SF_ADAMW_ISA when set (run e.g. SF_ADAMW_ISA=scalar test_optim), else the
// best the CPU has.
TEST(CpuIsa, AutomaticFollowsEnvironment) {
  const char* env = std::getenv("SF_ADAMW_ISA");
  const CpuIsa want = env && *env && std::string(env) != "automatic" ? parse_cpu_isa(env)
                                                                       : best_cpu_isa();
  EXPECT_EQ(resolve_cpu_isa(CpuIsa::automatic), want);
}
