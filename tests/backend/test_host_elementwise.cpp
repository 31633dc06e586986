// Embedding, bias, cast, axpy, sum_squares and adamw of HostBackend.
#include "backend/host_test_util.h"

using namespace sf;
using namespace sf::test;

TEST(HostEmbedding, ForwardGathersAndBackwardScattersRepeatedIds) {
  const int64_t V = 13, C = 67, T = 22;
  HMat table = HMat::random(V, C, 91, C + 2);
  std::vector<int32_t> ids(T);
  for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t((t * 7) % 5 + (t % 3) * 4);  // repeats
  HMat out(T, C, C + 1);
  out.fill(std::nanf(""));
  host().embedding_forward(stream(), out.mat(), ids.data(), table.mat());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(out.at(t, c), table.at(ids[size_t(t)], c));
  EXPECT_TRUE(out.padding_intact());

  // Backward accumulates dout rows into dtable in token order: the same fp32 adds as a naive
  // loop, so the comparison is exact.
  HMat dout = HMat::random(T, C, 92, C + 3), dtable = HMat::random(V, C, 93, C + 1);
  HMat expect = dtable;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) expect.at(ids[size_t(t)], c) += dout.at(t, c);
  host().embedding_backward(stream(), dtable.mat(), ids.data(), dout.mat());
  EXPECT_EQ(dense(dtable.mat()), dense(expect.mat()));
  EXPECT_TRUE(dtable.padding_intact());

  // Finite differences of <embedding(table), R> w.r.t. the table (linear: exact up to the
  // rounding of the O(10) loss, 1e-6, / 2h = 2e-2: atol 1e-4).
  HMat dt(V, C);
  host().embedding_backward(stream(), dt.mat(), ids.data(), dout.mat());
  auto loss = [&] {
    host().embedding_forward(stream(), out.mat(), ids.data(), table.mat());
    return weighted_sum(out.mat(), dout.mat());
  };
  expect_grad_fd(table.mat(), dt.mat(), loss, 1e-2, 1e-4, 0, "dtable");

  // Negative ids are skipped (the engine scatters into blocks of rows that way).
  std::vector<int32_t> some = ids;
  for (size_t t = 0; t < some.size(); t += 3) some[t] = -1;
  HMat partial = HMat::random(V, C, 94, C + 1);
  HMat expect_partial = partial;
  for (int64_t t = 0; t < T; ++t)
    if (some[size_t(t)] >= 0)
      for (int64_t c = 0; c < C; ++c) expect_partial.at(some[size_t(t)], c) += dout.at(t, c);
  host().embedding_backward(stream(), partial.mat(), some.data(), dout.mat());
  EXPECT_EQ(dense(partial.mat()), dense(expect_partial.mat()));

  std::vector<int32_t> bad = {0, int32_t(V)};
  HMat o2(2, C);
  EXPECT_THROW(host().embedding_forward(stream(), o2.mat(), bad.data(), table.mat()), Error);
  EXPECT_THROW(host().embedding_backward(stream(), dt.mat(), bad.data(), o2.mat()), Error);
}

TEST(HostBias, AddAndBackward) {
  const int64_t T = 65, N = 22;
  HMat x = HMat::random(T, N, 101, N + 3), b = HMat::random(1, N, 102);
  const HMat x0 = x;
  host().bias_add(stream(), x.mat(), b.mat());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < N; ++c) ASSERT_EQ(x.at(t, c), x0.at(t, c) + b.at(0, c));
  EXPECT_TRUE(x.padding_intact());

  HMat dy = HMat::random(T, N, 103, N + 1), db = HMat::random(1, N, 104);
  const HMat db0 = db;
  host().bias_backward(stream(), db.mat(), dy.mat());
  for (int64_t c = 0; c < N; ++c) {
    double s = db0.at(0, c);
    for (int64_t t = 0; t < T; ++t) s += dy.at(t, c);
    EXPECT_NEAR(db.at(0, c), s, 1e-6);  // summed in double, rounded once: 1 ulp of O(5)
  }
  // Finite differences of <x + b, dy> w.r.t. b (linear; loss O(10): atol 1e-4).
  HMat dbz(1, N), y(T, N);
  host().bias_backward(stream(), dbz.mat(), dy.mat());
  auto loss = [&] {
    y = x0;
    host().bias_add(stream(), y.mat(), b.mat());
    return weighted_sum(y.mat(), dy.mat());
  };
  expect_grad_fd(b.mat(), dbz.mat(), loss, 1e-2, 1e-4, 0, "dbias");
}

TEST(HostCast, AllFloatTypesStrided) {
  const int64_t R = 5, C = 67, ldw = 70;
  HMat src = HMat::random(R, C, 111, C + 2, -70000.f, 70000.f);  // beyond f16 range: inf
  src.at(0, 0) = 1.00390625f;                                   // bf16 tie: rounds to even
  std::vector<uint16_t> bf(size_t(R * ldw), 0xffff), hf(size_t(R * ldw), 0xffff);
  Mat mbf(bf.data(), DType::bf16, R, C, ldw), mhf(hf.data(), DType::f16, R, C, ldw);
  host().cast(stream(), mbf, src.mat());
  host().cast(stream(), mhf, src.mat());
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < ldw; ++c) {
      if (c < C) {
        ASSERT_EQ(bf[size_t(r * ldw + c)], f32_to_bf16(src.at(r, c)));
        ASSERT_EQ(hf[size_t(r * ldw + c)], f32_to_f16(src.at(r, c)));
      } else {
        ASSERT_EQ(bf[size_t(r * ldw + c)], 0xffff);  // padding untouched
      }
    }
  EXPECT_EQ(bf[0], 0x3f80);
  // bf16 -> f32 -> exact; bf16 -> f16 goes through f32.
  HMat back(R, C, C + 1);
  host().cast(stream(), back.mat(), mbf);
  std::vector<uint16_t> hf2(size_t(R * C));
  Mat mhf2(hf2.data(), DType::f16, R, C);
  host().cast(stream(), mhf2, mbf);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      ASSERT_EQ(back.at(r, c), round_bf16(src.at(r, c)));
      ASSERT_EQ(hf2[size_t(r * C + c)], f32_to_f16(round_bf16(src.at(r, c))));
    }
  // f32 -> f32 is a strided copy.
  HMat copy(R, C, C + 5);
  host().cast(stream(), copy.mat(), src.mat());
  EXPECT_EQ(dense(copy.mat()), dense(src.mat()));
  EXPECT_TRUE(copy.padding_intact());
}

TEST(HostAxpy, F32AndBf16Sources) {
  const int64_t R = 22, C = 65;
  HMat dst = HMat::random(R, C, 121, C + 1), src = HMat::random(R, C, 122, C + 4);
  const HMat d0 = dst;
  host().axpy(stream(), dst.mat(), src.mat(), -0.5f);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(dst.at(r, c), d0.at(r, c) + -0.5f * src.at(r, c));
  std::vector<uint16_t> bf(size_t(R * C));
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) bf[size_t(r * C + c)] = f32_to_bf16(src.at(r, c));
  HMat dst2 = d0;
  host().axpy(stream(), dst2.mat(), Mat(bf.data(), DType::bf16, R, C), 2.f);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c)
      ASSERT_EQ(dst2.at(r, c), d0.at(r, c) + 2.f * round_bf16(src.at(r, c)));
  EXPECT_TRUE(dst.padding_intact() && dst2.padding_intact());
}

TEST(HostSumSquares, AccumulatesInDouble) {
  // Wide rows (more than one 4096-element block) and a strided view.
  const int64_t R = 3, C = 10001;
  HMat x = HMat::random(R, C, 131, C + 7);
  double ref = 0;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) ref += double(x.at(r, c)) * x.at(r, c);
  float out = 1.5f;
  host().sum_squares(stream(), &out, x.mat());
  // Double accumulation, one final rounding: 1 ulp of ~1e4 relative (6e-8); bound 1e-7.
  EXPECT_NEAR(out, 1.5 + ref, 1e-7 * ref);
  std::vector<uint16_t> bf(size_t(R * C));
  double ref_bf = 0;
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) {
      bf[size_t(r * C + c)] = f32_to_bf16(x.at(r, c));
      ref_bf += double(round_bf16(x.at(r, c))) * round_bf16(x.at(r, c));
    }
  float out_bf = 0.f;
  host().sum_squares(stream(), &out_bf, Mat(bf.data(), DType::bf16, R, C));
  EXPECT_NEAR(out_bf, ref_bf, 1e-7 * ref_bf);
}

TEST(HostAdamW, HandComputedTwoSteps) {
  // lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.01, grad_scale 0.5.
  // Step 1 (g = 0.5 * grad = [0.2, -0.1]): m = 0.1 g, v = 0.001 g^2, so m_hat/sqrt(v_hat) =
  // sign(g) and p = p (1 - 0.001) - 0.1 sign(g): 1 -> 0.899, -2 -> -1.898.
  // Step 2 (g = [0.2, 0.3]): m = [0.038, 0.021], v = [7.996e-5, 9.999e-5], bc1 = 0.19,
  // bc2 = 0.001999: p = [0.7981010100, -1.9455209911] (evaluated in double by hand/calculator).
  std::vector<float> p = {1.f, -2.f}, m = {0.f, 0.f}, v = {0.f, 0.f}, wout(2, 0.f);
  AdamWStep st;
  st.lr = 0.1f;
  st.weight_decay = 0.01f;
  st.grad_scale = 0.5f;
  st.step = 1;
  std::vector<float> g1 = {0.4f, -0.2f}, g2 = {0.4f, 0.6f};
  host().adamw(stream(), p.data(), m.data(), v.data(), g1.data(), wout.data(), 2, st);
  // fp32 arithmetic against the exact values: a few ulp of O(1) (1e-6).
  EXPECT_NEAR(p[0], 0.899, 1e-6);
  EXPECT_NEAR(p[1], -1.898, 1e-6);
  // m and v carry the fp32 rounding of the constants: 1 - 0.9f is 0.1 (1 + 2.4e-7) and
  // 1 - 0.999f is 0.001 (1 - 1.3e-5), so they are checked to 2e-5 relative.
  EXPECT_NEAR(m[0], 0.02, 2e-5 * 0.02);
  EXPECT_NEAR(v[1], 1e-5, 2e-5 * 1e-5);
  EXPECT_EQ(wout, p);
  st.step = 2;
  host().adamw(stream(), p.data(), m.data(), v.data(), g2.data(), wout.data(), 2, st);
  EXPECT_NEAR(p[0], 0.7981010100, 2e-6);
  EXPECT_NEAR(p[1], -1.9455209911, 2e-6);
  EXPECT_NEAR(m[0], 0.038, 2e-5 * 0.038);
  EXPECT_NEAR(v[1], 9.999e-5, 2e-5 * 9.999e-5);
  EXPECT_EQ(wout, p);
}

TEST(HostAdamW, ExactOperationOrderOnManyElements) {
  // Bit-exact against a transcription of the required fp32 operation order, on enough
  // elements to be split over threads; weights_out may be null.
  const int64_t n = 20001;
  auto p = random_vec(n, 141), m = random_vec(n, 142, -0.1f, 0.1f),
       v = random_vec(n, 143, 0.f, 0.01f), g = random_vec(n, 144, -3.f, 3.f);
  auto p2 = p, m2 = m, v2 = v;
  AdamWStep st;
  st.lr = 3e-4f;
  st.beta1 = 0.8f;
  st.beta2 = 0.95f;
  st.eps = 1e-6f;
  st.weight_decay = 0.1f;
  st.step = 7;
  st.grad_scale = 0.25f;
  host().adamw(stream(), p.data(), m.data(), v.data(), g.data(), nullptr, n, st);
  const double bc1 = 1 - std::pow(double(st.beta1), 7.0), bc2 = 1 - std::pow(double(st.beta2), 7.0);
  const float step_size = float(st.lr / bc1), bc2_sqrt = float(std::sqrt(bc2));
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[size_t(i)] * st.grad_scale;
    m2[size_t(i)] = st.beta1 * m2[size_t(i)] + (1 - st.beta1) * gi;
    v2[size_t(i)] = st.beta2 * v2[size_t(i)] + (1 - st.beta2) * gi * gi;
    float pi = p2[size_t(i)] * (1 - st.lr * st.weight_decay);
    const float denom = std::sqrt(v2[size_t(i)]) / bc2_sqrt + st.eps;
    p2[size_t(i)] = pi - step_size * m2[size_t(i)] / denom;
  }
  EXPECT_EQ(p, p2);
  EXPECT_EQ(m, m2);
  EXPECT_EQ(v, v2);
}

TEST(HostChecks, RejectNonF32AndAcceptOptionalOutputs) {
  // Host compute dtype is f32: a bf16 activation is a caller bug and must throw, not be
  // misread as floats.
  HMat x = HMat::random(4, 8, 151), w = HMat::random(1, 8, 152), out(4, 8);
  std::vector<uint16_t> raw(32);
  Mat bf(raw.data(), DType::bf16, 4, 8);
  EXPECT_THROW(host().rmsnorm_forward(stream(), out.mat(), nullptr, bf, w.mat(), 1e-6f), Error);
  EXPECT_THROW(host().swiglu_forward(stream(), out.mat(), bf, x.mat()), Error);
  EXPECT_THROW(host().bias_add(stream(), bf, w.mat()), Error);
  EXPECT_THROW(host().axpy(stream(), bf, x.mat(), 1.f), Error);  // dst must be f32
  HMat w_bad = HMat::random(1, 3, 153);  // 8 is not a multiple of 3
  EXPECT_THROW(host().rmsnorm_forward(stream(), out.mat(), nullptr, x.mat(), w_bad.mat(), 1e-6f),
               Error);
  // rstd and lse are optional in the forwards (inference / evaluation).
  host().rmsnorm_forward(stream(), out.mat(), nullptr, x.mat(), w.mat(), 1e-6f);
  HMat out2(4, 8);
  std::vector<float> rstd(4);
  host().rmsnorm_forward(stream(), out2.mat(), rstd.data(), x.mat(), w.mat(), 1e-6f);
  EXPECT_EQ(dense(out.mat()), dense(out2.mat()));
  HMat qkv = HMat::random(4, 3 * 8, 154), att(4, 8), att2(4, 8);
  AttentionShape sh{2, 1, 4, 0.5f, 1, 4};
  std::vector<int32_t> cu = {0, 4};
  std::vector<float> lse(8);
  Mat q = qkv.mat().col_block(0, 8), k = qkv.mat().col_block(8, 4), v = qkv.mat().col_block(12, 4);
  host().attention_forward(stream(), att.mat(), nullptr, q, k, v, sh, cu.data());
  host().attention_forward(stream(), att2.mat(), lse.data(), q, k, v, sh, cu.data());
  EXPECT_EQ(dense(att.mat()), dense(att2.mat()));
}
