// Compact AdamW state (optim/state_format.h, optim/state_adamw.h): flag names, layout sizes,
// the int8 / bf16 codecs' error bounds, fp32 mode == adamw_update_ranges bitwise, SIMD ==
// scalar bitwise for every mode, thread count and tail, trajectories vs fp32 AdamW,
// stochastic rounding (unbiased, deterministic), fp32 round trips, refused windows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <bit>
#include <cstring>
#include <string>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/adamw.h"
#include "optim/cpu_isa.h"
#include "optim/state_adamw.h"
#include "optim/state_format.h"
#include "optim/state_kernel_table.h"
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
  // An embedding table cut per row (576 = 2.25 blocks: 3 scales per row) meets them too.
  StateUnit emb;
  emb.numel = 49152 * 576;
  emb.ranges = {{0, emb.numel, true, 576}};
  EXPECT_LE(unit_state_bytes(emb, {MomentFormat::int8, MasterFormat::f32}) / double(emb.numel), 6.1);
  EXPECT_LE(unit_state_bytes(emb, {MomentFormat::int8, MasterFormat::bf16}) / double(emb.numel), 4.1);
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


const StateFormat kAllFormats[] = {
    {MomentFormat::f32, MasterFormat::f32},  {MomentFormat::f32, MasterFormat::bf16},
    {MomentFormat::bf16, MasterFormat::f32}, {MomentFormat::bf16, MasterFormat::bf16},
    {MomentFormat::int8, MasterFormat::f32}, {MomentFormat::int8, MasterFormat::bf16}};

std::string format_label(StateFormat f) {
  return std::string(moment_format_name(f.moments)) + "/" + master_format_name(f.master);
}

// A unit whose last range ends at the unit's end, off the block grid (13 + 4096 * 3 + 77
// elements), a row range like an embedding table (rows of 576 = 2.25 blocks) and a small
// no-decay range.
StateUnit tail_unit() {
  StateUnit u;
  u.numel = 576 * 12 + 64 + 300 + 4096 * 3 + 77;
  u.ranges = {{0, 576 * 12, true, 576},
              {576 * 12 + 64, 300, false},
              {576 * 12 + 364, 4096 * 3 + 77, true}};
  return u;
}

// Steps the state with the given window pieces; with bf16 gradients when bf16_grad.
void run_steps(OwnedState& st, const std::vector<std::pair<int64_t, int64_t>>& windows,
               int steps, bool bf16_grad, ThreadPool* pool, CpuIsa isa,
               std::vector<uint16_t>* out) {
  const size_t n = size_t(st.unit.numel);
  for (int t = 1; t <= steps; ++t) {
    const auto g = test::random_vec(n, 100 + uint64_t(t), -1.f, 1.f);
    std::vector<uint16_t> gb(n);
    for (size_t i = 0; i < n; ++i) gb[i] = f32_to_bf16(g[i]);
    for (auto [off, len] : windows) {
      uint16_t* o = out ? out->data() + off : nullptr;
      if (bf16_grad)
        adamw_update_state(st.view, off, len, gb.data() + off, o, st.unit.ranges, step_at(t),
                           pool, isa);
      else
        adamw_update_state(st.view, off, len, g.data() + off, o, st.unit.ranges, step_at(t),
                           pool, isa);
    }
  }
}

// Every ISA this CPU has and 1, 2, 3 threads give the scalar kernels' bits, for every
// format, both gradient types, windows with tails (partial blocks at range ends, the unit
// end off the grid, rows of 2.25 blocks).
TEST(StateAdamW, SimdAndThreadsMatchScalarBitwise) {
  const StateUnit u = tail_unit();
  // Windows: whole rows of the row range, then block-grid pieces, the last to the unit end.
  const std::vector<std::pair<int64_t, int64_t>> windows = {
      {0, 576 * 5}, {576 * 5, 576 * 7}, {576 * 12, 2048}, {576 * 12 + 2048, u.numel - 576 * 12 - 2048}};
  std::vector<CpuIsa> isas;
  for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512})
    if (cpu_isa_supported(isa)) isas.push_back(isa);
  if (isas.empty()) GTEST_SKIP() << "no SIMD variant on this CPU";
  ThreadPool pools[3] = {ThreadPool(1), ThreadPool(2), ThreadPool(3)};
  for (StateFormat f : kAllFormats)
    for (bool bf16_grad : {false, true}) {
      OwnedState ref(u, f, 5);
      std::vector<uint16_t> ref_out(size_t(u.numel), 0xdead);
      run_steps(ref, windows, 3, bf16_grad, nullptr, CpuIsa::scalar, &ref_out);
      for (CpuIsa isa : isas)
        for (ThreadPool& pool : pools) {
          OwnedState st(u, f, 5);
          std::vector<uint16_t> out(size_t(u.numel), 0xdead);
          run_steps(st, windows, 3, bf16_grad, &pool, isa, &out);
          EXPECT_TRUE(st.same_bits(ref)) << format_label(f) << " bf16_grad " << bf16_grad
                                         << " " << cpu_isa_name(isa) << " threads " << pool.size();
          EXPECT_EQ(out, ref_out) << format_label(f) << " " << cpu_isa_name(isa);
        }
      // The state moved, and padding (between ranges) was not touched.
      OwnedState init(u, f, 5);
      EXPECT_FALSE(ref.same_bits(init)) << format_label(f);
      EXPECT_EQ(ref_out[size_t(576 * 12 + 10)], 0xdead);
    }
}

// A bf16 gradient array may double as the bf16 output (element read before written).
TEST(StateAdamW, Bf16OutMayAliasBf16Grad) {
  const StateUnit u = tail_unit();
  for (StateFormat f : kAllFormats)
    for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2}) {
      if (!cpu_isa_supported(isa)) continue;
      const auto g = test::random_vec(size_t(u.numel), 77);
      std::vector<uint16_t> gb(g.size());
      for (size_t i = 0; i < g.size(); ++i) gb[i] = f32_to_bf16(g[i]);
      OwnedState a(u, f, 6), b(u, f, 6);
      std::vector<uint16_t> out(g.size(), 0xdead), alias = gb;
      adamw_update_state(a.view, 0, u.numel, gb.data(), out.data(), u.ranges, step_at(1),
                         nullptr, isa);
      adamw_update_state(b.view, 0, u.numel, alias.data(), alias.data(), u.ranges, step_at(1),
                         nullptr, isa);
      EXPECT_TRUE(a.same_bits(b)) << format_label(f);
      for (const ParamRange& r : u.ranges)
        for (int64_t i = r.offset; i < r.offset + r.numel; ++i)
          ASSERT_EQ(alias[size_t(i)], out[size_t(i)]) << format_label(f) << " i " << i;
    }
}

// adamw_weights_of_update writes the bf16 weights adamw_update_state writes, bit for bit, on
// every ISA and thread count, windows with tails, several steps on, and leaves the state as
// it was (a speculative update needs no undo); fp32 is refused (it undoes exactly instead).
TEST(StateAdamW, WeightsOfUpdateAreTheUpdatesAndKeepTheState) {
  const StateUnit u = tail_unit();
  const std::vector<std::pair<int64_t, int64_t>> windows = {
      {0, 576 * 5}, {576 * 5, 576 * 7}, {576 * 12, 2048}, {576 * 12 + 2048, u.numel - 576 * 12 - 2048}};
  ThreadPool pool(3);
  const auto g = test::random_vec(size_t(u.numel), 91);
  std::vector<uint16_t> gb(g.size());
  for (size_t i = 0; i < g.size(); ++i) gb[i] = f32_to_bf16(g[i]);
  for (StateFormat f : kAllFormats) {
    if (f.is_fp32()) {
      OwnedState st(u, f, 8);
      std::vector<uint16_t> out(g.size());
      EXPECT_THROW(adamw_weights_of_update(st.view, 0, u.numel, gb.data(), out.data(), u.ranges,
                                           step_at(1), nullptr), Error);
      continue;
    }
    for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512}) {
      if (!cpu_isa_supported(isa)) continue;
      for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
        OwnedState st(u, f, 8);
        run_steps(st, windows, 2, true, p, isa, nullptr);  // a state some steps on
        OwnedState before(u, f, 8);
        run_steps(before, windows, 2, true, p, isa, nullptr);
        ASSERT_TRUE(st.same_bits(before));
        std::vector<uint16_t> spec(g.size(), 0xdead), real(g.size(), 0xdead);
        for (auto [off, len] : windows)
          adamw_weights_of_update(st.view, off, len, gb.data() + off, spec.data() + off, u.ranges,
                                  step_at(3), p, isa);
        EXPECT_TRUE(st.same_bits(before)) << format_label(f) << " " << cpu_isa_name(isa);
        for (auto [off, len] : windows)
          adamw_update_state(st.view, off, len, gb.data() + off, real.data() + off, u.ranges, step_at(3),
                             p, isa);
        EXPECT_FALSE(st.same_bits(before)) << format_label(f);
        EXPECT_EQ(spec, real) << format_label(f) << " " << cpu_isa_name(isa);
      }
    }
  }
}

// With master bf16, the bf16 output is the stored master; with master fp32 it is the master
// rounded to nearest even.
TEST(StateAdamW, Bf16OutIsTheNewMaster) {
  const StateUnit u = tail_unit();
  for (StateFormat f : kAllFormats) {
    OwnedState st(u, f, 8);
    std::vector<uint16_t> out(size_t(u.numel), 0xdead);
    run_steps(st, {{0, u.numel}}, 1, false, nullptr, CpuIsa::automatic, &out);
    std::vector<float> p(size_t(u.numel));
    state_to_f32(st.view, 0, u.numel, p.data(), nullptr, nullptr, u.ranges);
    for (const ParamRange& r : u.ranges)
      for (int64_t i = r.offset; i < r.offset + r.numel; ++i)
        ASSERT_EQ(out[size_t(i)], f32_to_bf16(p[size_t(i)])) << format_label(f) << " " << i;
  }
}

// 200 steps of each format against fp32 AdamW from the same start (decoded weights, zero
// moments, as training starts), on a noisy quadratic (gradient = p - target + noise). The
// RMS weight difference d must stay within a * |p| + b * |displacement| (RMS over elements;
// displacement = the fp32 run's p_T - p_0):
//  - b: the moments' encoding changes each step's update m / (sqrt(v) + eps) by at most
//    (relative) half the m spacing plus half the sqrt(v) spacing: bf16 2^-8 + 2^-9 = 0.6%,
//    int8 4.5% + 2.2% = 6.7%. If every step's error had one sign the weights would lose that
//    fraction of the displacement; the moments' recurrences can carry errors further, but
//    nearest rounding errors alternate in sign, so the per-step bound is the scale used:
//    b = 1e-2 (bf16; measured 3e-3) and b = 0.1 (int8; measured 0.06).
//  - a: bf16 master rounds stochastically each step: an unbiased error with standard
//    deviation <= half a bf16 ulp <= 2^-8 |p|, independent per step, so after T steps
//    <= sqrt(T) * 2^-8 |p|: a = sqrt(200) / 256 = 0.055. fp32 master: a = 0.
TEST(StateAdamW, TrajectoryFollowsFp32) {
  StateUnit u;
  u.numel = 8192 + 512;
  u.ranges = {{0, 8192, true}, {8192, 512, false}};
  const size_t n = size_t(u.numel);
  const auto target = test::random_vec(n, 901, -1.f, 1.f);
  for (StateFormat f : kAllFormats) {
    if (f.is_fp32()) continue;
    OwnedState st(u, f, 9);
    OwnedState ref(u, {}, 9);
    // Training starts with zero moments; the fp32 reference starts from the compact state's
    // decoded weights.
    std::vector<float> p(n), zero(n, 0.f);
    state_from_f32(st.view, 0, u.numel, nullptr, zero.data(), zero.data(), u.ranges);
    state_to_f32(st.view, 0, u.numel, p.data(), nullptr, nullptr, u.ranges);
    state_from_f32(ref.view, 0, u.numel, p.data(), zero.data(), zero.data(), u.ranges);
    std::mt19937_64 rng(3);
    std::normal_distribution<float> noise(0.f, 0.3f);
    std::vector<float> g(n), pc(n), pr(n);
    for (int t = 1; t <= 200; ++t) {
      state_to_f32(st.view, 0, u.numel, pc.data(), nullptr, nullptr, u.ranges);
      state_to_f32(ref.view, 0, u.numel, pr.data(), nullptr, nullptr, u.ranges);
      for (size_t i = 0; i < n; ++i) g[i] = pr[i] - target[i] + noise(rng);
      std::vector<float> gc(n);
      for (size_t i = 0; i < n; ++i) gc[i] = g[i] + (pc[i] - pr[i]);  // each its own p
      adamw_update_state(st.view, 0, u.numel, gc.data(), nullptr, u.ranges, step_at(t), nullptr);
      adamw_update_state(ref.view, 0, u.numel, g.data(), nullptr, u.ranges, step_at(t), nullptr);
    }
    state_to_f32(st.view, 0, u.numel, pc.data(), nullptr, nullptr, u.ranges);
    state_to_f32(ref.view, 0, u.numel, pr.data(), nullptr, nullptr, u.ranges);
    double d2 = 0, r2 = 0, s2 = 0;
    for (size_t i = 0; i < n; ++i) {
      d2 += double(pc[i] - pr[i]) * (pc[i] - pr[i]);
      r2 += double(pr[i]) * pr[i];
      s2 += double(pr[i] - p[i]) * (pr[i] - p[i]);
    }
    const double a = f.master == MasterFormat::bf16 ? std::sqrt(200.0) / 256 : 0.0;
    const double b = f.moments == MomentFormat::int8 ? 0.1 : f.moments == MomentFormat::bf16 ? 1e-2 : 0.0;
    EXPECT_LE(std::sqrt(d2), a * std::sqrt(r2) + b * std::sqrt(s2))
        << format_label(f) << ": |d| / |p| " << std::sqrt(d2 / r2) << ", |d| / |displacement| "
        << std::sqrt(d2 / s2);
    EXPECT_GT(d2, 0.0) << format_label(f) << ": compact state gave fp32's exact bits?";
  }
}

// Stochastic rounding: the same inputs give the same bits (deterministic); over many keys
// the mean of the rounded values equals x (unbiased), and each result is one of x's two bf16
// neighbours.
TEST(StateFormat, StochasticRoundingUnbiasedAndDeterministic) {
  const float xs[] = {1.0f + 0x1p-9f, -3.14159f, 1e-3f + 1e-7f, 0.7071f};
  for (float x : xs) {
    // x's bf16 neighbours: truncation (toward zero) and the next one away from zero.
    const uint16_t trunc = uint16_t(std::bit_cast<uint32_t>(x) >> 16);
    const float down = bf16_to_f32(trunc), up = bf16_to_f32(uint16_t(trunc + 1));
    double sum = 0;
    const int kDraws = 200000;
    for (int i = 0; i < kDraws; ++i) {
      const uint32_t key = stochastic_round_key(42, 7, i);
      const uint16_t b = stochastic_round_bf16(x, stochastic_round_noise(key, 12345));
      ASSERT_EQ(b, stochastic_round_bf16(x, stochastic_round_noise(key, 12345)));
      const float r = bf16_to_f32(b);
      ASSERT_TRUE(r == down || r == up) << x << " -> " << r;
      sum += r;
    }
    // The mean of kDraws Bernoulli(q) roundings has standard deviation <= ulp / (2 sqrt(N)):
    // allow 5 of them (a false failure has probability ~ 6e-7).
    const double ulp = std::ldexp(1.0, std::ilogb(x) - 7);
    EXPECT_NEAR(sum / kDraws, double(x), 5 * ulp / (2 * std::sqrt(double(kDraws)))) << x;
  }
  // A bf16 value stays itself; NaN stays NaN.
  EXPECT_EQ(stochastic_round_bf16(1.5f, 0xffff), f32_to_bf16(1.5f));
  EXPECT_TRUE(std::isnan(bf16_to_f32(stochastic_round_bf16(NAN, 0x1234))));
}

// The stochastic rounding noise depends on (seed, unit, element, step) only: two runs give
// the same bits, another seed other bits.
TEST(StateAdamW, Bf16MasterDependsOnSeedOnly) {
  const StateUnit u = tail_unit();
  const StateFormat f{MomentFormat::bf16, MasterFormat::bf16};
  OwnedState a(u, f, 10), b(u, f, 10), c(u, f, 10);
  c.view.rounding_seed ^= 1;
  ThreadPool pool(2);
  run_steps(a, {{0, u.numel}}, 2, false, nullptr, CpuIsa::scalar, nullptr);
  run_steps(b, {{0, 576 * 6}, {576 * 6, u.numel - 576 * 6}}, 2, false, &pool, CpuIsa::automatic,
            nullptr);
  run_steps(c, {{0, u.numel}}, 2, false, nullptr, CpuIsa::scalar, nullptr);
  EXPECT_TRUE(a.same_bits(b));
  EXPECT_NE(a.master, c.master);
}

// Encoding an fp32 state and decoding it again is the identity on the encoded values
// (decode -> encode -> decode gives the same fp32), for every format.
TEST(StateFormat, RoundTripIsStable) {
  const StateUnit u = tail_unit();
  const size_t n = size_t(u.numel);
  for (StateFormat f : kAllFormats) {
    OwnedState st(u, f, 12);
    std::vector<float> p(n), m(n), v(n), p2(n), m2(n), v2(n);
    state_to_f32(st.view, 0, u.numel, p.data(), m.data(), v.data(), u.ranges);
    OwnedState st2(u, f, 13);
    state_from_f32(st2.view, 0, u.numel, p.data(), m.data(), v.data(), u.ranges);
    state_to_f32(st2.view, 0, u.numel, p2.data(), m2.data(), v2.data(), u.ranges);
    EXPECT_EQ(p, p2) << format_label(f);
    EXPECT_EQ(m, m2) << format_label(f);
    EXPECT_EQ(v, v2) << format_label(f);
    EXPECT_TRUE(st.same_bits(st2)) << format_label(f);
  }
}

// A window must not split a row's blocks: a run of rows is fine, half a row is not.
TEST(StateAdamW, RowRangeWindows) {
  const StateUnit u = tail_unit();
  OwnedState st(u, {MomentFormat::int8, MasterFormat::f32}, 14);
  const auto g = test::random_vec(size_t(u.numel), 41);
  EXPECT_NO_THROW(adamw_update_state(st.view, 576 * 3, 576 * 2, g.data(), nullptr, u.ranges,
                                     step_at(1), nullptr));
  EXPECT_NO_THROW(adamw_update_state(st.view, 576 * 3 + 512, 64, g.data(), nullptr, u.ranges,
                                     step_at(1), nullptr));
  EXPECT_THROW(adamw_update_state(st.view, 576 * 3, 288, g.data(), nullptr, u.ranges,
                                  step_at(1), nullptr),
               Error);
}


namespace ok = sf::optim_kernels;

ok::StateConsts codec_consts() {
  ok::StateConsts c{};
  c.map_m = int8_map(false);
  c.mid_m = int8_midpoints(false);
  c.map_v = int8_map(true);
  c.mid_v = int8_midpoints(true);
  return c;
}

// Values that probe every decision of the int8 quantiser, normalised to absmax 1: each map
// entry, each midpoint exactly (a tie) and the floats either side of it, both signs, zeros,
// a denormal, NaN.
std::vector<float> codec_probes(bool is_v) {
  std::vector<float> x;
  const float* map = int8_map(is_v);
  const float* mid = int8_midpoints(is_v);
  for (int k = 0; k < 256; ++k) x.push_back(map[k]);
  for (int k = 0; k < 255; ++k)
    for (float y : {mid[k], std::nextafter(mid[k], -2.f), std::nextafter(mid[k], 2.f)})
      x.push_back(y);
  if (!is_v) {
    const size_t n = x.size();
    for (size_t i = 0; i < n; ++i) x.push_back(-x[i]);
  }
  for (float y : {0.0f, -0.0f, 1e-40f, 1.0f, NAN}) x.push_back(y);
  return x;
}

// The SIMD int8 codecs (which exploit the maps' octave structure instead of searching them)
// give the scalar search's codes for every probe, and decode every code to map[code] * scale.
TEST(StateFormat, Int8CodecsAgreeAcrossIsasOnTies) {
  const ok::StateConsts c = codec_consts();
  const ok::StateKernelTable& ref = ok::state_kernel_table(CpuIsa::scalar);
  for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512}) {
    if (!cpu_isa_supported(isa)) continue;
    const ok::StateKernelTable& t = ok::state_kernel_table(isa);
    for (bool is_v : {false, true}) {
      const std::vector<float> x = codec_probes(is_v);
      // Blocks of every length 1..256 at every start, so that vector tails see each probe.
      for (size_t b = 0; b < x.size(); b += 97) {
        const int64_t n = std::min<int64_t>(int64_t(x.size() - b), 1 + int64_t(b % 256));
        uint8_t c1[256], c2[256];
        float s1 = -1, s2 = -2;
        ref.int8_encode(x.data() + b, n, is_v, c, c1, &s1);
        t.int8_encode(x.data() + b, n, is_v, c, c2, &s2);
        ASSERT_EQ(std::bit_cast<uint32_t>(s1), std::bit_cast<uint32_t>(s2));
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(c1[i], c2[i]) << cpu_isa_name(isa) << " is_v " << is_v << " x "
                                  << x[b + size_t(i)] << " scale " << s1;
      }
      // Every probe at scale 1 (a block holding +-1 and the probe).
      for (float y : x) {
        const float blk[2] = {is_v ? 1.0f : -1.0f, y};
        uint8_t c1[2], c2[2];
        float s1, s2;
        ref.int8_encode(blk, 2, is_v, c, c1, &s1);
        t.int8_encode(blk, 2, is_v, c, c2, &s2);
        ASSERT_EQ(c1[1], c2[1]) << cpu_isa_name(isa) << " is_v " << is_v << " y " << y;
      }
      uint8_t all[256];
      for (int k = 0; k < 256; ++k) all[k] = uint8_t(k);
      for (float scale : {1.0f, 0.37f, 0.0f}) {
        float d1[256], d2[256];
        ref.int8_decode(all, 256, is_v, scale, c, d1);
        t.int8_decode(all, 256, is_v, scale, c, d2);
        for (int k = 0; k < 256; ++k) {
          ASSERT_EQ(std::bit_cast<uint32_t>(d1[k]), std::bit_cast<uint32_t>(int8_map(is_v)[k] * scale));
          ASSERT_EQ(std::bit_cast<uint32_t>(d1[k]), std::bit_cast<uint32_t>(d2[k]))
              << cpu_isa_name(isa) << " code " << k;
        }
      }
    }
  }
}

// Each variant's table row holds that variant's kernels (a row wired to scalar would pass
// every cross-ISA test without running SIMD code).
TEST(StateFormat, KernelTableRowsAreTheirOwn) {
  EXPECT_EQ(ok::state_kernel_table(CpuIsa::scalar).k[1][2][1], &ok::state_bf16_int8_bf16_scalar);
  EXPECT_EQ(ok::state_kernel_table(CpuIsa::scalar).int8_encode, &ok::int8_encode_scalar);
  if (cpu_isa_supported(CpuIsa::avx2)) {
    const ok::StateKernelTable& t = ok::state_kernel_table(CpuIsa::avx2);
    EXPECT_EQ(t.k[0][0][0], &ok::state_f32_f32_f32_avx2);
    EXPECT_EQ(t.k[1][2][1], &ok::state_bf16_int8_bf16_avx2);
    EXPECT_EQ(t.k[0][1][1], &ok::state_f32_bf16_bf16_avx2);
    EXPECT_EQ(t.int8_decode, &ok::int8_decode_avx2);
  }
  if (cpu_isa_supported(CpuIsa::avx512)) {
    const ok::StateKernelTable& t = ok::state_kernel_table(CpuIsa::avx512);
    EXPECT_EQ(t.k[1][0][1], &ok::state_bf16_f32_bf16_avx512);
    EXPECT_EQ(t.k[0][2][0], &ok::state_f32_int8_f32_avx512);
    EXPECT_EQ(t.int8_encode, &ok::int8_encode_avx512);
  }
}


// Bytes outside every range (padding between ranges, the moments' alignment gaps) are never
// written, by the update or by the encoder, for every format.
TEST(StateAdamW, PaddingBytesUntouched) {
  const StateUnit u = tail_unit();
  for (StateFormat f : kAllFormats) {
    OwnedState st(u, f, 16);
    std::fill(st.master.begin(), st.master.end(), uint8_t(0x5a));
    std::fill(st.m.begin(), st.m.end(), uint8_t(0x5a));
    std::fill(st.v.begin(), st.v.end(), uint8_t(0x5a));
    const size_t n = size_t(u.numel);
    const auto p0 = test::random_vec(n, 17), m0 = test::random_vec(n, 18, -0.1f, 0.1f),
               v0 = test::random_vec(n, 19, 0.f, 0.01f);
    state_from_f32(st.view, 0, u.numel, p0.data(), m0.data(), v0.data(), u.ranges);
    run_steps(st, {{0, u.numel}}, 2, true, nullptr, CpuIsa::automatic, nullptr);
    std::vector<bool> master_used(st.master.size()), moment_used(st.m.size());
    const size_t ms = f.master == MasterFormat::f32 ? 4 : 2;
    for (const RangeStateLayout& r : st.layout.ranges) {
      const size_t es = r.moments == MomentFormat::f32 ? 4 : r.moments == MomentFormat::bf16 ? 2 : 1;
      for (size_t b = size_t(r.offset) * ms; b < size_t(r.offset + r.numel) * ms; ++b)
        master_used[b] = true;
      for (size_t b = r.moment_offset; b < r.moment_offset + size_t(r.numel) * es; ++b)
        moment_used[b] = true;
    }
    for (size_t b = 0; b < st.master.size(); ++b)
      if (!master_used[b]) {
        ASSERT_EQ(st.master[b], 0x5a) << format_label(f) << " master byte " << b;
      }
    for (size_t b = 0; b < st.m.size(); ++b)
      if (!moment_used[b]) {
        ASSERT_EQ(st.m[b], 0x5a) << format_label(f) << " m byte " << b;
        ASSERT_EQ(st.v[b], 0x5a) << format_label(f) << " v byte " << b;
      }
  }
}

}  // namespace
