// Compact AdamW state (optim/state_format.h, optim/state_adamw.h): flag names, layout sizes,
// the int8 / bf16 codecs' error bounds, fp32 mode == adamw_update_ranges bitwise, SIMD ==
// scalar bitwise for every mode, thread count and tail, trajectories vs fp32 AdamW,
// stochastic rounding (unbiased, deterministic), fp32 round trips, refused windows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/adamw.h"
#include "optim/state_adamw.h"
#include "optim/state_format.h"
#include "test_util.h"

using namespace sf;

namespace {

// One unit's state in owned buffers, seeded from fp32 values p in [-1, 1), m in
// [-0.1, 0.1), v in [0, 0.01) (encoded with state_from_f32).
struct OwnedState {
  StateUnit unit;
  UnitStateLayout layout;
  std::vector<uint8_t> master, m, v;
  std::vector<float> ms, vs;
  UnitStateView view;
  OwnedState(StateUnit u, StateFormat f, uint64_t seed) : unit(std::move(u)) {
    layout = unit_state_layout(unit, f);
    master.assign(layout.master_bytes, 0);
    m.assign(layout.moment_bytes, 0);
    v.assign(layout.moment_bytes, 0);
    ms.assign(size_t(layout.scale_count), 0.f);
    vs.assign(size_t(layout.scale_count), 0.f);
    view = UnitStateView{f, &layout, master.data(), m.data(), v.data(),
                         ms.empty() ? nullptr : ms.data(), vs.empty() ? nullptr : vs.data(),
                         0x5eedull + seed, 3};
    const size_t n = size_t(unit.numel);
    const auto p0 = test::random_vec(n, seed, -1.f, 1.f);
    const auto m0 = test::random_vec(n, seed + 1, -0.1f, 0.1f);
    const auto v0 = test::random_vec(n, seed + 2, 0.f, 0.01f);
    state_from_f32(view, 0, unit.numel, p0.data(), m0.data(), v0.data(), unit.ranges);
  }
  bool same_bits(const OwnedState& o) const {
    return master == o.master && m == o.m && v == o.v && ms == o.ms && vs == o.vs;
  }
};

// A unit with a large decayed range starting off the block grid (partial first and last
// block), a small no-decay range (fp32 moments under int8) and padding between them.
StateUnit mixed_unit() {
  StateUnit u;
  u.numel = 4 * 4096;
  u.ranges = {{100, 2 * 4096 + 77, true}, {2 * 4096 + 300, 700, false},
              {2 * 4096 + 1100, 4096 + 900, true}};
  return u;
}

AdamWStep step_at(int64_t t) {
  AdamWStep s;
  s.lr = 1e-3f;
  s.weight_decay = 0.01f;
  s.step = t;
  s.grad_scale = 0.5f;
  return s;
}

TEST(StateFormat, FlagNamesRoundTrip) {
  for (MomentFormat f : {MomentFormat::f32, MomentFormat::bf16, MomentFormat::int8})
    EXPECT_EQ(parse_moment_format(moment_format_name(f)), f);
  for (MasterFormat f : {MasterFormat::f32, MasterFormat::bf16})
    EXPECT_EQ(parse_master_format(master_format_name(f)), f);
  EXPECT_FALSE(parse_moment_format("fp16").has_value());
  EXPECT_FALSE(parse_master_format("int8").has_value());
  EXPECT_TRUE(StateFormat{}.is_fp32());
  EXPECT_FALSE((StateFormat{MomentFormat::bf16, MasterFormat::f32}.is_fp32()));
}

// A transformer-like unit (two large matrices, two small norms) meets the targets:
// int8 + fp32 master <= 6.1 B/param, int8 + bf16 master <= 4.1 B/param.
TEST(StateFormat, BytesPerParamMeetTargets) {
  StateUnit u;
  u.numel = 2 * 576 * 1536 + 2 * 576;
  u.ranges = {{0, 576, false}, {576, 576 * 1536, true}, {576 + 576 * 1536, 576, false},
              {2 * 576 + 576 * 1536, 576 * 1536, true}};
  const double n = double(u.numel);
  EXPECT_EQ(unit_state_bytes(u, {}), size_t(12 * u.numel));
  EXPECT_EQ(unit_state_bytes(u, {MomentFormat::bf16, MasterFormat::bf16}), size_t(6 * u.numel));
  EXPECT_LE(unit_state_bytes(u, {MomentFormat::int8, MasterFormat::f32}) / n, 6.1);
  EXPECT_LE(unit_state_bytes(u, {MomentFormat::int8, MasterFormat::bf16}) / n, 4.1);
  const UnitStateLayout L = unit_state_layout(u, {MomentFormat::int8, MasterFormat::bf16});
  EXPECT_EQ(L.ranges[0].moments, MomentFormat::f32);
  EXPECT_EQ(L.ranges[1].moments, MomentFormat::int8);
  EXPECT_EQ(L.ranges[1].scale_count, (576 + 576 * 1536 - 1) / 256 - 576 / 256 + 1);
}

TEST(StateFormat, RowRangesHaveBlocksPerRow) {
  StateUnit u;
  u.numel = 576 * 10;
  u.ranges = {{0, 576 * 10, true, 576}};
  const UnitStateLayout L = unit_state_layout(u, {MomentFormat::int8, MasterFormat::f32});
  EXPECT_EQ(L.scale_count, 10 * 3);  // 576 = 256 + 256 + 64
  u.ranges[0].row = 577;             // does not divide the range
  EXPECT_THROW(unit_state_layout(u, {MomentFormat::int8, MasterFormat::f32}), Error);
}

// The int8 maps: sorted, +-1 and 0 present, midpoints between neighbours.
TEST(StateFormat, Int8MapsAreSortedWithExactEnds) {
  for (bool is_v : {false, true}) {
    const float* map = int8_map(is_v);
    const float* mid = int8_midpoints(is_v);
    for (int k = 0; k < 255; ++k) {
      EXPECT_LT(map[k], map[k + 1]) << k;
      EXPECT_GT(mid[k], map[k]);
      EXPECT_LT(mid[k], map[k + 1]);
    }
    EXPECT_EQ(map[255], 1.0f);
    EXPECT_EQ(map[is_v ? 0 : kInt8ZeroCodeM], 0.0f);
  }
  EXPECT_EQ(int8_map(false)[0], -1.0f);
}

// Quantise / dequantise: each value lands within half its map gap (times the block scale),
// the gap being the spacing of the two map entries around x / scale; the absmax element is
// exact. The relative map spacing is 2^(1/8) - 1 < 9.1%, so above the map's smallest
// non-zero entry the relative error is below 4.6% (plus the fp32 rounding of x / scale and
// map * scale: 2 ulp).
TEST(StateFormat, Int8CodecErrorWithinHalfSpacing) {
  std::mt19937_64 rng(7);
  for (bool is_v : {false, true}) {
    const float* map = int8_map(is_v);
    for (int trial = 0; trial < 50; ++trial) {
      std::vector<float> x(256);
      // Log-uniform magnitudes over 6 decades: the dynamic range moments have.
      std::uniform_real_distribution<float> e(-6.f, 0.f), sgn(-1.f, 1.f);
      for (float& xi : x) xi = std::pow(10.f, e(rng)) * (is_v ? 1.f : (sgn(rng) < 0 ? -1.f : 1.f));
      StateUnit u;
      u.numel = 4096;
      u.ranges = {{0, 4096, true}};
      std::vector<float> full(4096, 0.f);
      std::copy(x.begin(), x.end(), full.begin());
      OwnedState st(u, {MomentFormat::int8, MasterFormat::f32}, 1);
      state_from_f32(st.view, 0, 4096, nullptr, is_v ? nullptr : full.data(),
                     is_v ? full.data() : nullptr, u.ranges);
      std::vector<float> back(4096);
      state_to_f32(st.view, 0, 4096, nullptr, is_v ? nullptr : back.data(),
                   is_v ? back.data() : nullptr, u.ranges);
      const float scale = is_v ? st.vs[0] : st.ms[0];
      float amax = 0;
      for (float xi : x) amax = std::max(amax, std::fabs(xi));
      ASSERT_EQ(scale, amax);
      for (int i = 0; i < 256; ++i) {
        const float y = x[size_t(i)] / scale;
        int k = 0;
        while (k < 254 && map[k + 1] < y) ++k;  // map[k] <= y <= map[k + 1] (or y below map[1])
        const double gap = double(map[k + 1]) - double(map[k]);
        const double err = std::fabs(double(back[size_t(i)]) - double(x[size_t(i)]));
        EXPECT_LE(err, (0.5 * gap + 2 * 0x1p-24) * scale + 2 * 0x1p-24 * std::fabs(x[size_t(i)]))
            << "is_v " << is_v << " i " << i << " x " << x[size_t(i)];
        if (std::fabs(x[size_t(i)]) == amax) {
          EXPECT_EQ(back[size_t(i)], x[size_t(i)]);
        }
      }
    }
  }
}

// bf16 moments and master: round to nearest even, so the error is at most half a bf16 ulp,
// 2^-8 * 2^floor(log2 |x|) <= 2^-8 |x| (8 significant bits).
TEST(StateFormat, Bf16RoundTripWithinHalfUlp) {
  StateUnit u = mixed_unit();
  OwnedState st(u, {MomentFormat::bf16, MasterFormat::bf16}, 2);
  const size_t n = size_t(u.numel);
  const auto p = test::random_vec(n, 11), m = test::random_vec(n, 12), v = test::random_vec(n, 13, 0.f, 1.f);
  state_from_f32(st.view, 0, u.numel, p.data(), m.data(), v.data(), u.ranges);
  std::vector<float> p2(n, 7.f), m2(n, 7.f), v2(n, 7.f);
  state_to_f32(st.view, 0, u.numel, p2.data(), m2.data(), v2.data(), u.ranges);
  for (const ParamRange& r : u.ranges)
    for (int64_t i = r.offset; i < r.offset + r.numel; ++i) {
      const size_t k = size_t(i);
      EXPECT_LE(std::fabs(p2[k] - p[k]), std::ldexp(std::fabs(p[k]), -8));
      EXPECT_LE(std::fabs(m2[k] - m[k]), std::ldexp(std::fabs(m[k]), -8));
      EXPECT_LE(std::fabs(v2[k] - v[k]), std::ldexp(std::fabs(v[k]), -8));
    }
  EXPECT_EQ(p2[0], 7.f);  // padding (outside every range) is not written
}

// With StateFormat{} the compact path is adamw_update_ranges, bit for bit.
TEST(StateAdamW, Fp32ModeEqualsAdamWUpdateRanges) {
  StateUnit u = mixed_unit();
  OwnedState st(u, {}, 3);
  std::vector<float> p(size_t(u.numel)), m(p.size()), v(p.size());
  std::memcpy(p.data(), st.master.data(), p.size() * 4);
  std::memcpy(m.data(), st.m.data(), p.size() * 4);
  std::memcpy(v.data(), st.v.data(), p.size() * 4);
  const auto g = test::random_vec(p.size(), 30);
  std::vector<uint16_t> o1(p.size(), 0xdead), o2(p.size(), 0xdead);
  const int64_t off = 4096, len = u.numel - 4096 - 3;  // a window of the unit
  adamw_update_state(st.view, off, len, g.data() + off, o1.data() + off, u.ranges, step_at(2),
                     nullptr);
  const auto w = clip_ranges(u.ranges, off, len);
  adamw_update_ranges(p.data() + off, m.data() + off, v.data() + off, g.data() + off,
                      o2.data() + off, len, w, step_at(2), nullptr);
  EXPECT_EQ(std::memcmp(p.data(), st.master.data(), p.size() * 4), 0);
  EXPECT_EQ(std::memcmp(m.data(), st.m.data(), p.size() * 4), 0);
  EXPECT_EQ(std::memcmp(v.data(), st.v.data(), p.size() * 4), 0);
  EXPECT_EQ(o1, o2);
}

TEST(StateAdamW, WindowSplittingABlockIsRefused) {
  StateUnit u = mixed_unit();
  OwnedState st(u, {MomentFormat::int8, MasterFormat::f32}, 4);
  const auto g = test::random_vec(size_t(u.numel), 40);
  EXPECT_THROW(adamw_update_state(st.view, 0, 1000, g.data(), nullptr, u.ranges, step_at(1),
                                  nullptr),
               Error);
  EXPECT_THROW(state_to_f32(st.view, 300, 256, nullptr, nullptr, nullptr, u.ranges), Error);
  // Block-grid windows are fine (the first ends at the range start's next block edge).
  EXPECT_NO_THROW(adamw_update_state(st.view, 0, 1024, g.data(), nullptr, u.ranges,
                                     step_at(1), nullptr));
  EXPECT_NO_THROW(adamw_update_state(st.view, 1024, u.numel - 1024, g.data() + 1024, nullptr,
                                     u.ranges, step_at(1), nullptr));
  // A range that is not one of the layout's is refused.
  const std::vector<ParamRange> wrong = {{100, 50, true}};
  EXPECT_THROW(adamw_update_state(st.view, 0, 1024, g.data(), nullptr, wrong, step_at(1),
                                  nullptr),
               Error);
}

}  // namespace
