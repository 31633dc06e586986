// RMSNorm ops of HostBackend: forward against a double reference of the Hugging Face formula,
// backward (dx, dw, dres path, dx aliasing dres) against central finite differences, per-head
// use through a [T*H, D] view and through a strided [T, H*D] view (groups), add_rmsnorm.
#include "backend/host_test_util.h"

using namespace sf;
using namespace sf::test;

namespace {

constexpr float kEps = 1e-5f;

// Finite-difference settings for the norm: inputs are O(1), the op is smooth; with h = 1e-2
// the truncation error is O(h^2 * |f'''|) ~ 1e-4 relative. fp32 rounding of the outputs that
// a perturbation changes adds ~1e-7 / h ~ 1e-5. Hence atol 5e-4 (gradients are O(1)), rtol 1e-3.
constexpr double kH = 1e-2, kAtol = 5e-4, kRtol = 1e-3;

}  // namespace

TEST(HostRmsNorm, ForwardMatchesHfFormula) {
  const int64_t T = 22, C = 67;
  HMat x = HMat::random(T, C, 1, C + 5, -2.f, 2.f), w = HMat::random(1, C, 2, -1, 0.5f, 1.5f);
  HMat out(T, C, C + 3);
  out.fill(std::nanf(""));
  std::vector<float> rstd(T, -1.f);
  host().rmsnorm_forward(stream(), out.mat(), rstd.data(), x.mat(), w.mat(), kEps);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += double(x.at(t, c)) * x.at(t, c);
    const double r = 1.0 / std::sqrt(ss / C + kEps);
    // rstd is computed in fp32 from the mean: relative error a few ulp (1e-6).
    EXPECT_NEAR(rstd[size_t(t)], r, 1e-6 * r);
    for (int64_t c = 0; c < C; ++c)  // two fp32 products on top: 1e-6 relative, |out| < 10
      EXPECT_NEAR(out.at(t, c), w.at(0, c) * x.at(t, c) * r, 1e-5) << t << "," << c;
  }
  EXPECT_TRUE(out.padding_intact());
}

TEST(HostRmsNorm, BackwardMatchesFiniteDifferences) {
  const int64_t T = 7, C = 24;
  HMat x = HMat::random(T, C, 3, C + 2), w = HMat::random(1, C, 4, -1, 0.5f, 1.5f);
  HMat R = HMat::random(T, C, 5);  // dL/dout
  HMat out(T, C);
  std::vector<float> rstd(T);
  auto loss = [&] {
    host().rmsnorm_forward(stream(), out.mat(), rstd.data(), x.mat(), w.mat(), kEps);
    return weighted_sum(out.mat(), R.mat());
  };
  loss();
  HMat dx(T, C, C + 1);
  dx.fill(std::nanf(""));  // overwrite semantics
  HMat dw = HMat::random(1, C, 6);  // accumulate: start from non-zero values
  const HMat dw0 = dw;
  host().rmsnorm_backward(stream(), dx.mat(), dw.mat(), R.mat(), x.mat(), w.mat(), rstd.data(),
                          Mat());
  for (int64_t c = 0; c < C; ++c) dw.at(0, c) -= dw0.at(0, c);
  expect_grad_fd(x.mat(), dx.mat(), loss, kH, kAtol, kRtol, "dx");
  expect_grad_fd(w.mat(), dw.mat(), loss, kH, kAtol, kRtol, "dw");
  EXPECT_TRUE(dx.padding_intact());
}

TEST(HostRmsNorm, ResidualGradientAndAliasing) {
  // dx = norm backward + dres; with dx aliasing dres the result must be the same.
  const int64_t T = 9, C = 16;
  HMat x = HMat::random(T, C, 7, C + 3), w = HMat::random(1, C, 8);
  HMat dout = HMat::random(T, C, 9), dres = HMat::random(T, C, 10, C + 1);
  HMat out(T, C);
  std::vector<float> rstd(T);
  host().rmsnorm_forward(stream(), out.mat(), rstd.data(), x.mat(), w.mat(), kEps);
  HMat plain(T, C), with_res(T, C), dw(1, C);
  host().rmsnorm_backward(stream(), plain.mat(), dw.mat(), dout.mat(), x.mat(), w.mat(),
                          rstd.data(), Mat());
  host().rmsnorm_backward(stream(), with_res.mat(), Mat(), dout.mat(), x.mat(), w.mat(),
                          rstd.data(), dres.mat());
  HMat aliased = dres;  // dx == dres
  host().rmsnorm_backward(stream(), aliased.mat(), Mat(), dout.mat(), x.mat(), w.mat(),
                          rstd.data(), aliased.mat());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_EQ(with_res.at(t, c), plain.at(t, c) + dres.at(t, c));  // one fp32 add: exact
      EXPECT_EQ(aliased.at(t, c), with_res.at(t, c));
    }
}

TEST(HostRmsNorm, PerHeadViewAndStridedGroups) {
  // Qwen3 q_norm: q is a column block of the fused qkv output [T, (H + 2 Hkv) * D].
  const int64_t T = 11, H = 3, D = 8, W = (H + 2) * D + 5;
  HMat qkv = HMat::random(T, W, 11, W), w = HMat::random(1, D, 12);
  Mat q = qkv.mat().col_block(0, H * D);
  // Reference: the contiguous [T*H, D] view of a copy of q.
  HMat qc(T, H * D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < H * D; ++c) qc.at(t, c) = el(q, t, c);
  HMat out_ref(T, H * D), out(T, H * D, H * D + 3);
  std::vector<float> rstd_ref(T * H), rstd(T * H);
  host().rmsnorm_forward(stream(), out_ref.mat().reshaped(T * H, D), rstd_ref.data(),
                         qc.mat().reshaped(T * H, D), w.mat(), kEps);
  host().rmsnorm_forward(stream(), out.mat(), rstd.data(), q, w.mat(), kEps);
  EXPECT_EQ(rstd, rstd_ref);
  EXPECT_EQ(dense(out.mat()), dense(out_ref.mat()));
  // Each head row normalised on its own: spot-check head 2 of token 4 against the formula.
  double ss = 0;
  for (int64_t d = 0; d < D; ++d) ss += double(el(q, 4, 2 * D + d)) * el(q, 4, 2 * D + d);
  EXPECT_NEAR(rstd[4 * H + 2], 1.0 / std::sqrt(ss / D + kEps), 1e-5);

  // Backward through the grouped strided view equals the reshaped one, and matches FD.
  HMat R = HMat::random(T, H * D, 13);
  HMat dx_ref(T, H * D), dx(T, H * D, H * D + 1), dw_ref(1, D), dw(1, D);
  host().rmsnorm_backward(stream(), dx_ref.mat().reshaped(T * H, D), dw_ref.mat(),
                          R.mat().reshaped(T * H, D), qc.mat().reshaped(T * H, D), w.mat(),
                          rstd_ref.data(), Mat());
  host().rmsnorm_backward(stream(), dx.mat(), dw.mat(), R.mat(), q, w.mat(), rstd.data(), Mat());
  EXPECT_EQ(dense(dx.mat()), dense(dx_ref.mat()));
  EXPECT_EQ(dense(dw.mat()), dense(dw_ref.mat()));
  HMat tmp(T, H * D);
  std::vector<float> rs(T * H);
  auto loss = [&] {
    host().rmsnorm_forward(stream(), tmp.mat(), rs.data(), q, w.mat(), kEps);
    return weighted_sum(tmp.mat(), R.mat());
  };
  expect_grad_fd(q, dx.mat(), loss, kH, kAtol, kRtol, "per-head dx");
  expect_grad_fd(w.mat(), dw.mat(), loss, kH, kAtol, kRtol, "per-head dw");
  EXPECT_TRUE(qkv.padding_intact());
}

TEST(HostRmsNorm, AddRmsNormForwardAndResidualBackward) {
  // A decoder layer: sum = a + b feeds the norm and the residual stream. With
  // L = <out, R1> + <sum, R2>, dL/da = dL/db = rmsnorm_backward(dout = R1, dres = R2).
  const int64_t T = 6, C = 20;
  HMat a = HMat::random(T, C, 14, C + 2), b = HMat::random(T, C, 15), w = HMat::random(1, C, 16);
  HMat R1 = HMat::random(T, C, 17), R2 = HMat::random(T, C, 18);
  HMat sum(T, C, C + 1), out(T, C);
  std::vector<float> rstd(T);
  auto loss = [&] {
    host().add_rmsnorm_forward(stream(), sum.mat(), out.mat(), rstd.data(), a.mat(), b.mat(),
                               w.mat(), kEps);
    return weighted_sum(out.mat(), R1.mat()) + weighted_sum(sum.mat(), R2.mat());
  };
  loss();
  // Forward: sum exact, out equal to rmsnorm_forward(sum) bit for bit.
  HMat out2(T, C);
  std::vector<float> rstd2(T);
  host().rmsnorm_forward(stream(), out2.mat(), rstd2.data(), sum.mat(), w.mat(), kEps);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_EQ(sum.at(t, c), a.at(t, c) + b.at(t, c));
      EXPECT_EQ(out.at(t, c), out2.at(t, c));
    }
  EXPECT_EQ(rstd, rstd2);
  HMat dx(T, C), dw(1, C);
  host().rmsnorm_backward(stream(), dx.mat(), dw.mat(), R1.mat(), sum.mat(), w.mat(), rstd.data(),
                          R2.mat());
  expect_grad_fd(a.mat(), dx.mat(), loss, kH, kAtol, kRtol, "da");
  expect_grad_fd(b.mat(), dx.mat(), loss, kH, kAtol, kRtol, "db");
  expect_grad_fd(w.mat(), dw.mat(), loss, kH, kAtol, kRtol, "dw");
  // In-place residual (sum aliasing a) gives the same result.
  loss();  // the finite differences left out/sum at a perturbed point: recompute
  HMat a2 = a, out3(T, C);
  host().add_rmsnorm_forward(stream(), a2.mat(), out3.mat(), rstd2.data(), a2.mat(), b.mat(),
                             w.mat(), kEps);
  EXPECT_EQ(dense(a2.mat()), dense(sum.mat()));
  EXPECT_EQ(dense(out3.mat()), dense(out.mat()));
}
