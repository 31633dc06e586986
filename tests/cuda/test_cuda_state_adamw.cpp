// The compact-state AdamW op (Backend::adamw_state): the CUDA kernel against the host scalar
// kernel (optim/state_adamw.h), bitwise, for every state format, on random data, with
// windows that end in a partial int8 block, a row range (embedding rows of 2.25 blocks), a
// small range that keeps fp32 moments under int8, and padding that must stay untouched;
// and the host backend's op against the optim front end it runs (this one needs no GPU).
#include <cstring>

#include "cuda_test_util.h"
#include "optim/state_adamw.h"

namespace sf::test {
namespace {

const StateFormat kFormats[] = {
    {MomentFormat::f32, MasterFormat::f32},  {MomentFormat::f32, MasterFormat::bf16},
    {MomentFormat::bf16, MasterFormat::f32}, {MomentFormat::bf16, MasterFormat::bf16},
    {MomentFormat::int8, MasterFormat::f32}, {MomentFormat::int8, MasterFormat::bf16}};

std::string fname(StateFormat f) {
  return cat("moments ", moment_format_name(f.moments), " master ", master_format_name(f.master));
}

// A row range (12 rows of 576), a 300-element no-decay range (fp32 moments under int8),
// padding, and a decayed range starting off the block grid and ending at the unit's end,
// which is off the grid too (a partial last block).
StateUnit test_unit() {
  StateUnit u;
  u.numel = 576 * 12 + 64 + 300 + 4096 * 5 + 77;
  u.ranges = {{0, 576 * 12, true, 576},
              {576 * 12 + 64, 300, false},
              {576 * 12 + 364, 4096 * 5 + 77, true}};
  return u;
}

// One unit's state in host vectors, encoded from seeded random fp32 values.
struct HostState {
  UnitStateLayout layout;
  std::vector<uint8_t> master, m, v;
  std::vector<float> ms, vs;
  UnitStateView view;
  HostState(const StateUnit& u, StateFormat f, uint64_t seed) {
    layout = unit_state_layout(u, f);
    master.assign(layout.master_bytes, 0x5a);
    m.assign(layout.moment_bytes, 0x5a);
    v.assign(layout.moment_bytes, 0x5a);
    ms.assign(size_t(layout.scale_count), 0.f);
    vs.assign(size_t(layout.scale_count), 0.f);
    view = UnitStateView{f, &layout, master.data(), m.data(), v.data(),
                         ms.empty() ? nullptr : ms.data(), vs.empty() ? nullptr : vs.data(),
                         0xabcdull + seed, 5};
    const size_t n = size_t(u.numel);
    const auto p0 = random_vec(n, seed, -1.f, 1.f), m0 = random_vec(n, seed + 1, -0.05f, 0.05f),
               v0 = random_vec(n, seed + 2, 0.f, 0.003f);
    state_from_f32(view, 0, u.numel, p0.data(), m0.data(), v0.data(), u.ranges);
  }
};

// The same state in device buffers.
struct DevState {
  DevArray<uint8_t> master, m, v;
  DevArray<float> ms, vs;
  UnitStateView view;
  explicit DevState(const HostState& h)
      : master(h.master), m(h.m), v(h.v), ms(h.ms), vs(h.vs), view(h.view) {
    view.master = master.ptr();
    view.m = m.ptr();
    view.v = v.ptr();
    view.m_scale = h.ms.empty() ? nullptr : ms.ptr();
    view.v_scale = h.vs.empty() ? nullptr : vs.ptr();
  }
};

template <class T>
void expect_same_bytes(const std::string& what, const std::vector<T>& got,
                       const std::vector<T>& want) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << ": first difference at " << i << " of " << got.size();
      return;
    }
}

AdamWStep step_at(int64_t t) {
  AdamWStep s;
  s.lr = 2e-3f;
  s.weight_decay = 0.05f;
  s.step = t;
  s.grad_scale = 0.7f;
  return s;
}

TEST(CudaStateAdamW, BitExactWithHostScalarAllFormats) {
  SF_REQUIRE_GPU();
  const StateUnit u = test_unit();
  const size_t n = size_t(u.numel);
  // Windows: rows 0-4 and 5-11 of the row range; then a block-grid window; then the rest,
  // ending at the unit's end in a partial block.
  const int64_t w0 = 576 * 12 + 2048;
  const std::vector<std::pair<int64_t, int64_t>> windows = {
      {0, 576 * 5}, {576 * 5, 576 * 7}, {576 * 12, 2048}, {w0, u.numel - w0}};
  for (StateFormat f : kFormats) {
    const std::string what = fname(f);
    SCOPED_TRACE(what);
    HostState h(u, f, 11);
    DevState d(h);
    std::vector<uint16_t> out_h(n, 0xdead);
    DevArray<uint16_t> out_d(out_h);
    for (int64_t t = 1; t <= 3; ++t) {
      const auto g = random_vec(n, 100 + uint64_t(t), -1.f, 1.f);
      DevArray<float> gd(g);
      for (auto [off, len] : windows) {
        adamw_update_state(h.view, off, len, g.data() + off, out_h.data() + off, u.ranges,
                           step_at(t), nullptr, CpuIsa::scalar);
        gpu().adamw_state(gs(), d.view, off, len, gd.ptr() + off, out_d.ptr() + off, u.ranges,
                          step_at(t));
      }
      gs().synchronize();
    }
    expect_same_bytes(what + " master", d.master.download(), h.master);
    expect_same_bytes(what + " m", d.m.download(), h.m);
    expect_same_bytes(what + " v", d.v.download(), h.v);
    expect_same_bytes(what + " m scales", d.ms.download(), h.ms);
    expect_same_bytes(what + " v scales", d.vs.download(), h.vs);
    expect_same_bytes(what + " bf16 weights", out_d.download(), out_h);  // padding: 0xdead
    EXPECT_EQ(out_h[576 * 12 + 10], 0xdead) << what << ": padding written";
  }
}

// A window splitting an int8 block is refused before anything is launched.
TEST(CudaStateAdamW, BlockSplitWindowRefused) {
  SF_REQUIRE_GPU();
  const StateUnit u = test_unit();
  HostState h(u, {MomentFormat::int8, MasterFormat::bf16}, 12);
  DevState d(h);
  DevArray<float> gd(random_vec(size_t(u.numel), 13));
  EXPECT_THROW(gpu().adamw_state(gs(), d.view, 0, 576 + 100, gd.ptr(), nullptr, u.ranges,
                                 step_at(1)),
               Error);
}

// The host backend's op is the optim front end plus the decoded master as its f32 weights.
TEST(HostStateAdamW, RunsTheFrontEndAndWritesF32Weights) {
  const StateUnit u = test_unit();
  const size_t n = size_t(u.numel);
  for (StateFormat f : kFormats) {
    const std::string what = fname(f);
    HostState a(u, f, 14), b(u, f, 14);
    const auto g = random_vec(n, 15);
    std::vector<float> w(n, -7.f), want(n, -7.f);
    host().adamw_state(hs(), a.view, 0, u.numel, g.data(), w.data(), u.ranges, step_at(2));
    adamw_update_state(b.view, 0, u.numel, g.data(), nullptr, u.ranges, step_at(2), nullptr);
    state_to_f32(b.view, 0, u.numel, want.data(), nullptr, nullptr, u.ranges);
    expect_same_bytes(what + " master", a.master, b.master);
    expect_same_bytes(what + " m", a.m, b.m);
    expect_same_bytes(what + " v", a.v, b.v);
    expect_same_bytes(what + " weights", w, want);
    EXPECT_EQ(w[576 * 12 + 10], -7.f) << what << ": padding written";
  }
}

}  // namespace
}  // namespace sf::test
