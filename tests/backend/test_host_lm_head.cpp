// lm_head_loss of HostBackend: loss, dh and dw against a naive full-logits double
// implementation (with ignored labels and grad_scale), finite differences of the returned loss,
// agreement across chunk sizes (1, 5, 7, T) and across the dh-only / dw-only / loss-only modes.
#include "backend/host_test_util.h"

using namespace sf;
using namespace sf::test;

namespace {

constexpr int64_t T = 22, C = 16, V = 67;
constexpr float kScale = 0.37f;

struct LmHead {
  HMat h = HMat::random(T, C, 81, C + 3, -1.f, 1.f);
  HMat w = HMat::random(V, C, 82, C + 1, -1.f, 1.f);
  std::vector<int32_t> labels;
  LmHead() {
    auto r = random_vec(T, 83, 0.f, float(V));
    for (int64_t t = 0; t < T; ++t) labels.push_back(int32_t(r[size_t(t)]));
    labels[3] = labels[10] = labels[21] = -100;
    labels[4] = 0;
    labels[5] = int32_t(V - 1);
  }
  // Runs the op; returns the loss added to loss0.
  float run(Mat dh, Mat dw, int64_t chunk, float loss0 = 0.f, float gs = kScale) {
    HMat scratch(chunk, V, V + 2);
    scratch.fill(std::nanf(""));
    float loss = loss0;
    host().lm_head_loss(stream(), &loss, dh, dw, h.mat(), w.mat(), labels.data(), gs,
                        scratch.mat());
    return loss;
  }
};

// Naive reference in double: loss, dh = gs * (p - y) W, dw = gs * (p - y)^T h.
void naive(LmHead& m, double& loss, std::vector<double>& dh, std::vector<double>& dw) {
  loss = 0;
  dh.assign(size_t(T * C), 0.0);
  dw.assign(size_t(V * C), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    if (m.labels[size_t(t)] == -100) continue;
    std::vector<double> z(V);
    double mx = -1e300;
    for (int64_t v = 0; v < V; ++v) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += double(m.h.at(t, c)) * m.w.at(v, c);
      z[size_t(v)] = s;
      mx = std::max(mx, s);
    }
    double se = 0;
    for (auto zv : z) se += std::exp(zv - mx);
    const double lse = mx + std::log(se);
    loss += lse - z[size_t(m.labels[size_t(t)])];
    for (int64_t v = 0; v < V; ++v) {
      const double g = kScale * (std::exp(z[size_t(v)] - lse) - (v == m.labels[size_t(t)]));
      for (int64_t c = 0; c < C; ++c) {
        dh[size_t(t * C + c)] += g * m.w.at(v, c);
        dw[size_t(v * C + c)] += g * m.h.at(t, c);
      }
    }
  }
}

}  // namespace

TEST(HostLmHead, MatchesNaiveFullLogitsForEveryChunkSize) {
  LmHead m;
  double ref_loss;
  std::vector<double> ref_dh, ref_dw;
  naive(m, ref_loss, ref_dh, ref_dw);
  for (int64_t chunk : {int64_t(1), int64_t(5), int64_t(7), T, T + 3}) {
    SCOPED_TRACE(testing::Message() << "chunk " << chunk);
    HMat dh(T, C, C + 2), dw = HMat::random(V, C, 84, C + 1);
    dh.fill(std::nanf(""));  // overwrite
    const HMat dw0 = dw;     // accumulate
    const float loss = m.run(dh.mat(), dw.mat(), chunk, 1.25f);
    // Loss ~ 19 tokens * ln(67): fp32 logits (1e-7 relative) and one final rounding: 1e-6 rel.
    EXPECT_NEAR(loss, 1.25 + ref_loss, 1e-6 * ref_loss);
    // Gradients are O(0.1); logits rounding (1e-7) and fp32 GEMM sums of 67 terms: 1e-6 abs.
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        ASSERT_NEAR(dh.at(t, c), ref_dh[size_t(t * C + c)], 1e-6) << t << "," << c;
        if (m.labels[size_t(t)] == -100) {
          ASSERT_EQ(dh.at(t, c), 0.f);
        }
      }
    for (int64_t v = 0; v < V; ++v)
      for (int64_t c = 0; c < C; ++c)
        ASSERT_NEAR(dw.at(v, c) - dw0.at(v, c), ref_dw[size_t(v * C + c)], 2e-6) << v << "," << c;
    EXPECT_TRUE(dh.padding_intact() && dw.padding_intact());
  }
}

TEST(HostLmHead, ModesAgree) {
  // Loss only, dh only and dw only give the same values as computing everything at once.
  LmHead m;
  HMat dh_all(T, C), dw_all(V, C), dh_only(T, C), dw_only(V, C);
  const float l_all = m.run(dh_all.mat(), dw_all.mat(), 7);
  EXPECT_EQ(m.run(Mat(), Mat(), 7), l_all);
  EXPECT_EQ(m.run(dh_only.mat(), Mat(), 7), l_all);
  EXPECT_EQ(m.run(Mat(), dw_only.mat(), 7), l_all);
  EXPECT_EQ(dense(dh_only.mat()), dense(dh_all.mat()));
  EXPECT_EQ(dense(dw_only.mat()), dense(dw_all.mat()));
}

TEST(HostLmHead, GradientsMatchFiniteDifferences) {
  LmHead m;
  HMat dh(T, C), dw(V, C);
  const float base = m.run(dh.mat(), dw.mat(), 7);
  // loss_sum accumulates (in double, rounded once), so starting it at -base returns the small
  // difference L(x) - base with fp32 precision relative to the difference itself: the finite
  // differences are not swamped by the rounding of a loss of ~80.
  auto loss = [&] { return double(kScale) * m.run(Mat(), Mat(), 7, -base); };
  // Smooth op of O(1) inputs: h = 1e-2 gives truncation ~1e-5 relative; fp32 logits of the
  // perturbed row/column (1e-7) / 2h ~ 1e-5. atol 5e-5, rtol 1e-3.
  expect_grad_fd(m.h.mat(), dh.mat(), loss, 1e-2, 5e-5, 1e-3, "dh");
  expect_grad_fd(m.w.mat(), dw.mat(), loss, 1e-2, 5e-5, 1e-3, "dw");
}

TEST(HostLmHead, RejectsBadLabels) {
  LmHead m;
  m.labels[2] = int32_t(V);
  EXPECT_THROW(m.run(Mat(), Mat(), 7), Error);
  m.labels[2] = -1;
  EXPECT_THROW(m.run(Mat(), Mat(), 7), Error);
}
