// cuDNN fused attention (cudnn_attention.h) through CudaBackend's attention ops, against the
// host reference (double accumulation) on the same bf16-rounded inputs and against our own
// kernels; the two implementations' forward and backward interchanged; the plan cache; the
// implementation switch. Skipped without a GPU; on a GPU where cuDNN attention is unavailable
// (not compute capability 9, or no cuDNN 9 >= 9.6 loads: set SF_CUDNN_LIB, cudnn_library.h)
// only the switch test runs, and each skip says why. On Hopper with cuDNN loaded a refused
// graph FAILS the smoke test: the refusal line on stderr names the descriptor and attribute
// cuDNN rejected. The graph check needs no GPU, only the library (CI runs it).
//
// Tolerances (as for our kernels, test_cuda_attention.cpp): out/dq/dk/dv are bf16 (one
// rounding, ~1.1e-3 RMS) and both implementations round P and dS to bf16 for the tensor-core
// products: 5e-3 relative L2 for out, 1e-2 for the gradients; lse is f32 statistics of f32
// scores: 1e-5. cuDNN against our kernels: each is within those bounds of the reference, so
// their difference is within twice them (1e-2 out, 2e-2 gradients, 2e-5 lse).
//
// Layouts: q/k/v are column blocks of one fused qkv matrix (row stride (Hq + 2 Hkv) D), out has
// guard columns, dq/dk/dv are column blocks of one dqkv matrix with guard columns: every
// tensor is strided, and guards catch a write past a row. Past the last token, the inputs have
// NaN rows and the outputs guard rows (kTailRows). Lengths are not multiples of 64 or 128, and
// a part of 5 sequences (PackedCallsRunInParts) leaves a zero-length entry in its bucket of 6.
#include <algorithm>
#include <numeric>

#include "backend/cuda/cudnn_attention.h"
#include "backend/cuda/cudnn_library.h"
#include "attention_test_util.h"
#include "cuda_test_util.h"
#include "scoped_env.h"

namespace sf::test {
namespace {

using cuda::AttentionImpl;

using CudnnCase = sf::test::AttnCase;
using sf::test::cols;
std::string cname(const CudnnCase& c) { return sf::test::attn_case_name("cudnn attention", c); }

// Every tensor has kTailRows rows past its T: the inputs' are NaN (a kernel that multiplies rows
// past the last sequence, even by 0, turns outputs NaN), the outputs' hold the guard pattern
// (a write past the last sequence, e.g. for a zero-length bucket entry, shows).
constexpr int64_t kTailRows = 128;  // a whole tile past the end

DevMat with_tail(DType t, int64_t rows, int64_t cols, int64_t ld = -1) {
  DevMat d(t, rows + kTailRows, cols, ld);
  d.m.rows = rows;
  return d;
}

size_t tail_offset(const DevMat& d) { return size_t(d.m.rows * d.m.ld) * d.m.elem_size(); }
size_t tail_bytes(const DevMat& d) { return size_t(kTailRows * d.m.ld) * d.m.elem_size(); }

void nan_tail(DevMat& d) {
  std::vector<unsigned char> r(tail_bytes(d), 0xFF);  // bf16 0xFFFF, f32 0xFFFFFFFF: NaN
  EXPECT_EQ(upload_bytes(static_cast<char*>(d.buf->data()) + tail_offset(d), r.data(), r.size()),
            cudaSuccess);
}

bool tail_intact(const DevMat& d) {
  std::vector<unsigned char> r(tail_bytes(d));
  gs().synchronize();
  EXPECT_EQ(cudaMemcpy(r.data(), static_cast<const char*>(d.buf->data()) + tail_offset(d),
                       r.size(), cudaMemcpyDeviceToHost),
            cudaSuccess);
  return std::all_of(r.begin(), r.end(), [](unsigned char b) { return b == kGuardByte; });
}

// Sets the implementation for a scope and restores the previous one.
class ImplScope {
 public:
  explicit ImplScope(AttentionImpl impl) : prev_(cuda::attention_impl()) {
    cuda::set_attention_impl(impl);
  }
  ~ImplScope() { cuda::set_attention_impl(prev_); }

 private:
  AttentionImpl prev_;
};

// One case's inputs on both sides and the buffers each implementation writes.
struct Problem {
  CudnnCase c;
  std::vector<int32_t> cu{0};
  int64_t T = 0, qd = 0, kvd = 0, W = 0;
  AttentionShape sh;
  std::vector<float> vqkv, vdo;
  DevMat qkv, dout;
  std::unique_ptr<DevArray<int32_t>> dcu;

  // host_lengths: the shape carries cu_seqlens on the host too, as the engine's batches do (the
  // cuDNN path then pads each part of the call to its own longest sequence).
  Problem(const CudnnCase& cc, uint64_t seed, bool host_lengths = true) : c(cc) {
    for (int l : c.lens) cu.push_back(cu.back() + l);
    T = cu.back();
    qd = int64_t(c.Hq) * c.D;
    kvd = int64_t(c.Hkv) * c.D;
    W = qd + 2 * kvd;
    sh.n_heads = c.Hq;
    sh.n_kv_heads = c.Hkv;
    sh.head_dim = c.D;
    sh.scale = 1.f / std::sqrt(float(c.D));
    sh.n_seqs = int(c.lens.size());
    sh.max_seqlen = *std::max_element(c.lens.begin(), c.lens.end());
    sh.host_cu_seqlens = host_lengths ? cu.data() : nullptr;
    vqkv = rand_bf16(size_t(T * W), seed, -2.f, 2.f);
    vdo = rand_bf16(size_t(T * qd), seed + 1);
    qkv = with_tail(DType::bf16, T, W);
    dout = with_tail(DType::bf16, T, qd);
    qkv.upload(vqkv);
    dout.upload(vdo);
    nan_tail(qkv);
    nan_tail(dout);
    dcu = std::make_unique<DevArray<int32_t>>(cu);
  }
  Mat q() const { return qkv.m.col_block(0, qd); }
  Mat k() const { return qkv.m.col_block(qd, kvd); }
  Mat v() const { return qkv.m.col_block(qd + kvd, kvd); }
};

struct Fwd {
  DevMat out, lse;
};
struct Bwd {
  DevMat dqkv;
};

Fwd run_forward(const Problem& p, AttentionImpl impl) {
  ImplScope scope(impl);
  Fwd f{with_tail(DType::bf16, p.T, p.qd, p.qd + 8), DevMat(DType::f32, p.c.Hq, p.T)};
  f.out.poison();
  f.lse.poison();
  gpu().attention_forward(gs(), f.out.m, f.lse.m.as<float>(), p.q(), p.k(), p.v(), p.sh,
                          p.dcu->ptr());
  return f;
}

Bwd run_backward(const Problem& p, const Fwd& f, AttentionImpl impl) {
  ImplScope scope(impl);
  Bwd b{with_tail(DType::bf16, p.T, p.W, p.W + 8)};
  b.dqkv.poison();
  gpu().attention_backward(gs(), b.dqkv.m.col_block(0, p.qd), b.dqkv.m.col_block(p.qd, p.kvd),
                           b.dqkv.m.col_block(p.qd + p.kvd, p.kvd), p.dout.m, f.out.m,
                           f.lse.m.as<float>(), p.q(), p.k(), p.v(), p.sh, p.dcu->ptr());
  return b;
}

// The host reference backward from a given (GPU) forward output and the host lse.
struct HostGrads {
  std::vector<float> dq, dk, dv;
};
HostGrads host_backward(const Problem& p, const std::vector<float>& out,
                        const std::vector<float>& lse) {
  HostMat hq(p.T, p.qd, cols(p.vqkv, p.T, p.W, 0, p.qd)),
      hk(p.T, p.kvd, cols(p.vqkv, p.T, p.W, p.qd, p.kvd)),
      hv(p.T, p.kvd, cols(p.vqkv, p.T, p.W, p.qd + p.kvd, p.kvd)), hout(p.T, p.qd, out),
      hdo(p.T, p.qd, p.vdo), hdq(p.T, p.qd), hdk(p.T, p.kvd), hdv(p.T, p.kvd);
  host().attention_backward(hs(), hdq.m, hdk.m, hdv.m, hdo.m, hout.m, lse.data(), hq.m, hk.m,
                            hv.m, p.sh, p.cu.data());
  return {hdq.v, hdk.v, hdv.v};
}

void expect_grads(const std::string& what, const Problem& p, const Bwd& b,
                  const std::vector<float>& dq, const std::vector<float>& dk,
                  const std::vector<float>& dv, double tol) {
  const auto g = b.dqkv.download();
  expect_close(what + " dq", cols(g, p.T, p.W, 0, p.qd), dq, tol);
  expect_close(what + " dk", cols(g, p.T, p.W, p.qd, p.kvd), dk, tol);
  expect_close(what + " dv", cols(g, p.T, p.W, p.qd + p.kvd, p.kvd), dv, tol);
  EXPECT_TRUE(b.dqkv.guards_intact()) << what;
  EXPECT_TRUE(tail_intact(b.dqkv)) << what << ": a write past the last sequence";
}

void run_case(const CudnnCase& c, uint64_t seed, bool host_lengths = true) {
  const std::string what = cname(c) + (host_lengths ? "" : " (no host lengths)");
  SCOPED_TRACE(what);
  const Problem p(c, seed, host_lengths);
  const cuda::CudnnAttentionStats before = cuda::cudnn_attention_stats();

  // Forward: cuDNN and ours against the host, and against each other.
  const Fwd fc = run_forward(p, AttentionImpl::cudnn), fn = run_forward(p, AttentionImpl::native);
  HostMat hq(p.T, p.qd, cols(p.vqkv, p.T, p.W, 0, p.qd)),
      hk(p.T, p.kvd, cols(p.vqkv, p.T, p.W, p.qd, p.kvd)),
      hv(p.T, p.kvd, cols(p.vqkv, p.T, p.W, p.qd + p.kvd, p.kvd)), ho(p.T, p.qd),
      hl(c.Hq, p.T);
  host().attention_forward(hs(), ho.m, hl.v.data(), hq.m, hk.m, hv.m, p.sh, p.cu.data());
  const auto oc = fc.out.download(), on = fn.out.download();
  const auto lc = fc.lse.download(), ln = fn.lse.download();
  expect_close(what + " cudnn out", oc, ho.v, 5e-3);
  expect_close(what + " cudnn lse", lc, hl.v, 1e-5);
  expect_close(what + " cudnn vs native out", oc, on, 1e-2);
  expect_close(what + " cudnn vs native lse", lc, ln, 2e-5);
  EXPECT_TRUE(fc.out.guards_intact());
  EXPECT_TRUE(tail_intact(fc.out)) << what << ": a write past the last sequence";

  // Backward from each forward with each implementation: the host reference uses the same
  // bf16 out the GPU backward reads (and the host lse, which both lse match to 1e-5).
  const HostGrads hc = host_backward(p, oc, hl.v), hn = host_backward(p, on, hl.v);
  const Bwd cc = run_backward(p, fc, AttentionImpl::cudnn);
  expect_grads(what + " cudnn fwd + cudnn bwd", p, cc, hc.dq, hc.dk, hc.dv, 1e-2);
  const Bwd nc = run_backward(p, fn, AttentionImpl::cudnn);
  expect_grads(what + " native fwd + cudnn bwd", p, nc, hn.dq, hn.dk, hn.dv, 1e-2);
  const Bwd cn = run_backward(p, fc, AttentionImpl::native);
  expect_grads(what + " cudnn fwd + native bwd", p, cn, hc.dq, hc.dk, hc.dv, 1e-2);
  const auto gcn = cn.dqkv.download();
  expect_grads(what + " cudnn bwd vs native bwd", p, cc, cols(gcn, p.T, p.W, 0, p.qd),
               cols(gcn, p.T, p.W, p.qd, p.kvd), cols(gcn, p.T, p.W, p.qd + p.kvd, p.kvd), 2e-2);

  // Deterministic (the default): a second cuDNN backward gives the same bits.
  if (cuda::attention_deterministic()) {
    const Bwd again = run_backward(p, fc, AttentionImpl::cudnn);
    expect_bitwise(what + " cudnn backward repeat", again.dqkv.download(), cc.dqkv.download());
  }

  // The cuDNN path ran (a refusal prints why on stderr). The deterministic backward may be
  // refused (cuDNN may have no deterministic engine for it: our kernels then ran it); the
  // forward and the non-deterministic backward must not be.
  const cuda::CudnnAttentionStats after = cuda::cudnn_attention_stats();
  const int64_t ran = after.executions - before.executions;
  std::printf("[CUDNN] %s: %lld cuDNN executions (%s backward)\n", what.c_str(), (long long)ran,
              cuda::attention_deterministic() ? "deterministic" : "non-deterministic");
  if (cuda::attention_deterministic()) {
    EXPECT_GE(ran, 1) << "the cuDNN forward ran";
  } else {
    EXPECT_EQ(after.plans_refused, before.plans_refused) << "cuDNN refused a graph (stderr)";
    EXPECT_GE(ran, 3) << "the cuDNN forward and backwards ran";
  }
}

// Skips where the cuDNN path cannot run (no GPU, not compute capability 9.x, no cuDNN 9 >= 9.6
// loaded: the reason says which and how to fix it).
#define SF_REQUIRE_CUDNN_ATTENTION()                                                     \
  do {                                                                                   \
    SF_REQUIRE_GPU();                                                                    \
    if (!cuda::cudnn_attention_available())                                              \
      GTEST_SKIP() << "cuDNN attention: " << cuda::cudnn_attention_unavailable_reason();  \
  } while (0)

// The forward call of problem p with f's outputs, as cudnn_attention.h takes it.
cuda::CudnnAttentionCall forward_call(const Problem& p, const Fwd& f) {
  cuda::CudnnAttentionCall call;
  call.q = p.q();
  call.k = p.k();
  call.v = p.v();
  call.out = f.out.m;
  call.lse = f.lse.m.as<float>();
  call.cu_seqlens = p.dcu->ptr();
  call.shape = p.sh;
  return call;
}

// The smoke check: plans for a small shape in both directions, with the engine cuDNN chose.
TEST(CudnnAttention, SmokePlansAndEngines) {
  SF_REQUIRE_CUDNN_ATTENTION();
  const Problem p({8, 2, 128, {100, 37}}, 11);
  const Fwd f = run_forward(p, AttentionImpl::native);
  Bwd b{DevMat(DType::bf16, p.T, p.W)};
  cuda::CudnnAttentionCall call = forward_call(p, f);
  const std::string fwd = cuda::cudnn_attention_plan_info(call);
  std::printf("[CUDNN] forward: %s\n", fwd.c_str());
  EXPECT_GT(cuda::cudnn_attention_workspace_bytes(call), 0u) << fwd;
  const cuda::AttentionStrides ld{p.W, p.W, p.W, p.qd + 8, p.qd, p.W, p.W, p.W};
  EXPECT_EQ(cuda::cudnn_attention_workspace_bytes(p.sh, ld, false),
            cuda::cudnn_attention_workspace_bytes(call))
      << "the planner's question (shape and strides) gets the call's answer";
  call.backward = true;
  call.dq = b.dqkv.m.col_block(0, p.qd);
  call.dk = b.dqkv.m.col_block(p.qd, p.kvd);
  call.dv = b.dqkv.m.col_block(p.qd + p.kvd, p.kvd);
  call.dout = p.dout.m;
  for (bool det : {true, false}) {
    const bool prev = cuda::attention_deterministic();
    cuda::set_attention_deterministic(det);
    const std::string bwd = cuda::cudnn_attention_plan_info(call);
    const size_t bytes = cuda::cudnn_attention_workspace_bytes(call);
    EXPECT_EQ(cuda::cudnn_attention_workspace_bytes(p.sh, ld, true), bytes);
    cuda::set_attention_deterministic(prev);
    std::printf("[CUDNN] %s backward: %s\n", det ? "deterministic" : "non-deterministic",
                bwd.c_str());
    // The non-deterministic form is the one cuDNN always has on Hopper; the deterministic one
    // may be missing (then our kernels run the backward, which the cases below cover).
    if (!det) {
      EXPECT_GT(bytes, 0u) << bwd;
    }
  }
}

TEST(CudnnAttention, OneLongSequence) {
  SF_REQUIRE_CUDNN_ATTENTION();
  run_case({32, 8, 128, {777}}, 1);
}

TEST(CudnnAttention, UnequalSequencesGqa) {
  SF_REQUIRE_CUDNN_ATTENTION();
  run_case({32, 8, 128, {300, 77, 129, 1, 64}}, 2);  // 5 sequences: bucket 6
  run_case({14, 2, 128, {200, 17, 257}}, 3);
}

TEST(CudnnAttention, HeadDim64) {
  SF_REQUIRE_CUDNN_ATTENTION();
  run_case({8, 8, 64, {130, 22, 257}}, 4);
  run_case({14, 2, 64, {65, 191}}, 5);
}

TEST(CudnnAttention, MhaHeadDim128) {
  SF_REQUIRE_CUDNN_ATTENTION();
  run_case({8, 8, 128, {333, 5}}, 6);
}

// The non-deterministic backward (SF_ATTN_DETERMINISTIC=0, the fast form) is as accurate.
TEST(CudnnAttention, NonDeterministicBackward) {
  SF_REQUIRE_CUDNN_ATTENTION();
  const bool prev = cuda::attention_deterministic();
  cuda::set_attention_deterministic(false);
  run_case({32, 8, 128, {250, 129}}, 7);
  run_case({8, 2, 64, {100, 1, 63}}, 8);
  cuda::set_attention_deterministic(prev);
}

// Sequences that all fill their length bucket run the dense graph (no ragged offsets, no
// padding mask; one sequence or several), as accurate as the packed one, in both backward
// forms; with dense graphs off, a length short of its bucket or sequences of unequal lengths,
// the packed graph runs.
TEST(CudnnAttention, SequencesFillingTheirBucketRunTheDenseGraph) {
  SF_REQUIRE_CUDNN_ATTENTION();
  const bool prev_det = cuda::attention_deterministic(), prev_dense = cuda::cudnn_dense_graphs();
  cuda::set_cudnn_dense_graphs(true);
  auto dense_runs = [] { return cuda::cudnn_attention_stats().dense_executions; };
  for (bool det : {false, true}) {
    cuda::set_attention_deterministic(det);
    int64_t d0 = dense_runs();
    run_case({32, 8, 128, {1024}}, 20);
    EXPECT_GE(dense_runs() - d0, 1) << "D 128, 1024 tokens: the dense forward";
    d0 = dense_runs();
    run_case({8, 2, 64, {1536}}, 21);  // 1.5 x 1024: a bucket too
    EXPECT_GE(dense_runs() - d0, 1) << "D 64, 1536 tokens";
    d0 = dense_runs();
    run_case({32, 8, 128, {512, 512, 512}}, 24);  // three sequences: B 3, not its bucket 4
    EXPECT_GE(dense_runs() - d0, 1) << "3 x 512 tokens";
    d0 = dense_runs();
    run_case({8, 2, 64, {1000}}, 22);  // short of its bucket: padded, packed
    run_case({8, 2, 64, {512, 256}}, 25, false);  // unequal, no host lengths: packed
    EXPECT_EQ(dense_runs(), d0);
    // With them, 2 x 512 rows would pass the 768 tokens: one part each, and each fills its
    // bucket.
    run_case({8, 2, 64, {512, 256}}, 25);
    EXPECT_GE(dense_runs() - d0, 2) << "512 + 256 with host lengths: two dense parts";
  }
  cuda::set_attention_deterministic(false);
  const int64_t d1 = dense_runs();
  cuda::set_cudnn_dense_graphs(false);
  run_case({32, 8, 128, {1024}}, 23);
  EXPECT_EQ(dense_runs(), d1) << "dense graphs off: the packed graph runs";
  cuda::set_cudnn_dense_graphs(prev_dense);
  cuda::set_attention_deterministic(prev_det);
}

// The cuDNN forward's plan description of problem p (its parts, when more than one).
std::string plan_info(const Problem& p) {
  const Fwd f = run_forward(p, AttentionImpl::native);
  const std::string info = cuda::cudnn_attention_plan_info(forward_call(p, f));
  std::printf("[CUDNN] %s: %s\n", cname(p.c).c_str(), info.c_str());
  return info;
}

// A call whose sequences padded to the longest take more rows than its tokens runs in parts of
// consecutive sequences (cudnn_attention.cpp, parts_of), each as accurate as one call, in both
// backward forms: the parts' sequences start past row 0 (their ragged offsets count from the
// whole call's first row). Without the host's lengths, k a part (the largest bucket with
// k x S <= T, S the call's longest); with them, each part padded to its own longest.
TEST(CudnnAttention, PackedCallsRunInParts) {
  SF_REQUIRE_CUDNN_ATTENTION();
  const CudnnCase threes{32, 8, 128, {512, 100, 300, 200, 37, 400, 250, 230}};  // S 512, T 2029
  const bool prev = cuda::attention_deterministic();
  for (bool host_lengths : {false, true}) {
    for (bool det : {false, true}) {
      cuda::set_attention_deterministic(det);
      run_case(threes, 30, host_lengths);
      run_case({8, 2, 64, {128, 100, 90, 120, 77, 128, 65, 99, 110, 80, 128, 70, 60}}, 31,
               host_lengths);  // uniform: 8, 5
      run_case({14, 2, 128, {640, 60, 70, 80}}, 32, host_lengths);  // S 768 > T / 2
    }
  }
  cuda::set_attention_deterministic(prev);

  const std::string uniform = plan_info(Problem(threes, 30, false));
  EXPECT_NE(uniform.find("(in 3 parts: 3 seqs B=3 S=512, 3 seqs B=3 S=512, 2 seqs B=2 S=512)"),
            std::string::npos) << uniform;
  // 512 100 300 | 200 37 400 | 250 230: a fourth sequence would make B 4 (2048 rows > 2029).
  const std::string tight = plan_info(Problem(threes, 30, true));
  EXPECT_NE(tight.find("(in 3 parts: 3 seqs B=3 S=512, 3 seqs B=3 S=512, 2 seqs B=2 S=256)"),
            std::string::npos) << tight;
  // 640 alone (S 768), then 60 70 80 padded to 96 (a bucket: 1.5 x 64), not to 768.
  const std::string apart = plan_info(Problem({14, 2, 128, {640, 60, 70, 80}}, 32, true));
  EXPECT_NE(apart.find("(in 2 parts: 1 seqs B=1 S=768, 3 seqs B=3 S=96)"), std::string::npos)
      << apart;
}

// With the host's lengths, a long sequence that fills its length bucket runs alone on the dense
// graph (its tensors then start at its first row, not the call's), equal ones after it with it,
// and its neighbours in packed parts of their own.
TEST(CudnnAttention, LongBucketFillingSequencesRunDense) {
  SF_REQUIRE_CUDNN_ATTENTION();
  const CudnnCase c{2, 1, 64, {300, 16384, 16384, 100}};
  const bool prev_det = cuda::attention_deterministic();
  cuda::set_attention_deterministic(false);
  const int64_t d0 = cuda::cudnn_attention_stats().dense_executions;
  run_case(c, 33);
  gs().synchronize();
  EXPECT_GE(cuda::cudnn_attention_stats().dense_executions - d0, 3)
      << "the two 16384s ran dense in the forward and both backwards";
  cuda::set_attention_deterministic(prev_det);
  const std::string info = plan_info(Problem(c, 33));
  const std::string parts =
      "(in 3 parts: 1 seqs B=1 S=384, 2 seqs dense B=2 S=16384, 1 seqs B=1 S=128)";
  EXPECT_NE(info.find(parts), std::string::npos) << info;
}

// PackedBatch::by_tokens: a packed part's B is the largest bucket with B x S <= the call's
// tokens, so parts of one length bucket share a plan whatever their count; as accurate as
// by_count in both backward forms. {200, 10, 10} and {200, 5, 5, 10} (220 tokens each) run
// 200 alone (S 256) and the short ones at S 64: by count B 2 then 3, by tokens B 3 both times.
TEST(CudnnAttention, PackedBatchByTokensSharesPlansAcrossCounts) {
  SF_REQUIRE_CUDNN_ATTENTION();
  const bool prev_det = cuda::attention_deterministic();
  const cuda::PackedBatch prev_batch = cuda::cudnn_packed_batch();
  cuda::set_cudnn_packed_batch(cuda::PackedBatch::by_tokens);
  const CudnnCase a{6, 2, 64, {200, 10, 10}}, b{6, 2, 64, {200, 5, 5, 10}};
  for (bool det : {false, true}) {
    cuda::set_attention_deterministic(det);
    run_case(a, 40);
    gs().synchronize();
    const int64_t built = cuda::cudnn_attention_stats().plans_built;
    run_case(b, 41);
    gs().synchronize();
    EXPECT_EQ(cuda::cudnn_attention_stats().plans_built, built)
        << "b's parts are a's buckets by tokens: no new plan (deterministic " << det << ")";
    run_case({8, 2, 64, {128, 100, 90, 120, 77, 128, 65, 99, 110, 80, 128, 70, 60}}, 42);
    run_case({14, 2, 128, {640, 60, 70, 80}}, 43);
  }
  const std::string info = plan_info(Problem(a, 40));
  EXPECT_NE(info.find("(in 2 parts: 1 seqs B=1 S=256, 2 seqs B=3 S=64)"), std::string::npos)
      << info;
  cuda::set_cudnn_packed_batch(cuda::PackedBatch::by_count);
  const std::string by_count = plan_info(Problem(a, 40));
  EXPECT_NE(by_count.find("(in 2 parts: 1 seqs B=1 S=256, 2 seqs B=2 S=64)"), std::string::npos)
      << by_count;
  cuda::set_cudnn_packed_batch(prev_batch);
  cuda::set_attention_deterministic(prev_det);
}

// The host's lengths must describe the call: a clear error where they do not.
TEST(CudnnAttention, HostLengthsThatDisagreeAreAnError) {
  SF_REQUIRE_CUDNN_ATTENTION();
  Problem p({4, 2, 64, {100, 50}}, 34);
  const Fwd f = run_forward(p, AttentionImpl::native);
  cuda::CudnnAttentionCall call = forward_call(p, f);
  const std::vector<int32_t> short_cu{0, 100, 140}, longer{0, 120, 150};
  call.shape.host_cu_seqlens = short_cu.data();
  EXPECT_THROW(cuda::cudnn_attention_workspace_bytes(call), Error);  // ends at 140 of 150 rows
  call.shape.host_cu_seqlens = longer.data();
  try {
    cuda::cudnn_attention_workspace_bytes(call);
    ADD_FAILURE() << "no error for a longest sequence of 120 with max_seqlen 100";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_seqlen says 100"), std::string::npos) << e.what();
  }
}

// A second batch in the same buckets (one sequence a part: S 128, then S 256) reuses the plans:
// none is built.
TEST(CudnnAttention, PlanCacheReusedWithinBucket) {
  SF_REQUIRE_CUDNN_ATTENTION();
  const Problem a({8, 4, 128, {100, 250}}, 9), b({8, 4, 128, {120, 200}}, 10);
  const Fwd fa = run_forward(a, AttentionImpl::cudnn);
  const Bwd ba = run_backward(a, fa, AttentionImpl::cudnn);
  gs().synchronize();
  const cuda::CudnnAttentionStats s1 = cuda::cudnn_attention_stats();
  const Fwd fb = run_forward(b, AttentionImpl::cudnn);
  const Bwd bb = run_backward(b, fb, AttentionImpl::cudnn);
  gs().synchronize();
  const cuda::CudnnAttentionStats s2 = cuda::cudnn_attention_stats();
  EXPECT_EQ(s2.plans_built, s1.plans_built) << "same bucket, new plan";
  EXPECT_EQ(s2.plans_refused, s1.plans_refused);
  EXPECT_GE(s2.executions - s1.executions, 1) << "the second forward ran on cuDNN";
  // The run's summary names the plans (CudaBackend::one_off_costs, the trainer's last line).
  EXPECT_GT(s2.plan_build_seconds, 0.0);
  EXPECT_NE(gpu().one_off_costs().find(" attention plan"), std::string::npos)
      << gpu().one_off_costs();
}

// What a run's summary says of plan building (runs without a device).
TEST(CudnnAttention, PlanBuildingDescribedForTheRunSummary) {
  cuda::CudnnAttentionStats st;
  EXPECT_EQ(cuda::describe_plan_building(st), "");
  st.plans_built = 1;
  st.plan_build_seconds = 0.04;
  EXPECT_EQ(cuda::describe_plan_building(st),
            "cuDNN built 1 attention plan in 0.0 s (once per shape, the first time it runs)");
  st.plans_built = 32;
  st.plan_build_seconds = 6.389;
  EXPECT_EQ(cuda::describe_plan_building(st),
            "cuDNN built 32 attention plans in 6.4 s (once per shape, the first time it runs)");
}

// cuDNN accepts every graph we build (descriptor attributes, op shapes) without a device, so
// CI checks them; the pointers are fake (the check reads no data).
TEST(CudnnAttention, GraphsFinalizeWithoutADevice) {
  if (!cuda::cudnn_attention_built()) GTEST_SKIP() << "this build has no cuDNN";
  // Through the run-time loader: skipped only where no cuDNN library exists at all (one that
  // opens but cannot be used fails below, with the loader's reason).
  const cuda::CudnnLibraryInfo lib = cuda::cudnn_library_info();
  if (!lib.opened) GTEST_SKIP() << "no cuDNN library found (" << lib.why << "): set SF_CUDNN_LIB";
  auto fake = [](int64_t i) { return reinterpret_cast<void*>(uintptr_t(i + 1) << 20); };
  // (1024 and 512 tokens of one sequence, 2 x 256: the dense graphs, set on below.)
  const bool prev_dense = cuda::cudnn_dense_graphs();
  const cuda::PackedBatch prev_batch = cuda::cudnn_packed_batch();
  cuda::set_cudnn_dense_graphs(true);
  for (const CudnnCase& c : {CudnnCase{32, 8, 128, {300, 77, 129, 1, 64}}, CudnnCase{8, 8, 64, {130}},
                             CudnnCase{14, 2, 128, {200, 17}}, CudnnCase{32, 8, 128, {1024}},
                             CudnnCase{8, 2, 64, {512}}, CudnnCase{14, 2, 128, {256, 256}},
                             CudnnCase{8, 2, 64, {128, 100, 90, 120, 77, 128, 65, 99, 110, 80,
                                                  128, 70, 60}},  // in parts: B 8 and 6
                             CudnnCase{2, 1, 64, {300, 16384, 16384, 100}}}) {
    const int64_t T = std::accumulate(c.lens.begin(), c.lens.end(), int64_t(0));
    const int64_t qd = int64_t(c.Hq) * c.D, kvd = int64_t(c.Hkv) * c.D, W = qd + 2 * kvd;
    cuda::CudnnAttentionCall call;
    call.q = Mat(fake(0), DType::bf16, T, qd, W);
    call.k = Mat(fake(1), DType::bf16, T, kvd, W);
    call.v = Mat(fake(2), DType::bf16, T, kvd, W);
    call.out = Mat(fake(3), DType::bf16, T, qd);
    call.lse = static_cast<float*>(fake(4));
    call.cu_seqlens = static_cast<const int32_t*>(fake(5));
    call.shape = AttentionShape{c.Hq, c.Hkv, c.D, 0.1f, int(c.lens.size()),
                                *std::max_element(c.lens.begin(), c.lens.end())};
    // With the host's lengths too (parts padded to their own longest; the 16384s dense).
    std::vector<int32_t> cu{0};
    for (int l : c.lens) cu.push_back(cu.back() + l);
    for (int form = 0; form < 3; ++form) {  // no host lengths; with them, by count / tokens
      const bool host_lengths = form > 0;
      call.shape.host_cu_seqlens = host_lengths ? cu.data() : nullptr;
      cuda::set_cudnn_packed_batch(form == 2 ? cuda::PackedBatch::by_tokens
                                             : cuda::PackedBatch::by_count);
      const std::string what = cname(c) + (host_lengths ? " with host lengths" : "") +
                               (form == 2 ? ", B by tokens" : "");
      call.backward = false;
      EXPECT_EQ(cuda::cudnn_attention_graph_check(call), "") << what << " forward";
      call.backward = true;
      call.dq = Mat(fake(6), DType::bf16, T, qd, W + 8);
      call.dk = Mat(fake(7), DType::bf16, T, kvd, W + 8);
      call.dv = Mat(fake(8), DType::bf16, T, kvd, W + 8);
      call.dout = Mat(fake(9), DType::bf16, T, qd);
      for (bool det : {true, false}) {
        const bool prev = cuda::attention_deterministic();
        cuda::set_attention_deterministic(det);
        EXPECT_EQ(cuda::cudnn_attention_graph_check(call), "")
            << what << (det ? " deterministic" : "") << " backward";
        cuda::set_attention_deterministic(prev);
      }
    }
  }
  cuda::set_cudnn_packed_batch(prev_batch);
  cuda::set_cudnn_dense_graphs(prev_dense);
}

// The switch: native never touches cuDNN; cudnn is in effect exactly where available.
TEST(CudnnAttention, ImplementationSwitch) {
  SF_REQUIRE_GPU();
  const AttentionImpl prev = cuda::attention_impl();
  EXPECT_EQ(cuda::set_attention_impl(AttentionImpl::native), AttentionImpl::native);
  const Problem p({4, 2, 64, {70}}, 12);
  const cuda::CudnnAttentionStats s1 = cuda::cudnn_attention_stats();
  const Fwd f = run_forward(p, AttentionImpl::native);
  const Bwd b = run_backward(p, f, AttentionImpl::native);
  gs().synchronize();
  EXPECT_EQ(cuda::cudnn_attention_stats().executions, s1.executions);
  const AttentionImpl got = cuda::set_attention_impl(AttentionImpl::cudnn);
  EXPECT_EQ(got == AttentionImpl::cudnn, cuda::cudnn_attention_available());
  std::printf("[CUDNN] attention implementation where cudnn is asked for: %s\n",
              cuda::attention_impl_name(got));
  cuda::set_attention_impl(prev);
}

// SF_ATTN=split: our forward (cuDNN's executions do not move) with cuDNN's backward, each bit
// for bit what the pass's own implementation gives.
TEST(CudnnAttention, SplitRunsOurForwardAndCudnnBackward) {
  SF_REQUIRE_GPU();
  if (!cuda::cudnn_attention_available()) GTEST_SKIP() << cuda::cudnn_attention_unavailable_reason();
  const AttentionImpl prev = cuda::attention_impl();
  const Problem p({8, 2, 128, {300, 77, 129}}, 21);
  const int64_t e0 = cuda::cudnn_attention_stats().executions;
  const Fwd fs = run_forward(p, AttentionImpl::split);
  gs().synchronize();
  EXPECT_EQ(cuda::cudnn_attention_stats().executions, e0) << "split ran cuDNN's forward";
  const Bwd bs = run_backward(p, fs, AttentionImpl::split);
  gs().synchronize();
  EXPECT_GT(cuda::cudnn_attention_stats().executions, e0)  // (a call may run in parts)
      << "split did not run cuDNN's backward";
  const Fwd fn = run_forward(p, AttentionImpl::native);
  const Bwd bc = run_backward(p, fn, AttentionImpl::cudnn);
  expect_bitwise("split forward out = native's", fs.out.download(), fn.out.download());
  expect_bitwise("split forward lse = native's", fs.lse.download(), fn.lse.download());
  expect_bitwise("split backward = cuDNN's from the same forward", bs.dqkv.download(),
                 bc.dqkv.download());
  EXPECT_EQ(cuda::set_attention_impl(prev), prev);
}

// SF_ATTN takes native, cudnn or split (no GPU needed: this runs in CI, where cuDNN attention is
// unavailable and cudnn / split are an Error naming the variable).
TEST(CudnnAttentionEnv, SfAttnTakesNativeCudnnOrSplit) {
  const bool cudnn = cuda::cudnn_attention_available();
  {
    ScopedEnv env("SF_ATTN", "native");
    EXPECT_EQ(cuda::attention_impl_setting(), AttentionImpl::native);
  }
  {
    ScopedEnv env("SF_ATTN", std::nullopt);
    EXPECT_EQ(cuda::attention_impl_setting(), cudnn ? AttentionImpl::cudnn : AttentionImpl::native);
  }
  for (const char* v : {"cudnn", "split"}) {
    ScopedEnv env("SF_ATTN", v);
    if (cudnn) {
      EXPECT_EQ(cuda::attention_impl_setting(),
                std::string(v) == "split" ? AttentionImpl::split : AttentionImpl::cudnn);
      continue;
    }
    try {
      cuda::attention_impl_setting();
      ADD_FAILURE() << "SF_ATTN=" << v << " was accepted without cuDNN";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("SF_ATTN=") + v +
                                           ", but cuDNN attention is unavailable"),
                std::string::npos)
          << e.what();
    }
  }
  ScopedEnv env("SF_ATTN", "flash");
  try {
    cuda::attention_impl_setting();
    ADD_FAILURE() << "SF_ATTN=flash was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("SF_ATTN=flash is not an attention implementation"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace sf::test
