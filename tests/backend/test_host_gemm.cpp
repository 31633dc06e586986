// HostBackend::gemm against a naive double-precision loop: all four transpose combinations,
// alpha/beta, strided views (ld > cols), beta = 0 not reading c, and a shape large enough for
// OpenBLAS's blocked, multi-threaded path.
#include "backend/host_test_util.h"

using namespace sf;
using namespace sf::test;

namespace {

// c_ref = alpha * op(a) op(b) + beta * c (double).
std::vector<double> naive_gemm(HMat& a, Trans ta, HMat& b, Trans tb, HMat& c, float alpha,
                               float beta) {
  const int64_t M = c.rows, N = c.cols, K = ta == Trans::no ? a.cols : a.rows;
  std::vector<double> r(size_t(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double av = ta == Trans::no ? a.at(i, k) : a.at(k, i);
        const double bv = tb == Trans::no ? b.at(k, j) : b.at(j, k);
        s += av * bv;
      }
      r[size_t(i * N + j)] = double(alpha) * s + (beta == 0.f ? 0.0 : double(beta) * c.at(i, j));
    }
  return r;
}

void check_gemm(int64_t M, int64_t N, int64_t K, Trans ta, Trans tb, float alpha, float beta,
                uint64_t seed, double tol) {
  SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K " << K << " ta "
                                  << int(ta) << " tb " << int(tb) << " beta " << beta);
  // Stored shapes of a and b depend on the transposes; every matrix gets a padded stride.
  HMat a = ta == Trans::no ? HMat::random(M, K, seed, K + 3) : HMat::random(K, M, seed, M + 5);
  HMat b = tb == Trans::no ? HMat::random(K, N, seed + 1, N + 2)
                           : HMat::random(N, K, seed + 1, K + 7);
  HMat c = HMat::random(M, N, seed + 2, N + 4);
  if (beta == 0.f) c.fill(std::nanf(""));  // beta = 0 must overwrite, never read c
  auto ref = naive_gemm(a, ta, b, tb, c, alpha, beta);
  host().gemm(stream(), c.mat(), a.mat(), ta, b.mat(), tb, alpha, beta);
  int bad = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      if (!(std::fabs(c.at(i, j) - ref[size_t(i * N + j)]) <= tol) && bad++ < 5)
        ADD_FAILURE() << "c[" << i << "," << j << "] = " << c.at(i, j) << ", expected "
                      << ref[size_t(i * N + j)];
  EXPECT_EQ(bad, 0);
  EXPECT_TRUE(c.padding_intact() && a.padding_intact() && b.padding_intact());
}

}  // namespace

TEST(HostGemm, AllTransposesStridedAlphaBeta) {
  // Tolerance: fp32 dot products of K = 13 terms in (-1, 1): rounding error below
  // K * 2^-24 * sum|a b| < 1e-6; plus beta*c rounding. 1e-5 leaves room, catches any real error.
  uint64_t seed = 100;
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes}) {
      check_gemm(22, 67, 13, ta, tb, 0.7f, -1.3f, seed++, 1e-5);
      check_gemm(65, 1, 9, ta, tb, 1.f, 1.f, seed++, 1e-5);  // single column (gemv-like)
      check_gemm(1, 65, 9, ta, tb, -2.f, 0.5f, seed++, 1e-5);  // single row
      check_gemm(22, 67, 13, ta, tb, 1.f, 0.f, seed++, 1e-5);  // overwrite (c is NaN)
    }
}

TEST(HostGemm, LargeBlockedPath) {
  // K = 300: each element sums 300 products of magnitude < 1; fp32 error grows like
  // sqrt(K) * 2^-24 * |sum| (< 1e-4 abs with |sum| ~ 10); 5e-4 is a safe bound.
  check_gemm(130, 257, 300, Trans::no, Trans::yes, 1.f, 1.f, 7, 5e-4);
  check_gemm(257, 130, 300, Trans::yes, Trans::no, 0.5f, 0.f, 8, 5e-4);
  // More than one tile along both M (128) and N (512), every transpose combination: the tile
  // offsets into op(a) and op(b) must honour ld and the transposes. K = 40: 1e-5 as above.
  uint64_t seed = 20;
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes}) check_gemm(131, 601, 40, ta, tb, 1.f, 0.5f, seed++, 1e-5);
}

TEST(HostGemm, EmptyInnerDimensionScalesC) {
  HMat a(4, 0), b(0, 3), c = HMat::random(4, 3, 9, 5);
  HMat c0 = c;
  host().gemm(stream(), c.mat(), a.mat(), Trans::no, b.mat(), Trans::no, 1.f, 2.f);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(c.at(i, j), 2.f * c0.at(i, j));
}

TEST(HostGemm, RejectsMismatchedShapes) {
  HMat a = HMat::random(4, 5, 1), b = HMat::random(6, 3, 2), c(4, 3);
  EXPECT_THROW(host().gemm(stream(), c.mat(), a.mat(), Trans::no, b.mat(), Trans::no, 1.f, 0.f),
               Error);
  HMat b2 = HMat::random(5, 3, 3);
  host().gemm(stream(), c.mat(), a.mat(), Trans::no, b2.mat(), Trans::no, 1.f, 0.f);  // fine
  Mat bf = b2.mat();
  bf.dtype = DType::bf16;
  EXPECT_THROW(host().gemm(stream(), c.mat(), a.mat(), Trans::no, bf, Trans::no, 1.f, 0.f), Error);
}
