// RMSNorm (plain, grouped per head, fused residual, backward), RoPE and SwiGLU on the GPU
// against the host reference on the same bf16-rounded inputs.
//
// Tolerances: outputs are bf16, so each element carries one rounding (relative 2^-9 at most,
// ~1.1e-3 RMS): 5e-3 relative L2 leaves room for f32 reduction-order differences. f32
// statistics (rstd) and f32 accumulations (dw) are compared at 1e-4 / 1e-3.
#include <cmath>
#include <tuple>

#include "cuda_test_util.h"

namespace sf::test {
namespace {

constexpr double kBf16Tol = 5e-3;

struct NormCase {
  int64_t T, C, D, pad;  // x [T, C], weight [1, D], C % D == 0
};

std::string nname(const char* op, const NormCase& c) {
  return cat(op, " T", c.T, " C", c.C, " D", c.D, " pad", c.pad);
}

const NormCase kNormCases[] = {{22, 65, 65, 0},    {65, 22, 22, 3},     {7, 4096, 4096, 0},
                               {33, 4096, 4096, 8}, {64, 4096, 128, 0},  {9, 1024, 64, 2048},
                               {5, 8192, 8192, 0},  {129, 5120, 5120, 0},
                               // wider than the register-cached backward: the looping kernels
                               {3, 12288, 12288, 0}, {4, 1031, 1031, 0},
                               // per-head norms on a strided q block (many groups per block,
                               // a partial last iteration), a 32-lane group (D = 256), and
                               // more rows than resident backward blocks (dw over many rows)
                               {1031, 4096, 128, 2048}, {33, 1024, 256, 8},
                               {1100, 4096, 4096, 0}};

TEST(CudaRmsNorm, Forward) {
  SF_REQUIRE_GPU();
  uint64_t seed = 1;
  for (const NormCase& c : kNormCases) {
    SCOPED_TRACE(nname("rmsnorm_forward", c));
    const int64_t G = c.C / c.D;
    auto vx = rand_bf16(size_t(c.T * c.C), seed++, -2.f, 2.f);
    auto vw = rand_bf16(size_t(c.D), seed++, 0.5f, 1.5f);
    DevMat x(DType::bf16, c.T, c.C, c.C + c.pad), w(DType::bf16, 1, c.D),
        out(DType::bf16, c.T, c.C, c.C + c.pad), rstd(DType::f32, 1, c.T * G);
    x.upload(vx);
    w.upload(vw);
    out.poison();
    rstd.poison();
    gpu().rmsnorm_forward(gs(), out.m, rstd.m.as<float>(), x.m, w.m, 1e-5f);
    HostMat hx(c.T, c.C, vx), hw(1, c.D, vw), ho(c.T, c.C), hr(1, c.T * G);
    host().rmsnorm_forward(hs(), ho.m, hr.v.data(), hx.m, hw.m, 1e-5f);
    expect_close(nname("rmsnorm_forward out", c), out.download(), ho.v, kBf16Tol);
    expect_close(nname("rmsnorm_forward rstd", c), rstd.download(), hr.v, 1e-5);
    EXPECT_TRUE(out.guards_intact());
  }
}

TEST(CudaRmsNorm, AddForwardInPlace) {
  SF_REQUIRE_GPU();
  uint64_t seed = 100;
  for (const NormCase& c : kNormCases) {
    SCOPED_TRACE(nname("add_rmsnorm_forward", c));
    const int64_t G = c.C / c.D;
    auto va = rand_bf16(size_t(c.T * c.C), seed++), vb = rand_bf16(size_t(c.T * c.C), seed++);
    auto vw = rand_bf16(size_t(c.D), seed++, 0.5f, 1.5f);
    // sum aliases a (the residual stream is updated in place).
    DevMat a(DType::bf16, c.T, c.C, c.C + c.pad), b(DType::bf16, c.T, c.C),
        w(DType::bf16, 1, c.D), out(DType::bf16, c.T, c.C), rstd(DType::f32, 1, c.T * G);
    a.upload(va);
    b.upload(vb);
    w.upload(vw);
    out.poison();
    rstd.poison();
    gpu().add_rmsnorm_forward(gs(), a.m, out.m, rstd.m.as<float>(), a.m, b.m, w.m, 1e-6f);
    // The GPU normalises the bf16-rounded sum it stores; give the host the same sum.
    std::vector<float> vs(va.size());
    for (size_t i = 0; i < va.size(); ++i) vs[i] = round_bf16(va[i] + vb[i]);
    HostMat hs_(c.T, c.C), ho(c.T, c.C), hr(1, c.T * G), hz(c.T, c.C), hsum(c.T, c.C, vs),
        hw(1, c.D, vw);
    host().add_rmsnorm_forward(hs(), hs_.m, ho.m, hr.v.data(), hsum.m, hz.m, hw.m, 1e-6f);
    expect_close(nname("add_rmsnorm_forward sum", c), a.download(), vs, 0.0);
    expect_close(nname("add_rmsnorm_forward out", c), out.download(), ho.v, kBf16Tol);
    expect_close(nname("add_rmsnorm_forward rstd", c), rstd.download(), hr.v, 1e-5);
    EXPECT_TRUE(a.guards_intact());
  }
}

TEST(CudaRmsNorm, Backward) {
  SF_REQUIRE_GPU();
  uint64_t seed = 300;
  for (const NormCase& c : kNormCases)
    for (int variant = 0; variant < 3; ++variant) {
      // 0: no dres, dw wanted; 1: dres aliased by dx, dw wanted; 2: dres separate, no dw.
      const bool has_dres = variant > 0, alias = variant == 1, want_dw = variant < 2;
      const std::string what = nname("rmsnorm_backward", c) + cat(" variant ", variant);
      SCOPED_TRACE(what);
      const int64_t G = c.C / c.D;
      auto vx = rand_bf16(size_t(c.T * c.C), seed++, -2.f, 2.f);
      auto vd = rand_bf16(size_t(c.T * c.C), seed++);
      auto vr = rand_bf16(size_t(c.T * c.C), seed++);
      auto vw = rand_bf16(size_t(c.D), seed++, 0.5f, 1.5f);
      auto vdw = random_vec(size_t(c.D), seed++);
      // rstd from the host forward on the same x, shared by both backends.
      HostMat hx(c.T, c.C, vx), hw(1, c.D, vw), hfo(c.T, c.C), hr(1, c.T * G);
      host().rmsnorm_forward(hs(), hfo.m, hr.v.data(), hx.m, hw.m, 1e-5f);

      DevMat x(DType::bf16, c.T, c.C, c.C + c.pad), w(DType::bf16, 1, c.D),
          dout(DType::bf16, c.T, c.C), dres(DType::bf16, c.T, c.C, c.C + c.pad),
          dx(DType::bf16, c.T, c.C, c.C + c.pad), dw(DType::f32, 1, c.D),
          rstd(DType::f32, 1, c.T * G);
      x.upload(vx);
      w.upload(vw);
      dout.upload(vd);
      dres.upload(vr);
      dw.upload(vdw);
      rstd.upload(hr.v);
      dx.poison();
      const Mat out = alias ? dres.m : dx.m;
      gpu().rmsnorm_backward(gs(), out, want_dw ? dw.m : Mat(), dout.m, x.m, w.m,
                             rstd.m.as<float>(), has_dres ? dres.m : Mat());
      HostMat hdx(c.T, c.C), hdw(1, c.D, vdw), hdo(c.T, c.C, vd), hdr(c.T, c.C, vr);
      host().rmsnorm_backward(hs(), hdx.m, want_dw ? hdw.m : Mat(), hdo.m, hx.m, hw.m,
                              hr.v.data(), has_dres ? hdr.m : Mat());
      expect_close(what + " dx", alias ? dres.download() : dx.download(), hdx.v, kBf16Tol);
      // f32 sums over T rows of bf16 products, different order from the host's double sums.
      expect_close(what + " dw", dw.download(), hdw.v, 1e-4);
      EXPECT_TRUE(dx.guards_intact() && dres.guards_intact());
    }
}

// dw is reduced through per-block partials in a fixed order: two runs agree bit for bit.
TEST(CudaRmsNorm, BackwardDwRepeatable) {
  SF_REQUIRE_GPU();
  for (auto [T, C, D] : {std::tuple<int64_t, int64_t, int64_t>{1100, 4096, 4096},
                         {777, 4096, 128}}) {
    const std::string what = cat("rmsnorm_backward dw repeatable T", T, " C", C, " D", D);
    SCOPED_TRACE(what);
    const int64_t G = C / D;
    auto vx = rand_bf16(size_t(T * C), 11, -2.f, 2.f), vd = rand_bf16(size_t(T * C), 12);
    auto vw = rand_bf16(size_t(D), 13, 0.5f, 1.5f);
    DevMat x(DType::bf16, T, C), dout(DType::bf16, T, C), w(DType::bf16, 1, D),
        dx(DType::bf16, T, C), rstd(DType::f32, 1, T * G);
    x.upload(vx);
    dout.upload(vd);
    w.upload(vw);
    gpu().rmsnorm_forward(gs(), dx.m, rstd.m.as<float>(), x.m, w.m, 1e-5f);
    std::vector<std::vector<float>> dws;
    for (int run = 0; run < 2; ++run) {
      DevMat dw(DType::f32, 1, D);
      dw.upload(std::vector<float>(size_t(D), 0.f));
      gpu().rmsnorm_backward(gs(), dx.m, dw.m, dout.m, x.m, w.m, rstd.m.as<float>(), Mat());
      dws.push_back(dw.download());
    }
    expect_bitwise(what, dws[1], dws[0]);
  }
}

// inv_freq as Llama computes it (theta 500000), in f32.
std::vector<float> inv_freq(int D, double theta = 500000.0) {
  std::vector<float> f(size_t(D / 2));
  for (int i = 0; i < D / 2; ++i) f[size_t(i)] = float(1.0 / std::pow(theta, 2.0 * i / D));
  return f;
}

TEST(CudaRope, ForwardAndBackward) {
  SF_REQUIRE_GPU();
  struct Case {
    int64_t T;
    int H, D;
    int64_t ld;  // row stride (a q or k column block of the qkv output when > H*D)
  };
  uint64_t seed = 500;
  for (const Case& c : {Case{22, 3, 22, 66}, Case{65, 4, 64, 256}, Case{300, 32, 128, 6144},
                        Case{129, 8, 128, 1024}, Case{17, 5, 128, 1000}}) {
    for (bool backward : {false, true}) {
      const std::string what = cat(backward ? "rope_backward" : "rope_forward", " T", c.T, " H",
                                   c.H, " D", c.D, " ld", c.ld);
      SCOPED_TRACE(what);
      const int64_t C = int64_t(c.H) * c.D;
      auto vx = rand_bf16(size_t(c.T * C), seed++);
      std::vector<int32_t> pos(size_t(c.T));
      for (int64_t t = 0; t < c.T; ++t) pos[size_t(t)] = int32_t((t * 37) % 8192);  // up to 8K
      auto freq = inv_freq(c.D);
      DevMat x(DType::bf16, c.T, C, c.ld);
      x.upload(vx);
      DevArray<int32_t> dpos(pos);
      DevArray<float> dfreq(freq);
      if (backward)
        gpu().rope_backward(gs(), x.m, c.H, c.D, dpos.ptr(), dfreq.ptr());
      else
        gpu().rope_forward(gs(), x.m, c.H, c.D, dpos.ptr(), dfreq.ptr());
      HostMat hx(c.T, C, vx);
      if (backward)
        host().rope_backward(hs(), hx.m, c.H, c.D, pos.data(), freq.data());
      else
        host().rope_forward(hs(), hx.m, c.H, c.D, pos.data(), freq.data());
      expect_close(what, x.download(), hx.v, kBf16Tol);
      EXPECT_TRUE(x.guards_intact());
    }
  }
}

TEST(CudaSwiglu, ForwardAndBackwardOnFusedBlocks) {
  SF_REQUIRE_GPU();
  uint64_t seed = 700;
  for (auto [T, F] : {std::pair<int64_t, int64_t>{22, 65}, {65, 22}, {64, 14336}, {7, 8},
                      {100, 1000}}) {
    const std::string what = cat("swiglu T", T, " F", F);
    SCOPED_TRACE(what);
    // gate = columns [0, F) and up = [F, 2F) of one [T, 2F] matrix, as the fused GEMM writes.
    auto vgu = rand_bf16(size_t(T * 2 * F), seed++, -4.f, 4.f);
    auto vd = rand_bf16(size_t(T * F), seed++);
    DevMat gu(DType::bf16, T, 2 * F), out(DType::bf16, T, F, F + 3), dout(DType::bf16, T, F);
    gu.upload(vgu);
    dout.upload(vd);
    out.poison();
    const Mat gate = gu.m.col_block(0, F), up = gu.m.col_block(F, F);
    gpu().swiglu_forward(gs(), out.m, gate, up);
    std::vector<float> vg(size_t(T * F)), vu(size_t(T * F));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t f = 0; f < F; ++f) {
        vg[size_t(t * F + f)] = vgu[size_t(t * 2 * F + f)];
        vu[size_t(t * F + f)] = vgu[size_t(t * 2 * F + F + f)];
      }
    HostMat hg(T, F, vg), hu(T, F, vu), ho(T, F), hdo(T, F, vd), hdg(T, F), hdu(T, F);
    host().swiglu_forward(hs(), ho.m, hg.m, hu.m);
    expect_close(what + " forward", out.download(), ho.v, kBf16Tol);
    EXPECT_TRUE(out.guards_intact());

    // Backward in place: dgate/dup overwrite gate/up (the recipe reuses the buffer).
    gpu().swiglu_backward(gs(), gate, up, dout.m, gate, up);
    host().swiglu_backward(hs(), hdg.m, hdu.m, hdo.m, hg.m, hu.m);
    auto got = gu.download();
    std::vector<float> gdg(size_t(T * F)), gdu(size_t(T * F));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t f = 0; f < F; ++f) {
        gdg[size_t(t * F + f)] = got[size_t(t * 2 * F + f)];
        gdu[size_t(t * F + f)] = got[size_t(t * 2 * F + F + f)];
      }
    expect_close(what + " dgate", gdg, hdg.v, kBf16Tol);
    expect_close(what + " dup", gdu, hdu.v, kBf16Tol);
  }
}

}  // namespace
}  // namespace sf::test
