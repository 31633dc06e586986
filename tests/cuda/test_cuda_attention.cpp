// Flash attention (forward, backward) on the GPU against the host reference (double
// accumulation) on the same bf16-rounded inputs. q/k/v are column blocks of one fused qkv
// matrix and dq/dk/dv column blocks of one dqkv matrix, as in the model.
//
// Every case runs with each kernel family the GPU has (wgmma on Hopper, with either forward;
// mma.sync everywhere).
//
// Tolerances: out/dq/dk/dv are bf16 (one rounding, ~1.1e-3 RMS) and the GPU also rounds P and
// dS to bf16 for the tensor-core products (as FlashAttention does): 1e-2 relative L2 for the
// gradients, 5e-3 for out; lse is f32 from f32 sums: 1e-5.
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cudnn_attention.h"
#include "backend/cuda/dq_acc_layout.h"
#include "attention_test_util.h"
#include "cuda_test_util.h"
#include "scoped_env.h"

namespace sf::test {
namespace {

using sf::test::AttnCase;
using sf::test::attn_layout;
using sf::test::cols;
std::string aname(const AttnCase& c) { return sf::test::attn_case_name("attention", c); }

void run_case_with(const AttnCase& c, uint64_t seed, const std::string& kernels) {
  const std::string what = aname(c) + " (" + kernels + ")";
  SCOPED_TRACE(what);
  const auto [cu, T, qd, kvd, W, sh] = attn_layout(c);

  auto vqkv = rand_bf16(size_t(T * W), seed, -2.f, 2.f);
  auto vdo = rand_bf16(size_t(T * qd), seed + 1);
  DevMat qkv(DType::bf16, T, W), out(DType::bf16, T, qd, qd + 8), dout(DType::bf16, T, qd),
      lse(DType::f32, c.Hq, T), dqkv(DType::bf16, T, W, W + 8);
  qkv.upload(vqkv);
  dout.upload(vdo);
  out.poison();
  lse.poison();
  dqkv.poison();
  DevArray<int32_t> dcu(cu);
  const Mat q = qkv.m.col_block(0, qd), k = qkv.m.col_block(qd, kvd), v = qkv.m.col_block(qd + kvd, kvd);
  gpu().attention_forward(gs(), out.m, lse.m.as<float>(), q, k, v, sh, dcu.ptr());

  HostMat hq(T, qd, cols(vqkv, T, W, 0, qd)), hk(T, kvd, cols(vqkv, T, W, qd, kvd)),
      hv(T, kvd, cols(vqkv, T, W, qd + kvd, kvd)), ho(T, qd), hl(c.Hq, T), hdo(T, qd, vdo),
      hdq(T, qd), hdk(T, kvd), hdv(T, kvd);
  host().attention_forward(hs(), ho.m, hl.v.data(), hq.m, hk.m, hv.m, sh, cu.data());
  auto gout = out.download();
  expect_close(what + " out", gout, ho.v, 5e-3);
  expect_close(what + " lse", lse.download(), hl.v, 1e-5);
  EXPECT_TRUE(out.guards_intact());

  // Backward from the GPU's own out/lse (what training does); the host gets the same bf16 out.
  const Mat dq = dqkv.m.col_block(0, qd), dk = dqkv.m.col_block(qd, kvd),
            dv = dqkv.m.col_block(qd + kvd, kvd);
  gpu().attention_backward(gs(), dq, dk, dv, dout.m, out.m, lse.m.as<float>(), q, k, v, sh,
                           dcu.ptr());
  HostMat hout(T, qd, gout);
  host().attention_backward(hs(), hdq.m, hdk.m, hdv.m, hdo.m, hout.m, hl.v.data(), hq.m, hk.m,
                            hv.m, sh, cu.data());
  auto g = dqkv.download();
  expect_close(what + " dq", cols(g, T, W, 0, qd), hdq.v, 1e-2);
  expect_close(what + " dk", cols(g, T, W, qd, kvd), hdk.v, 1e-2);
  expect_close(what + " dv", cols(g, T, W, qd + kvd, kvd), hdv.v, 1e-2);
  EXPECT_TRUE(dqkv.guards_intact());

  // Deterministic: a second backward gives the same bits.
  DevMat dqkv2(DType::bf16, T, W, W + 8);
  dqkv2.poison();
  gpu().attention_backward(gs(), dqkv2.m.col_block(0, qd), dqkv2.m.col_block(qd, kvd),
                           dqkv2.m.col_block(qd + kvd, kvd), dout.m, out.m, lse.m.as<float>(), q,
                           k, v, sh, dcu.ptr());
  expect_bitwise(what + " backward repeat", dqkv2.download(), g);
}

// Each kernel family this GPU runs: wgmma (compute capability 9) and mma.sync (every GPU).
// Our kernels, not cuDNN's (test_cuda_cudnn_attention.cpp covers those).
void run_case(const AttnCase& c, uint64_t seed) {
  const cuda::AttentionImpl impl = cuda::attention_impl();
  cuda::set_attention_impl(cuda::AttentionImpl::native);
  if (cuda::set_attention_wgmma(true)) {
    cuda::set_attention_ws_forward(false);
    run_case_with(c, seed, "wgmma");
  }
  if (cuda::set_attention_ws_forward(true))
    run_case_with(c, seed, "wgmma, warp-specialised forward");
  cuda::set_attention_wgmma(false);
  run_case_with(c, seed, "mma.sync");
  cuda::set_attention_wgmma(true);  // the defaults (where the device has them)
  cuda::set_attention_impl(impl);
}

TEST(CudaAttention, HeadDim64OddLengths) {
  SF_REQUIRE_GPU();
  run_case({4, 2, 64, {1, 65, 130, 22}}, 1);
  run_case({2, 2, 64, {64}}, 2);
  run_case({6, 1, 64, {200, 3}}, 3);
}

TEST(CudaAttention, HeadDim128OddLengths) {
  SF_REQUIRE_GPU();
  run_case({8, 2, 128, {200, 64, 1, 17}}, 4);
  run_case({4, 4, 128, {129}}, 5);
}

TEST(CudaAttention, LlamaHeads) {
  SF_REQUIRE_GPU();
  run_case({32, 8, 128, {512, 300}}, 6);
}

// Many packed sequences of odd lengths (1, tile edges +-1, longer than a 128-row query tile),
// GQA, both head dims.
TEST(CudaAttention, ManyOddSequences) {
  SF_REQUIRE_GPU();
  run_case({8, 4, 128, {300, 77, 129, 1, 64, 33, 128, 127, 191, 192, 193}}, 7);
  run_case({6, 3, 64, {1, 2, 3, 63, 64, 65, 127, 129, 33, 31, 250, 256, 257}}, 8);
}

// The one-pass backward with atomic dQ (launch_attention_backward_atomic) against the host
// reference, from the GPU's own forward. Its dk/dv come from the deterministic backward's
// arithmetic in the same order, so they must match that backward's bit for bit; dq's f32 sums
// arrive in a varying order: a repeat agrees to 1e-3 (bf16 rounding of nearly equal sums).
void run_atomic_case_with(const AttnCase& c, uint64_t seed, const std::string& kernel) {
  const std::string what = aname(c) + " (atomic dQ, " + kernel + ")";
  SCOPED_TRACE(what);
  const auto [cu, T, qd, kvd, W, sh] = attn_layout(c);
  auto vqkv = rand_bf16(size_t(T * W), seed, -2.f, 2.f);
  auto vdo = rand_bf16(size_t(T * qd), seed + 1);
  DevMat qkv(DType::bf16, T, W), out(DType::bf16, T, qd), dout(DType::bf16, T, qd),
      lse(DType::f32, c.Hq, T);
  qkv.upload(vqkv);
  dout.upload(vdo);
  DevArray<int32_t> dcu(cu);
  const Mat q = qkv.m.col_block(0, qd), k = qkv.m.col_block(qd, kvd),
            v = qkv.m.col_block(qd + kvd, kvd);
  gpu().attention_forward(gs(), out.m, lse.m.as<float>(), q, k, v, sh, dcu.ptr());
  const size_t ws_bytes = cuda::attention_backward_atomic_workspace_bytes(T, sh);
  auto ws = gpu().alloc(ws_bytes, "atomic dQ workspace");
  auto backward = [&](DevMat& g, bool atomic) {
    g.poison();
    const Mat dq = g.m.col_block(0, qd), dk = g.m.col_block(qd, kvd),
              dv = g.m.col_block(qd + kvd, kvd);
    cudaStream_t st = CudaBackend::cuda_stream(gs());
    // NaN in every workspace byte: what the pass reads must be what it wrote (or zeroed).
    if (atomic) CUDA_CHECK(cudaMemsetAsync(ws->data(), 0xff, ws_bytes, st));
    if (atomic)
      cuda::launch_attention_backward_atomic(st, dq, dk, dv, dout.m, out.m, lse.m.as<float>(), q,
                                             k, v, sh, dcu.ptr(),
                                             static_cast<float*>(ws->data()), ws_bytes);
    else
      cuda::launch_attention_backward(st, dq, dk, dv, dout.m, out.m, lse.m.as<float>(), q, k, v,
                                      sh, dcu.ptr());
    return g.download();
  };
  DevMat g1(DType::bf16, T, W, W + 8), g2(DType::bf16, T, W, W + 8), gd(DType::bf16, T, W, W + 8);
  const auto a1 = backward(g1, true), a2 = backward(g2, true), det = backward(gd, false);
  EXPECT_TRUE(g1.guards_intact());

  const auto gout = out.download();
  const auto hl = lse.download();
  HostMat hq(T, qd, cols(vqkv, T, W, 0, qd)), hk(T, kvd, cols(vqkv, T, W, qd, kvd)),
      hv(T, kvd, cols(vqkv, T, W, qd + kvd, kvd)), hout(T, qd, gout), hdo(T, qd, vdo),
      hdq(T, qd), hdk(T, kvd), hdv(T, kvd);
  host().attention_backward(hs(), hdq.m, hdk.m, hdv.m, hdo.m, hout.m, hl.data(), hq.m, hk.m,
                            hv.m, sh, cu.data());
  expect_close(what + " dq", cols(a1, T, W, 0, qd), hdq.v, 1e-2);
  expect_close(what + " dk", cols(a1, T, W, qd, kvd), hdk.v, 1e-2);
  expect_close(what + " dv", cols(a1, T, W, qd + kvd, kvd), hdv.v, 1e-2);
  expect_close(what + " dq repeat", cols(a2, T, W, 0, qd), cols(a1, T, W, 0, qd), 1e-3);
  expect_bitwise(what + " dk, dv = the deterministic backward's",
                 cols(a1, T, W, qd, 2 * kvd), cols(det, T, W, qd, 2 * kvd));
}

// Both forms of the pass: the warp-specialised kernel and the wgmma dk/dv kernel's.
void run_atomic_case(const AttnCase& c, uint64_t seed) {
  cuda::set_attention_ws_backward(false);
  run_atomic_case_with(c, seed, "wgmma dk/dv");
  if (cuda::set_attention_ws_backward(true)) run_atomic_case_with(c, seed, "warp-specialised");
}

TEST(CudaAttention, AtomicBackward) {
  SF_REQUIRE_GPU();
  if (!cuda::set_attention_wgmma(true)) GTEST_SKIP() << "the atomic backward needs wgmma";
  run_atomic_case({4, 2, 64, {1, 65, 130, 22}}, 11);
  run_atomic_case({6, 3, 64, {1, 2, 63, 64, 65, 127, 129, 257}}, 12);
  run_atomic_case({8, 2, 128, {200, 64, 1, 17}}, 13);
  run_atomic_case({32, 8, 128, {512, 300}}, 14);
  run_atomic_case({8, 4, 128, {300, 77, 129, 1, 128, 127, 191, 192, 193}}, 15);
}

// The one-pass backward's dQ accumulator layout (dq_acc_layout.h; host only, runs in CI).
// Inside a tile, the float4 slots cover each of the 64 x D values exactly once.
TEST(CudaAttentionLayout, AccumulatorSlotsCoverTheTileOnce) {
  for (int D : {64, 128}) {
    SCOPED_TRACE("D " + std::to_string(D));
    std::vector<int> seen(size_t(64 * D), 0);
    for (int f = 0; f < 16 * D; ++f) {
      const cuda::attn::AccSlot at = cuda::attn::dq_acc_slot(f);
      ASSERT_TRUE(at.row >= 0 && at.row + 8 < 64 && at.col >= 0 && at.col + 1 < D)
          << "slot " << f << " at (" << at.row << ", " << at.col << ")";
      for (int r : {at.row, at.row + 8})
        for (int c : {at.col, at.col + 1}) ++seen[size_t(r * D + c)];
    }
    for (int i = 0; i < 64 * D; ++i)
      ASSERT_EQ(seen[size_t(i)], 1) << "row " << i / D << " column " << i % D;
  }
}

// Across a packed batch, every (head, sequence, 64-row tile) gets its own 64 rows, aligned to
// 64 rows (the copy engine's 16-byte rule for the per-row arrays), inside the accumulator.
TEST(CudaAttentionLayout, AccumulatorTilesAreDisjointAndAligned) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int n_seqs = 1 + int(rng() % 9), heads = 1 + int(rng() % 4);
    std::vector<int64_t> cu{0};
    for (int s = 0; s < n_seqs; ++s) cu.push_back(cu.back() + 1 + int64_t(rng() % 300));
    const int64_t T = cu.back(), rows = cuda::attn::dq_acc_rows(T, n_seqs);
    std::map<int64_t, std::string> tiles;  // first row -> which tile
    for (int h = 0; h < heads; ++h)
      for (int s = 0; s < n_seqs; ++s)
        for (int q0 = 0; q0 < cu[size_t(s) + 1] - cu[size_t(s)]; q0 += 64) {
          const int64_t r = cuda::attn::dq_acc_row(rows, h, s, cu[size_t(s)], q0);
          const std::string name = "head " + std::to_string(h) + " sequence " +
                                   std::to_string(s) + " rows " + std::to_string(q0);
          ASSERT_EQ(r % 64, 0) << name;
          ASSERT_TRUE(r >= int64_t(h) * rows && r + 64 <= int64_t(h + 1) * rows) << name;
          ASSERT_TRUE(tiles.emplace(r, name).second) << name;
        }
    int64_t end = -1;  // tiles start 64-aligned, so distinct starts are disjoint tiles
    for (const auto& [r, name] : tiles) {
      ASSERT_GE(r, end) << name;
      end = r + 64;
    }
  }
}

// SF_ATTN_WS is read as unset (the default), 0 or 1; another value is an Error naming the
// variable and its values (no GPU needed: this runs in CI).
TEST(CudaAttentionEnv, WsForwardTakesZeroOrOne) {
  using cuda::WsForward;
  {
    ScopedEnv env("SF_ATTN_WS", std::nullopt);
    EXPECT_EQ(cuda::ws_forward_setting(), WsForward::by_default);
  }
  {
    ScopedEnv env("SF_ATTN_WS", "0");
    EXPECT_EQ(cuda::ws_forward_setting(), WsForward::off);
  }
  {
    ScopedEnv env("SF_ATTN_WS", "1");
    EXPECT_EQ(cuda::ws_forward_setting(), WsForward::required);
  }
  ScopedEnv env("SF_ATTN_WS", "yes");
  try {
    cuda::ws_forward_setting();
    ADD_FAILURE() << "SF_ATTN_WS=yes was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("SF_ATTN_WS=yes must be 0"), std::string::npos)
        << e.what();
  }
}

TEST(CudaAttention, RejectsUnsupportedHeadDim) {
  SF_REQUIRE_GPU();
  DevMat qkv(DType::bf16, 4, 3 * 96), out(DType::bf16, 4, 96), lse(DType::f32, 1, 4);
  DevArray<int32_t> cu(std::vector<int32_t>{0, 4});
  AttentionShape sh{1, 1, 96, 0.1f, 1, 4};
  EXPECT_THROW(gpu().attention_forward(gs(), out.m, lse.m.as<float>(), qkv.m.col_block(0, 96),
                                       qkv.m.col_block(96, 96), qkv.m.col_block(192, 96), sh,
                                       cu.ptr()),
               Error);
}

}  // namespace
}  // namespace sf::test
