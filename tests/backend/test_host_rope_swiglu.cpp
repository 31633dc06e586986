// RoPE and SwiGLU of HostBackend: forward against the Hugging Face formulas (incl. a hand
// example of the rotate_half pairing), backward against finite differences, strided column
// blocks, aliasing, extreme inputs.
#include "backend/host_test_util.h"

using namespace sf;
using namespace sf::test;

namespace {

std::vector<float> llama_inv_freq(int D, double theta = 10000.0) {
  std::vector<float> f(size_t(D / 2));
  for (int i = 0; i < D / 2; ++i) f[size_t(i)] = float(1.0 / std::pow(theta, 2.0 * i / D));
  return f;
}

}  // namespace

TEST(HostRope, HandExampleRotateHalfPairing) {
  // D = 4: pairs are (x0, x2) and (x1, x3), not adjacent elements.
  HMat x(1, 4);
  x.at(0, 0) = 1.f;
  x.at(0, 3) = 1.f;
  const int32_t pos = 1;
  const float inv_freq[2] = {1.f, 0.5f};
  host().rope_forward(stream(), x.mat(), 1, 4, &pos, inv_freq);
  // (x0, x2) = (1, 0) rotated by 1 rad; (x1, x3) = (0, 1) rotated by 0.5 rad.
  EXPECT_NEAR(x.at(0, 0), std::cos(1.f), 1e-7);
  EXPECT_NEAR(x.at(0, 2), std::sin(1.f), 1e-7);
  EXPECT_NEAR(x.at(0, 1), -std::sin(0.5f), 1e-7);
  EXPECT_NEAR(x.at(0, 3), std::cos(0.5f), 1e-7);
}

TEST(HostRope, ForwardMatchesFormulaOnStridedBlockAndBackwardInverts) {
  const int64_t T = 22, H = 3, D = 16, W = H * D + 2 * D + 3;
  HMat qkv = HMat::random(T, W, 21, W + 2);
  Mat q = qkv.mat().col_block(0, H * D);
  std::vector<int32_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t < 9 ? t : 3000 + t);  // packed + far
  auto inv = llama_inv_freq(int(D));
  const HMat before = qkv;
  host().rope_forward(stream(), q, int(H), int(D), pos.data(), inv.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < D / 2; ++i) {
        const float ang = float(pos[size_t(t)]) * inv[size_t(i)];  // fp32 angle, as transformers
        const double c = std::cos(double(ang)), s = std::sin(double(ang));
        const double a = before.at(t, h * D + i), b = before.at(t, h * D + i + D / 2);
        // fp32 cos/sin/product rounding: a few ulp of O(1) values.
        EXPECT_NEAR(el(q, t, h * D + i), a * c - b * s, 1e-6);
        EXPECT_NEAR(el(q, t, h * D + i + D / 2), b * c + a * s, 1e-6);
      }
  // Columns outside the q block untouched.
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = H * D; c < W; ++c) EXPECT_EQ(qkv.at(t, c), before.at(t, c));
  EXPECT_TRUE(qkv.padding_intact());
  // Backward rotates back: rope_backward(rope_forward(x)) == x up to rounding (1e-6 abs).
  host().rope_backward(stream(), q, int(H), int(D), pos.data(), inv.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < H * D; ++c) EXPECT_NEAR(qkv.at(t, c), before.at(t, c), 1e-6);
}

TEST(HostRope, BackwardMatchesFiniteDifferences) {
  const int64_t T = 5, H = 2, D = 8;
  HMat x = HMat::random(T, H * D, 22, H * D + 3), R = HMat::random(T, H * D, 23);
  std::vector<int32_t> pos = {0, 1, 2, 0, 7};
  auto inv = llama_inv_freq(int(D));
  HMat y(T, H * D);
  auto loss = [&] {
    y = x;
    host().rope_forward(stream(), y.mat(), int(H), int(D), pos.data(), inv.data());
    return weighted_sum(y.mat(), R.mat());
  };
  HMat dx = R;
  host().rope_backward(stream(), dx.mat(), int(H), int(D), pos.data(), inv.data());
  // The op is linear, so central differences are exact up to rounding of the O(1) loss
  // (1e-7 relative) divided by 2h = 2e-2: atol 1e-5.
  expect_grad_fd(x.mat(), dx.mat(), loss, 1e-2, 1e-5, 0, "rope dx");
}

TEST(HostSwiGlu, ForwardMatchesFormulaOnFusedBlocks) {
  const int64_t T = 22, F = 65;
  HMat gu = HMat::random(T, 2 * F, 31, 2 * F + 3, -6.f, 6.f);
  Mat gate = gu.mat().col_block(0, F), up = gu.mat().col_block(F, F);
  HMat out(T, F, F + 1);
  host().swiglu_forward(stream(), out.mat(), gate, up);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < F; ++c) {
      const double g = el(gate, t, c), u = el(up, t, c);
      // fp32 exp/divide/multiply: relative 1e-6 of values below 6*6.
      EXPECT_NEAR(out.at(t, c), g / (1 + std::exp(-g)) * u, 4e-5);
    }
  EXPECT_TRUE(out.padding_intact());
}

TEST(HostSwiGlu, ExtremeGateValuesStayFinite) {
  HMat g(1, 4), u(1, 4), out(1, 4), dg(1, 4), du(1, 4), d(1, 4);
  const float gv[4] = {-200.f, -88.f, 88.f, 200.f};
  for (int i = 0; i < 4; ++i) {
    g.at(0, i) = gv[i];
    u.at(0, i) = 1.f;
    d.at(0, i) = 1.f;
  }
  host().swiglu_forward(stream(), out.mat(), g.mat(), u.mat());
  host().swiglu_backward(stream(), dg.mat(), du.mat(), d.mat(), g.mat(), u.mat());
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(std::isfinite(out.at(0, i)) && std::isfinite(dg.at(0, i)) &&
                std::isfinite(du.at(0, i)));
  }
  EXPECT_EQ(out.at(0, 3), 200.f);
  EXPECT_NEAR(dg.at(0, 3), 1.f, 1e-6);
  EXPECT_NEAR(out.at(0, 0), 0.f, 1e-30);
}

TEST(HostSwiGlu, BackwardMatchesFiniteDifferencesAndMayAlias) {
  const int64_t T = 9, F = 13;
  HMat gu = HMat::random(T, 2 * F, 32, 2 * F + 2, -4.f, 4.f);
  Mat gate = gu.mat().col_block(0, F), up = gu.mat().col_block(F, F);
  HMat R = HMat::random(T, F, 33), out(T, F);
  auto loss = [&] {
    host().swiglu_forward(stream(), out.mat(), gate, up);
    return weighted_sum(out.mat(), R.mat());
  };
  HMat dgu(T, 2 * F, 2 * F + 1);
  dgu.fill(std::nanf(""));
  Mat dgate = dgu.mat().col_block(0, F), dup = dgu.mat().col_block(F, F);
  host().swiglu_backward(stream(), dgate, dup, R.mat(), gate, up);
  // Smooth op, inputs up to 4: h = 1e-2 gives truncation ~1e-5 relative; fp32 rounding of one
  // output / 2h ~ 1e-5. atol 2e-4, rtol 1e-3.
  expect_grad_fd(gate, dgate, loss, 1e-2, 2e-4, 1e-3, "dgate");
  expect_grad_fd(up, dup, loss, 1e-2, 2e-4, 1e-3, "dup");
  EXPECT_TRUE(dgu.padding_intact());
  // In place: dgate/dup written over gate/up give the same values.
  HMat gu2 = gu;
  Mat g2 = gu2.mat().col_block(0, F), u2 = gu2.mat().col_block(F, F);
  host().swiglu_backward(stream(), g2, u2, R.mat(), g2, u2);
  EXPECT_EQ(dense(gu2.mat()), dense(dgu.mat()));
}
