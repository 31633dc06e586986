// Attention of HostBackend: one sequence against a naive double softmax(q k^T * scale) v with a
// causal mask (and its lse), packed sequences against running each sequence on its own, the
// backward against finite differences (GQA, three packed sequences of different lengths).
// q, k, v are column blocks of one fused, padded [T, (Hq + 2 Hkv) D] matrix, as in a layer.
#include "backend/host_test_util.h"

using namespace sf;
using namespace sf::test;

namespace {

struct Qkv {
  int64_t T;
  int Hq, Hkv, D;
  HMat fused;
  Qkv(int64_t T_, int hq, int hkv, int d, uint64_t seed, float amp = 1.f)
      : T(T_), Hq(hq), Hkv(hkv), D(d),
        fused(HMat::random(T_, int64_t(hq + 2 * hkv) * d, seed, int64_t(hq + 2 * hkv) * d + 3,
                           -amp, amp)) {}
  Mat q() { return fused.mat().col_block(0, int64_t(Hq) * D); }
  Mat k() { return fused.mat().col_block(int64_t(Hq) * D, int64_t(Hkv) * D); }
  Mat v() { return fused.mat().col_block(int64_t(Hq + Hkv) * D, int64_t(Hkv) * D); }
  AttentionShape shape(const std::vector<int32_t>& cu) const {
    AttentionShape s;
    s.n_heads = Hq;
    s.n_kv_heads = Hkv;
    s.head_dim = D;
    s.scale = 1.f / std::sqrt(float(D));
    s.n_seqs = int(cu.size()) - 1;
    for (size_t i = 0; i + 1 < cu.size(); ++i) s.max_seqlen = std::max(s.max_seqlen, cu[i + 1] - cu[i]);
    return s;
  }
};

}  // namespace

TEST(HostAttention, SingleSequenceMatchesNaiveCausalSoftmax) {
  for (auto [hq, hkv] : {std::pair{4, 2}, std::pair{4, 1}, std::pair{3, 3}}) {
    SCOPED_TRACE(testing::Message() << "Hq " << hq << " Hkv " << hkv);
    const int64_t T = 23;
    const int D = 8;
    Qkv x(T, hq, hkv, D, 41 + hq * 10 + hkv, 2.f);
    std::vector<int32_t> cu = {0, int32_t(T)};
    auto sh = x.shape(cu);
    HMat out(T, int64_t(hq) * D, int64_t(hq) * D + 2);
    out.fill(std::nanf(""));
    std::vector<float> lse(size_t(hq * T), std::nanf(""));
    host().attention_forward(stream(), out.mat(), lse.data(), x.q(), x.k(), x.v(), sh, cu.data());
    const int rep = hq / hkv;
    for (int h = 0; h < hq; ++h)
      for (int64_t t = 0; t < T; ++t) {
        const int g = h / rep;
        std::vector<double> s(size_t(t + 1));
        double m = -1e300;
        for (int64_t j = 0; j <= t; ++j) {
          double d = 0;
          for (int i = 0; i < D; ++i) d += double(el(x.q(), t, h * D + i)) * el(x.k(), j, g * D + i);
          s[size_t(j)] = d * sh.scale;
          m = std::max(m, s[size_t(j)]);
        }
        double l = 0;
        for (auto sj : s) l += std::exp(sj - m);
        // lse ~ O(5) in fp32: 1e-6 relative.
        EXPECT_NEAR(lse[size_t(h * T + t)], m + std::log(l), 5e-6);
        for (int i = 0; i < D; ++i) {
          double o = 0;
          for (int64_t j = 0; j <= t; ++j) o += std::exp(s[size_t(j)] - m) / l * el(x.v(), j, g * D + i);
          // fp32 accumulation of <= 23 terms p_j v_j with sum p_j = 1, |v| < 2: error bound
          // about 23 * 2^-24 * 2 ~ 3e-6 (typically far less).
          EXPECT_NEAR(out.at(t, h * D + i), o, 4e-6);
        }
      }
    EXPECT_TRUE(out.padding_intact());
  }
}

TEST(HostAttention, PackedSequencesEqualSeparateRuns) {
  // Lengths 9, 1, 13: tokens must never attend across a boundary, and the result per sequence
  // must be bit-identical to running that sequence alone.
  const std::vector<int32_t> cu = {0, 9, 10, 23};
  const int64_t T = 23;
  const int Hq = 4, Hkv = 2, D = 8;
  Qkv x(T, Hq, Hkv, D, 51);
  auto sh = x.shape(cu);
  HMat out(T, Hq * D), dout = HMat::random(T, Hq * D, 52);
  std::vector<float> lse(size_t(Hq * T));
  host().attention_forward(stream(), out.mat(), lse.data(), x.q(), x.k(), x.v(), sh, cu.data());
  HMat dqkv(T, (Hq + 2 * Hkv) * D);
  Mat dq = dqkv.mat().col_block(0, Hq * D), dk = dqkv.mat().col_block(Hq * D, Hkv * D),
      dv = dqkv.mat().col_block((Hq + Hkv) * D, Hkv * D);
  host().attention_backward(stream(), dq, dk, dv, dout.mat(), out.mat(), lse.data(), x.q(), x.k(),
                            x.v(), sh, cu.data());
  for (size_t s = 0; s + 1 < cu.size(); ++s) {
    const int64_t b = cu[s], n = cu[s + 1] - cu[s];
    std::vector<int32_t> cu1 = {0, int32_t(n)};
    auto sh1 = x.shape(cu1);
    Mat q1 = x.q().row_block(b, n), k1 = x.k().row_block(b, n), v1 = x.v().row_block(b, n);
    HMat out1(n, Hq * D);
    std::vector<float> lse1(size_t(Hq * n));
    host().attention_forward(stream(), out1.mat(), lse1.data(), q1, k1, v1, sh1, cu1.data());
    EXPECT_EQ(dense(out1.mat()), dense(out.mat().row_block(b, n))) << "sequence " << s;
    for (int h = 0; h < Hq; ++h)
      for (int64_t t = 0; t < n; ++t) EXPECT_EQ(lse1[size_t(h * n + t)], lse[size_t(h * T + b + t)]);
    HMat dqkv1(n, (Hq + 2 * Hkv) * D);
    Mat dq1 = dqkv1.mat().col_block(0, Hq * D), dk1 = dqkv1.mat().col_block(Hq * D, Hkv * D),
        dv1 = dqkv1.mat().col_block((Hq + Hkv) * D, Hkv * D);
    host().attention_backward(stream(), dq1, dk1, dv1, dout.mat().row_block(b, n), out1.mat(),
                              lse1.data(), q1, k1, v1, sh1, cu1.data());
    EXPECT_EQ(dense(dqkv1.mat()), dense(dqkv.mat().row_block(b, n))) << "sequence " << s;
  }
  // A one-token sequence attends only to itself: out = v of its kv head.
  for (int h = 0; h < Hq; ++h)
    for (int i = 0; i < D; ++i) EXPECT_EQ(out.at(9, h * D + i), el(x.v(), 9, (h / 2) * D + i));
}

TEST(HostAttention, BackwardMatchesFiniteDifferences) {
  const std::vector<int32_t> cu = {0, 5, 8, 14};  // three sequences: 5, 3, 6 tokens
  const int64_t T = 14;
  const int Hq = 4, Hkv = 2, D = 4;
  Qkv x(T, Hq, Hkv, D, 61, 1.5f);
  auto sh = x.shape(cu);
  HMat R = HMat::random(T, Hq * D, 62), out(T, Hq * D, Hq * D + 1);
  std::vector<float> lse(size_t(Hq * T));
  auto loss = [&] {
    host().attention_forward(stream(), out.mat(), lse.data(), x.q(), x.k(), x.v(), sh, cu.data());
    return weighted_sum(out.mat(), R.mat());
  };
  loss();
  HMat dqkv(T, (Hq + 2 * Hkv) * D, (Hq + 2 * Hkv) * D + 2);
  dqkv.fill(std::nanf(""));  // overwrite semantics
  Mat dq = dqkv.mat().col_block(0, Hq * D), dk = dqkv.mat().col_block(Hq * D, Hkv * D),
      dv = dqkv.mat().col_block((Hq + Hkv) * D, Hkv * D);
  host().attention_backward(stream(), dq, dk, dv, R.mat(), out.mat(), lse.data(), x.q(), x.k(),
                            x.v(), sh, cu.data());
  // Smooth op of O(1) inputs: h = 1e-2 gives truncation ~1e-5; fp32 rounding of the outputs a
  // perturbation changes (~1e-7 each) / 2h ~ 1e-5. atol 1e-4, rtol 1e-3.
  expect_grad_fd(x.q(), dq, loss, 1e-2, 1e-4, 1e-3, "dq");
  expect_grad_fd(x.k(), dk, loss, 1e-2, 1e-4, 1e-3, "dk");
  expect_grad_fd(x.v(), dv, loss, 1e-2, 1e-4, 1e-3, "dv");
  EXPECT_TRUE(dqkv.padding_intact());
}

TEST(HostAttention, RejectsBadShapes) {
  Qkv x(6, 4, 3, 4, 71);  // 4 % 3 != 0
  std::vector<int32_t> cu = {0, 6};
  HMat out(6, 16);
  std::vector<float> lse(24);
  EXPECT_THROW(host().attention_forward(stream(), out.mat(), lse.data(), x.q(), x.k(), x.v(),
                                        x.shape(cu), cu.data()),
               Error);
  Qkv y(6, 4, 2, 4, 72);
  std::vector<int32_t> bad = {0, 5};  // does not reach T
  EXPECT_THROW(host().attention_forward(stream(), out.mat(), lse.data(), y.q(), y.k(), y.v(),
                                        y.shape(bad), bad.data()),
               Error);
}
