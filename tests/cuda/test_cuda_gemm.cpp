// CudaBackend::gemm (cuBLASLt) against the host sgemm on the same bf16-rounded inputs.
#include "backend/cuda/gemm_lt.h"
#include "cuda_test_util.h"

namespace sf::test {
namespace {

struct GemmCase {
  int64_t M, N, K;
  Trans ta, tb;
  DType ct;
  float alpha, beta;
  int64_t pad;  // extra columns (guards) on every operand: strided views
};

std::string name(const GemmCase& c) {
  return cat("gemm M", c.M, " N", c.N, " K", c.K, c.ta == Trans::yes ? " aT" : " aN",
             c.tb == Trans::yes ? " bT" : " bN", " c=", dtype_name(c.ct), " a", c.alpha, " b",
             c.beta, " pad", c.pad);
}

void run_case(const GemmCase& c, uint64_t seed, bool small_ints) {
  SCOPED_TRACE(name(c));
  const int64_t ar = c.ta == Trans::no ? c.M : c.K, ac = c.ta == Trans::no ? c.K : c.M;
  const int64_t br = c.tb == Trans::no ? c.K : c.N, bc = c.tb == Trans::no ? c.N : c.K;
  auto gen = [&](size_t n, uint64_t s) {
    if (!small_ints) return rand_bf16(n, s);
    auto v = random_vec(n, s, -3.f, 4.f);
    for (auto& x : v) x = std::floor(x);
    return v;
  };
  auto va = gen(size_t(ar * ac), seed), vb = gen(size_t(br * bc), seed + 1);
  auto vc = gen(size_t(c.M * c.N), seed + 2);
  if (c.ct == DType::bf16) vc = round_all_bf16(vc);

  DevMat a(DType::bf16, ar, ac, ac + c.pad), b(DType::bf16, br, bc, bc + c.pad),
      cc(c.ct, c.M, c.N, c.N + c.pad);
  a.upload(va);
  b.upload(vb);
  if (c.beta != 0.f) cc.upload(vc);
  else cc.poison();  // beta == 0: c must be overwritten, NaN in it must not propagate
  gpu().gemm(gs(), cc.m, a.m, c.ta, b.m, c.tb, c.alpha, c.beta);

  HostMat ha(ar, ac, va), hb(br, bc, vb), hc(c.M, c.N, vc);
  host().gemm(hs(), hc.m, ha.m, c.ta, hb.m, c.tb, c.alpha, c.beta);

  auto got = cc.download();
  if (small_ints) {
    expect_bitwise(name(c) + " (small ints)", got, hc.v);
  } else {
    // f32 output: bf16 products are exact in f32, only the summation order differs (~1e-6).
    // bf16 output: one rounding to bf16 (relative 2^-9 per element, ~1.1e-3 RMS).
    expect_close(name(c), got, c.ct == DType::f32 ? hc.v : round_all_bf16(hc.v),
                 c.ct == DType::f32 ? 1e-5 : 5e-3);
  }
  EXPECT_TRUE(a.guards_intact() && b.guards_intact() && cc.guards_intact());
}

TEST(CudaGemm, AllTransposesOddShapes) {
  SF_REQUIRE_GPU();
  uint64_t seed = 100;
  for (Trans ta : {Trans::no, Trans::yes})
    for (Trans tb : {Trans::no, Trans::yes})
      for (DType ct : {DType::bf16, DType::f32}) {
        run_case({22, 65, 40, ta, tb, ct, 1.f, 0.f, 0}, seed++, false);
        run_case({65, 22, 130, ta, tb, ct, 0.5f, 1.f, 3}, seed++, false);
        run_case({64, 128, 96, ta, tb, ct, 1.f, 0.f, 8}, seed++, false);
      }
}

TEST(CudaGemm, SmallIntegersAreExact) {
  SF_REQUIRE_GPU();
  // Integer products and sums below 2^8 (bf16) / 2^24 (f32) are exact in any order.
  run_case({48, 72, 64, Trans::no, Trans::yes, DType::f32, 1.f, 0.f, 8}, 7, true);
  run_case({48, 72, 64, Trans::yes, Trans::no, DType::f32, 1.f, 1.f, 0}, 8, true);
  run_case({16, 24, 8, Trans::no, Trans::no, DType::bf16, 1.f, 0.f, 0}, 9, true);
}

TEST(CudaGemm, LlamaShapes) {
  SF_REQUIRE_GPU();
  // x[T, C] @ W^T[C, 3C/2] (the fused qkv projection, 256 tokens), dx = dy @ W, and the f32
  // weight-gradient accumulation dW += dy^T @ x.
  run_case({256, 6144, 4096, Trans::no, Trans::yes, DType::bf16, 1.f, 0.f, 0}, 11, false);
  run_case({256, 4096, 6144, Trans::no, Trans::no, DType::bf16, 1.f, 0.f, 0}, 12, false);
  run_case({1024, 4096, 256, Trans::yes, Trans::no, DType::f32, 1.f, 1.f, 0}, 13, false);
}

// The first call of a problem times the heuristic's candidates on the call's own buffers
// (GemmLt's tuning): its result, and every later call's, must be what the heuristic's first
// choice computes (up to summation order: a bf16 rounding apart at most), and a problem that
// accumulates into c (beta 1) must accumulate exactly once.
TEST(CudaGemm, TuningKeepsResults) {
  SF_REQUIRE_GPU();
  const size_t ws_bytes = size_t(32) << 20;
  auto ws = gpu().alloc(ws_bytes, "test gemm workspace");
  cudaStream_t s = CudaBackend::cuda_stream(gs());
  cuda::GemmLt tuned(true), plain(false);
  const int64_t T = 2048, N = 6144, K = 4096;
  DevMat x(DType::bf16, T, K), w(DType::bf16, N, K), y1(DType::bf16, T, N), y2(DType::bf16, T, N),
      y3(DType::bf16, T, N);
  x.upload(rand_bf16(size_t(T * K), 71));
  w.upload(rand_bf16(size_t(N * K), 72));
  y1.poison();
  y2.poison();
  y3.poison();
  tuned.run(s, ws->data(), ws_bytes, y1.m, x.m, Trans::no, w.m, Trans::yes, 1.f, 0.f);
  tuned.run(s, ws->data(), ws_bytes, y2.m, x.m, Trans::no, w.m, Trans::yes, 1.f, 0.f);
  plain.run(s, ws->data(), ws_bytes, y3.m, x.m, Trans::no, w.m, Trans::yes, 1.f, 0.f);
  const auto a = y1.download(), b = y2.download(), c = y3.download();
  expect_bitwise("tuned gemm, first and second call", a, b);
  expect_close("tuned vs heuristic gemm", a, c, 2e-3);

  // dW += dy^T x on f32 (beta 1) through the tuning GemmLt: exactly one accumulation.
  DevMat dw(DType::f32, N, K), dw_ref(DType::f32, N, K);
  const auto init = random_vec(size_t(N * K), 73);
  dw.upload(init);
  dw_ref.upload(init);
  tuned.run(s, ws->data(), ws_bytes, dw.m, y1.m, Trans::yes, x.m, Trans::no, 1.f, 1.f);
  plain.run(s, ws->data(), ws_bytes, dw_ref.m, y1.m, Trans::yes, x.m, Trans::no, 1.f, 1.f);
  expect_bitwise("tuned vs heuristic dW accumulation (same algorithm)", dw.download(),
                 dw_ref.download());
  EXPECT_EQ(tuned.cached_plans(), 2u);
}

TEST(CudaGemm, EmptyKScalesC) {
  SF_REQUIRE_GPU();
  DevMat a(DType::bf16, 5, 0), b(DType::bf16, 0, 7), c(DType::f32, 5, 7);
  auto vc = random_vec(35, 3);
  c.upload(vc);
  gpu().gemm(gs(), c.m, a.m, Trans::no, b.m, Trans::no, 1.f, 0.5f);
  for (auto& x : vc) x *= 0.5f;
  expect_bitwise("gemm K=0 beta 0.5", c.download(), vc);
}

TEST(CudaGemm, RejectsWrongShapes) {
  SF_REQUIRE_GPU();
  DevMat a(DType::bf16, 4, 8), b(DType::bf16, 9, 4), c(DType::bf16, 4, 4);
  EXPECT_THROW(gpu().gemm(gs(), c.m, a.m, Trans::no, b.m, Trans::no, 1.f, 0.f), Error);
}

}  // namespace
}  // namespace sf::test
