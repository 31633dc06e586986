// Benchmarks of the CUDA backend's kernels at Llama-3.1-8B shapes (hidden 4096, 32 heads,
// 8 KV heads, head_dim 128, FFN 14336, vocab 128256, 16K tokens per call).
//
// Usage: bench_cuda_kernels [--quick] [--csv FILE] [--only GROUP] [--span-ms T] [--impl NAME]
//                           [--seq L]
// --span-ms T: each timed region enqueues as many calls back to back as fill T ms (at least
// one) and reports the time per call, so that no host overhead between calls is counted: what
// a call costs inside a stream the host keeps ahead of, as in training. Default 0: one call.
// --impl NAME: the attention rows run only that implementation (native, cudnn, cudnn-nondet...).
// --seq L: the attention rows of sequence length L only (one row to profile, e.g. under ncu).
// Groups: copy norm rope swiglu elementwise adamw embedding gemm attention varlen lm_head, and
// gemm_algos (not in the default run): every cuBLASLt candidate of the layer GEMMs, timed;
// plans / plans:count / plans:tokens (not in the default run): cuDNN's plan building over a
// run's stream of packed batches, per cuda::PackedBatch policy.
// attention:D64 / attention:D128 and varlen:D64 / varlen:D128 run one head dimension's rows;
// varlen = packed calls of unequal sequences (varlen_mix), the rows unequal lengths run.
// Memory-bound ops report GB/s (bytes each op must read + write once) and the fraction of a
// device-to-device copy measured in the same run; GEMM, attention and the LM head report
// TFLOP/s. Each number is the median of timed runs (CUDA events) after warm-up, on random data.
// Attention FLOPs use the usual causal convention: forward 4*D*sum(len^2)/2 per head, backward
// 2.5x the forward; each attention row names its implementation (native, native-ws = native
// with the warp-specialised forward (Hopper only), native-atomic = native-ws with the one-pass
// backward that adds dQ with atomics (launch_attention_backward_atomic; its warp-specialised
// kernel), native-atomic-wgmma = the same pass by the wgmma dk/dv kernel,
// native-ws+cudnn-nondet = our warp-specialised forward with cuDNN's atomic backward
// (SF_ATTN=split), cudnn = cuDNN with
// the deterministic backward, cudnn-nondet = cuDNN's atomic backward; both run the dense graph
// where every sequence fills its length bucket, as the fixed-length shapes do, and are given
// the host's lengths, as the engine gives them; cudnn-nondet-packed = the atomic backward
// through the packed graph only, SF_CUDNN_DENSE=0; cudnn-nondet-uniform (unequal sequences) =
// the atomic backward without the host's lengths; cudnn-nondet-bytokens (unequal sequences) =
// the atomic backward with cuda::PackedBatch::by_tokens; bench/torch_attention_ref.py
// times torch's SDPA backends at the same shapes with the same formula). The LM head counts its three GEMMs (6*T*V*C); peak memory is the scratch.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cudnn_attention.h"
#include "backend/cuda/gemm_lt.h"
#include "core/dtype.h"

namespace sf {
namespace {

struct Row {
  std::string op, shape, unit;
  double ms, value, frac;  // frac: of the copy bandwidth (memory-bound ops) or -1
};
std::vector<Row> g_rows;
double g_copy_gbs = 0;
bool g_quick = false;
std::string g_only;  // run only the benchmark groups whose name contains this
double g_span_ms = 0;  // --span-ms
std::string g_impl;    // --impl
int64_t g_seq = 0;     // --seq (0: every length)
bool want(const char* group) { return g_only.empty() || std::string(group).find(g_only) != std::string::npos; }
bool runs_attention_rows() { return want("attention") || g_only.rfind("attention:", 0) == 0; }
bool runs_varlen_rows() { return want("varlen") || g_only.rfind("varlen:", 0) == 0; }

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Host -> device copy that has landed when it returns: cudaMemcpy from pageable memory returns
// once staged, its DMA on the legacy stream, which the backend's non-blocking streams do not
// wait for.
void upload(void* dst, const void* src, size_t n, const char* what) {
  check(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), what);
  check(cudaDeviceSynchronize(), what);
}

// One timed region: `calls` calls of fn back to back, in ms.
double region_ms(cudaStream_t s, const std::function<void()>& fn, int calls, cudaEvent_t a,
                 cudaEvent_t b) {
  check(cudaEventRecord(a, s), "record");
  for (int c = 0; c < calls; ++c) fn();
  check(cudaEventRecord(b, s), "record");
  check(cudaEventSynchronize(b), "sync");
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  return ms;
}

// The median ms per call over `reps` timed regions after 3 warm-up calls; a region holds one
// call, or with --span-ms as many as fill that span.
double time_ms(cudaStream_t s, const std::function<void()>& fn, int reps = 20) {
  if (g_quick) reps = std::min(reps, 5);
  for (int i = 0; i < 3; ++i) fn();
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  int calls = 1;
  if (g_span_ms > 0) {
    const double one = region_ms(s, fn, 1, a, b);
    calls = int(std::clamp(std::ceil(g_span_ms / std::max(one, 1e-3)), 1.0, 256.0));
  }
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(region_ms(s, fn, calls, a, b) / calls);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Bench {
  CudaBackend be;
  Stream& st;
  cudaStream_t raw;
  std::vector<std::unique_ptr<Buffer>> keep;
  std::mt19937 rng{1234};

  Bench() : be(0), st(be.default_stream()), raw(CudaBackend::cuda_stream(st)) {}

  // Device buffer filled with random bf16 / f32 values in [lo, hi).
  void* rand_buf(DType t, size_t n, float lo = -1.f, float hi = 1.f) {
    keep.push_back(be.alloc(n * dtype_size(t), "bench"));
    if (t == DType::i32) return keep.back()->data();  // filled by the caller
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> f(std::min<size_t>(n, size_t(1) << 22));
    for (auto& x : f) x = d(rng);
    std::vector<unsigned char> host(f.size() * dtype_size(t));
    convert_from_f32(f.data(), host.data(), t, f.size());
    char* p = static_cast<char*>(keep.back()->data());
    for (size_t off = 0; off < n; off += f.size()) {
      const size_t m = std::min(f.size(), n - off);
      upload(p + off * dtype_size(t), host.data(), m * dtype_size(t), "upload");
    }
    return keep.back()->data();
  }
  Mat mat(DType t, int64_t r, int64_t c, float lo = -1.f, float hi = 1.f) {
    return Mat(rand_buf(t, size_t(r * c), lo, hi), t, r, c);
  }
  void sync() { st.synchronize(); }
  void free_all() {
    sync();
    keep.clear();
  }
};

void add_bw(const std::string& op, const std::string& shape, double bytes, double ms) {
  const double gbs = bytes / ms / 1e6;
  g_rows.push_back({op, shape, "GB/s", ms, gbs, g_copy_gbs > 0 ? gbs / g_copy_gbs : -1});
}
void add_flops(const std::string& op, const std::string& shape, double flops, double ms) {
  g_rows.push_back({op, shape, "TFLOP/s", ms, flops / ms / 1e9, -1});
}
// Device memory an op needs beside its inputs and outputs (its workspace), in MiB.
void add_mib(const std::string& op, const std::string& shape, size_t bytes) {
  g_rows.push_back({op, shape, "MiB", 0, double(bytes) / double(1 << 20), -1});
}

// Random q/k/v (one packed [T, (H + 2 KV) D] buffer, as the layer's fused projection leaves
// them), out, dout, lse, and the gradients' views, for attention calls of T tokens.
struct AttentionTensors {
  Mat q, k, v, out, dq, dk, dv, dout;
  float* lse = nullptr;
};
AttentionTensors attention_tensors(Bench& b, int64_t T, int64_t H, int64_t KV, int64_t D) {
  const int64_t W = (H + 2 * KV) * D;
  Mat qkv = b.mat(DType::bf16, T, W, -2.f, 2.f), dqkv = b.mat(DType::bf16, T, W);
  AttentionTensors t;
  t.q = qkv.col_block(0, H * D);
  t.k = qkv.col_block(H * D, KV * D);
  t.v = qkv.col_block((H + KV) * D, KV * D);
  t.dq = dqkv.col_block(0, H * D);
  t.dk = dqkv.col_block(H * D, KV * D);
  t.dv = dqkv.col_block((H + KV) * D, KV * D);
  t.out = b.mat(DType::bf16, T, H * D);
  t.dout = b.mat(DType::bf16, T, H * D);
  t.lse = static_cast<float*>(b.rand_buf(DType::f32, size_t(H * T)));
  return t;
}

// The attention rows' implementations, in the order they run.
struct AttentionImpl {
  const char* name;
  cuda::AttentionImpl impl;
  bool deterministic;
  bool packed = false;    // dense graphs off (cuda::cudnn_dense_graphs): the packed graph runs
  bool uniform = false;   // no host lengths: parts of equal count padded to the longest
  bool by_tokens = false; // cuda::PackedBatch::by_tokens (unequal sequences only)
  bool ws_forward = false; // the warp-specialised forward (cuda::set_attention_ws_forward);
                           // "native" is the wgmma forward, for the two side by side
  bool atomic_dq = false;  // our backward with atomic dQ (launch_attention_backward_atomic),
  bool ws_backward = true; // by its warp-specialised kernel (else the wgmma dk/dv kernel's form)
};
const AttentionImpl kAttentionImpls[] = {
    {"native", cuda::AttentionImpl::native, true},
    {"native-ws", cuda::AttentionImpl::native, true, false, false, false, true},
    {"native-atomic", cuda::AttentionImpl::native, false, false, false, false, true, true},
    {"native-atomic-wgmma", cuda::AttentionImpl::native, false, false, false, false, true, true,
     false},
    // SF_ATTN=split: our warp-specialised forward beside cuDNN's fastest backward.
    {"native-ws+cudnn-nondet", cuda::AttentionImpl::split, false, false, false, false, true},
    {"cudnn", cuda::AttentionImpl::cudnn, true},
    {"cudnn-nondet-packed", cuda::AttentionImpl::cudnn, false, true},
    {"cudnn-nondet-uniform", cuda::AttentionImpl::cudnn, false, false, true},
    {"cudnn-nondet-bytokens", cuda::AttentionImpl::cudnn, false, false, false, true},
    {"cudnn-nondet", cuda::AttentionImpl::cudnn, false},
};
bool known_attention_impl(const std::string& name) {
  for (const AttentionImpl& im : kAttentionImpls)
    if (name == im.name) return true;
  return false;
}
std::string attention_impl_names() {
  std::string out;
  for (const AttentionImpl& im : kAttentionImpls)
    out += (out.empty() ? "" : ", ") + std::string(im.name);
  return out;
}

// The device memory a backward of the row's implementation needs beside its tensors: the
// one-pass backward's accumulator, cuDNN's workspace for the call (the backend's stream
// allocates as much), none for our two-kernel backward (it keeps its row sums in dq).
size_t backward_workspace(const AttentionImpl& im, bool cudnn_ran, size_t onepass_bytes,
                          const AttentionTensors& at, const AttentionShape& sh,
                          const int32_t* dcu) {
  if (im.atomic_dq) return onepass_bytes;
  if (!cuda::cudnn_runs_pass(im.impl, true) || !cudnn_ran) return 0;
  cuda::CudnnAttentionCall c;
  c.q = at.q, c.k = at.k, c.v = at.v, c.out = at.out, c.lse = at.lse;
  c.dq = at.dq, c.dk = at.dk, c.dv = at.dv, c.dout = at.dout;
  c.cu_seqlens = dcu;
  c.shape = sh;
  c.backward = true;
  return cuda::cudnn_attention_workspace_bytes(c);
}

// One packed attention call (sequences of `lens` tokens, H/KV heads of D) with each
// implementation (ours; cuDNN with its deterministic backward, the default; cuDNN's atomic
// backward through the packed graph, then through the dense one where it applies). A row names
// the implementation that actually ran: "cudnn>native" where cuDNN refused the call. `shape`
// names the call in the rows.
void attention_call(Bench& b, const std::vector<int64_t>& lens, int64_t H, int64_t KV, int64_t D,
                    const std::string& shape) {
  auto& be = b.be;
  Stream& s = b.st;
  int64_t T = 0, L = 0;
  double sum_sq = 0;
  for (int64_t n : lens) {
    T += n;
    L = std::max(L, n);
    sum_sq += double(n) * double(n);
  }
  const int64_t n_seqs = int64_t(lens.size());
  const bool all_equal = std::all_of(lens.begin(), lens.end(), [&](int64_t n) { return n == L; });
  const AttentionTensors at = attention_tensors(b, T, H, KV, D);
  const Mat &q = at.q, &k = at.k, &v = at.v, &out = at.out, &dq = at.dq, &dk = at.dk,
            &dv = at.dv, &dout = at.dout;
  float* lse = at.lse;
  std::vector<int32_t> cu{0};
  for (int64_t n : lens) cu.push_back(cu.back() + int32_t(n));
  auto* dcu = static_cast<int32_t*>(b.rand_buf(DType::i32, cu.size()));
  upload(dcu, cu.data(), cu.size() * 4, "cu");
  AttentionShape sh{int(H), int(KV), int(D), 1.f / std::sqrt(float(D)), int(n_seqs), int(L)};
  const double fwd_flops = 4.0 * D * H * sum_sq / 2.0;
  const int reps = fwd_flops > 2e13 ? 5 : 20;  // the 64K / 128K rows run for seconds
  for (const AttentionImpl& im : kAttentionImpls) {
    if (im.impl != cuda::AttentionImpl::native && !cuda::cudnn_attention_available()) continue;
    if (!g_impl.empty() && g_impl != im.name) continue;
    // equal sequences: one dense part either way
    if ((im.uniform || im.by_tokens) && all_equal) continue;
    cuda::set_cudnn_packed_batch(im.by_tokens ? cuda::PackedBatch::by_tokens
                                              : cuda::PackedBatch::by_count);
    if (cuda::set_attention_ws_forward(im.ws_forward) != im.ws_forward) continue;  // no wgmma
    // The atomic-dQ rows only when named: no path of the backend runs them (attention.cuh).
    if (im.atomic_dq && (g_impl != im.name || !cuda::attention_backward_atomic_runs())) continue;
    cuda::set_attention_ws_backward(im.ws_backward);
    cuda::set_attention_impl(im.impl);
    cuda::set_attention_deterministic(im.deterministic);
    cuda::set_cudnn_dense_graphs(!im.packed);
    sh.host_cu_seqlens = im.uniform ? nullptr : cu.data();
    // The name of what ran: a cuDNN refusal runs our kernels (its executions do not move).
    auto ran = [&](int64_t before, bool backward) {
      if (!cuda::cudnn_runs_pass(im.impl, backward)) return std::string(im.name);
      b.sync();
      return cuda::cudnn_attention_stats().executions > before ? std::string(im.name)
                                                               : im.name + std::string(">native");
    };
    int64_t e0 = cuda::cudnn_attention_stats().executions;
    const double ms = time_ms(b.raw, [&] { be.attention_forward(s, out, lse, q, k, v, sh, dcu); },
                              reps);
    const std::string fwd_impl = ran(e0, false);
    e0 = cuda::cudnn_attention_stats().executions;
    const size_t ws_bytes =
        im.atomic_dq ? cuda::attention_backward_atomic_workspace_bytes(T, sh) : 0;
    float* ws =  // (i32: not filled; the launch zeroes it)
        ws_bytes ? static_cast<float*>(b.rand_buf(DType::i32, ws_bytes / 4)) : nullptr;
    const double msb = time_ms(b.raw, [&] {
      if (im.atomic_dq)
        cuda::launch_attention_backward_atomic(b.raw, dq, dk, dv, dout, out, lse, q, k, v, sh,
                                               dcu, ws, ws_bytes);
      else
        be.attention_backward(s, dq, dk, dv, dout, out, lse, q, k, v, sh, dcu);
    }, reps);
    const std::string bwd_impl = ran(e0, true);
    add_flops(cat("attention forward [", fwd_impl, "]"), shape, fwd_flops, ms);
    add_flops(cat("attention backward [", bwd_impl, "]"), shape, 2.5 * fwd_flops, msb);
    add_flops(cat("attention fwd+bwd [", fwd_impl == bwd_impl ? fwd_impl
                                                              : fwd_impl + "+" + bwd_impl, "]"),
              shape, 3.5 * fwd_flops, ms + msb);
    add_mib(cat("attention bwd workspace [", bwd_impl, "]"), shape,
            backward_workspace(im, bwd_impl == im.name, ws_bytes, at, sh, dcu));
  }
  cuda::set_attention_impl(cuda::cudnn_attention_available() ? cuda::AttentionImpl::cudnn
                                                             : cuda::AttentionImpl::native);
  cuda::set_attention_deterministic(true);
  // Back to what SF_ATTN_WS asks (the rows above set it per implementation).
  cuda::set_attention_ws_forward(cuda::ws_forward_setting() != cuda::WsForward::off);
  cuda::set_cudnn_dense_graphs(true);
  cuda::set_cudnn_packed_batch(cuda::PackedBatch::by_count);
  cuda::set_attention_ws_backward(true);
  b.free_all();
}

// The attention head shapes (heads, kv heads, D) to run: D 128 with 32/8 heads and D 64 with
// 64/16 (the same hidden size and FLOPs per token), or the one "--only <prefix>64|128" names.
std::vector<std::tuple<int64_t, int64_t, int64_t>> head_shapes(const std::string& prefix) {
  const std::string d = g_only.rfind(prefix, 0) == 0 ? g_only.substr(prefix.size()) : "";
  if (!d.empty() && d != "64" && d != "128") {
    std::fprintf(stderr, "bench_cuda_kernels: --only %s: the head dimensions are D64 and D128\n",
                 g_only.c_str());
    std::exit(2);
  }
  std::vector<std::tuple<int64_t, int64_t, int64_t>> all{{32, 8, 128}, {64, 16, 64}}, out;
  for (const auto& h : all)
    if (d.empty() || std::get<2>(h) == std::stoll(d)) out.push_back(h);
  return out;
}

// n_seqs sequences of L tokens.
void attention_shape(Bench& b, int64_t L, int64_t n_seqs, int64_t H, int64_t KV, int64_t D) {
  attention_call(b, std::vector<int64_t>(size_t(n_seqs), L), H, KV, D,
                 cat("seq ", L, " x ", n_seqs, ", ", H, "/", KV, " heads, D ", D));
}

// "--only attention:D64" (or D128) runs one head dimension's rows.
void attention_rows(Bench& b) {
  for (auto [H, KV, D] : head_shapes("attention:D")) {
    for (int64_t L : {1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072})
      if (g_seq == 0 || L == g_seq)
        attention_shape(b, L, std::max<int64_t>(1, 16384 / L), H, KV, D);
  }
}

// The packed mixes of unequal sequences: documents of 64 .. max_len tokens (a power of two
// drawn evenly from 64 .. max_len, plus up to as much again, capped at max_len), packed until
// `total`, the last one cut to fit. An integer LCG, so that bench/torch_attention_ref.py draws
// the same lengths (its varlen_mix).
std::vector<int64_t> varlen_mix(int64_t total, int64_t max_len, uint32_t seed) {
  uint32_t x = seed;
  auto next = [&] {
    x = uint32_t((uint64_t(x) * 1103515245u + 12345u) % 2147483648u);
    return int64_t(x >> 4);
  };
  int64_t exps = 0;
  while ((int64_t(64) << (exps + 1)) <= max_len) ++exps;
  std::vector<int64_t> lens;
  for (int64_t left = total; left > 0;) {
    const int64_t base = int64_t(64) << (next() % (exps + 1));
    const int64_t n = std::min({max_len, base + next() % base, left});
    lens.push_back(n);
    left -= n;
  }
  return lens;
}

struct VarlenMix {
  int64_t total, max_len;
  uint32_t seed;
};
constexpr VarlenMix kVarlenMixes[] = {{16384, 2048, 1}, {32768, 8192, 2}, {65536, 32768, 3}};

// "--only varlen" (or varlen:D64 / varlen:D128): the mixes above, each head dimension.
void varlen_rows(Bench& b) {
  for (auto [H, KV, D] : head_shapes("varlen:D")) {
    for (const VarlenMix& m : kVarlenMixes) {
      const std::vector<int64_t> lens = varlen_mix(m.total, m.max_len, m.seed);
      attention_call(b, lens, H, KV, D,
                     cat("varlen ", m.total, " (", lens.size(), " seqs <= ", m.max_len, "), ", H,
                         "/", KV, " heads, D ", D));
    }
  }
}

// "--only plans" (plans:tokens: cuda::PackedBatch::by_tokens; plans:count: by_count): what
// cuDNN's plan building costs a fine-tuning run. A stream of 16 batches of 8 rows x 8192 tokens
// (D 128, 32/8 heads), each row packed with varlen_mix documents of up to 8192 tokens, runs
// forward + backward with the host's lengths twice: cold (plans built as new parts appear) and
// warm (every plan cached). Rows: each pass's total and the plans built, with their build time.
// Run each policy in a process of its own: the plan cache is process-wide.
void plan_stream_rows(Bench& b) {
  if (!cuda::cudnn_attention_available()) return;
  const std::string pick = g_only.rfind("plans:", 0) == 0 ? g_only.substr(6) : "count";
  if (pick != "count" && pick != "tokens") {
    std::fprintf(stderr, "bench_cuda_kernels: --only %s: plans:count or plans:tokens\n",
                 g_only.c_str());
    std::exit(2);
  }
  cuda::set_cudnn_packed_batch(pick == "tokens" ? cuda::PackedBatch::by_tokens
                                                : cuda::PackedBatch::by_count);
  cuda::set_attention_impl(cuda::AttentionImpl::cudnn);
  cuda::set_attention_deterministic(false);
  const int64_t H = 32, KV = 8, D = 128, rows = 8, seq = 8192, T = rows * seq, n_batches = 16;
  std::vector<std::vector<int32_t>> cus;
  double sum_sq = 0;
  for (int64_t i = 0; i < n_batches; ++i) {
    std::vector<int32_t> cu{0};
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t n : varlen_mix(seq, seq, uint32_t(100 + i * rows + r))) {
        cu.push_back(cu.back() + int32_t(n));
        sum_sq += double(n) * double(n);
      }
    cus.push_back(cu);
  }
  const AttentionTensors at = attention_tensors(b, T, H, KV, D);
  const Mat &q = at.q, &k = at.k, &v = at.v, &out = at.out, &dq = at.dq, &dk = at.dk,
            &dv = at.dv, &dout = at.dout;
  float* lse = at.lse;
  // Each batch's cu_seqlens in a buffer of its own, uploaded before the clock starts (an upload
  // between batches would race the previous batch's kernels, which read it).
  std::vector<int32_t*> dcus;
  for (const std::vector<int32_t>& cu : cus) {
    dcus.push_back(static_cast<int32_t*>(b.rand_buf(DType::i32, cu.size())));
    upload(dcus.back(), cu.data(), cu.size() * 4, "cu");
  }
  const double flops = 3.5 * 4.0 * D * H * sum_sq / 2.0;
  for (const char* pass : {"cold", "warm"}) {
    const cuda::CudnnAttentionStats s0 = cuda::cudnn_attention_stats();
    b.sync();
    const auto t0 = std::chrono::steady_clock::now();
    int64_t n_seqs = 0;
    for (size_t i = 0; i < cus.size(); ++i) {
      const std::vector<int32_t>& cu = cus[i];
      int32_t* dcu = dcus[i];
      int32_t longest = 0;
      for (size_t j = 1; j < cu.size(); ++j) longest = std::max(longest, cu[j] - cu[j - 1]);
      AttentionShape sh{int(H), int(KV), int(D), 1.f / std::sqrt(float(D)),
                        int(cu.size() - 1), int(longest)};
      sh.host_cu_seqlens = cu.data();
      n_seqs += sh.n_seqs;
      b.be.attention_forward(b.st, out, lse, q, k, v, sh, dcu);
      b.be.attention_backward(b.st, dq, dk, dv, dout, out, lse, q, k, v, sh, dcu);
    }
    b.sync();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const cuda::CudnnAttentionStats s1 = cuda::cudnn_attention_stats();
    std::printf("plans %s [%s]: %lld batches (%lld seqs) in %.1f ms, %lld plans built in %.1f ms\n",
                pick.c_str(), pass, (long long)n_batches, (long long)n_seqs, ms,
                (long long)(s1.plans_built - s0.plans_built),
                1e3 * (s1.plan_build_seconds - s0.plan_build_seconds));
    add_flops(cat("attention stream fwd+bwd [by_", pick, ", ", pass, ", ",
                  s1.plans_built - s0.plans_built, " plans]"),
              cat(n_batches, " x ", rows, " x ", seq, " packed, D 128"), flops, ms);
  }
  cuda::set_cudnn_packed_batch(cuda::PackedBatch::by_count);
  cuda::set_attention_deterministic(true);
  b.free_all();
}

// Times the first 8 cuBLASLt candidates of each layer GEMM at 32K tokens, forward (y = x
// W^T), dX (dy W) and dW (dW += dy^T x, f32), and prints them: does the heuristic's first
// choice (what GemmLt::run uses) leave time on the table?
void gemm_algos(Bench& b, int64_t C, int64_t qkv, int64_t attn, int64_t F) {
  const int64_t T = 32768;
  cuda::GemmLt lt;
  const size_t ws_bytes = size_t(32) << 20;
  void* ws = b.rand_buf(DType::i32, ws_bytes / 4);  // i32: left unfilled
  struct Shape { const char* name; int64_t n, k; };
  // "--only gemm_algos:NAME" times one shape.
  const std::string prefix = "gemm_algos:";
  const std::string pick = g_only.rfind(prefix, 0) == 0 ? g_only.substr(prefix.size()) : "";
  for (Shape sh : {Shape{"qkv", qkv, C}, Shape{"o", C, attn}, Shape{"gate_up", 2 * F, C},
                   Shape{"down", C, F}}) {
    if (!pick.empty() && pick != sh.name) continue;
    Mat x = b.mat(DType::bf16, T, sh.k), w = b.mat(DType::bf16, sh.n, sh.k);
    Mat y = b.mat(DType::bf16, T, sh.n), dw = b.mat(DType::f32, sh.n, sh.k);
    const double flops = 2.0 * double(T) * double(sh.n) * double(sh.k);
    auto report = [&](const char* pass, const std::vector<cuda::GemmLt::AlgoTime>& r) {
      if (r.empty()) return;
      float best = r.front().ms;
      for (auto& t : r) best = std::min(best, t.ms);
      std::printf("gemm_algos %-8s %-3s %6lldx%lldx%lld first %.3f ms (%.0f TFLOP/s) best %.3f ms"
                  " (%.0f TFLOP/s, %+.1f%%) of %zu\n", sh.name, pass, (long long)T,
                  (long long)sh.n, (long long)sh.k, r.front().ms, flops / r.front().ms / 1e9,
                  best, flops / best / 1e9, 100.0 * (r.front().ms - best) / r.front().ms,
                  r.size());
      for (auto& t : r)
        std::printf("  #%d %.3f ms algo %d tile %d stages %d splitk %d\n", t.index, t.ms,
                    t.algo_id, t.tile, t.stages, t.splitk);
    };
    const int n = 8, reps = g_quick ? 3 : 5;
    report("fwd", lt.time_candidates(b.raw, ws, ws_bytes, y, x, Trans::no, w, Trans::yes, 1.f,
                                     0.f, n, reps));
    report("dX", lt.time_candidates(b.raw, ws, ws_bytes, x, y, Trans::no, w, Trans::no, 1.f, 0.f,
                                    n, reps));
    report("dW", lt.time_candidates(b.raw, ws, ws_bytes, dw, y, Trans::yes, x, Trans::no, 1.f,
                                    1.f, n, reps));
    b.free_all();
  }
}

void run(Bench& b) {
  auto& be = b.be;
  Stream& s = b.st;
  auto timeit = [&](const std::function<void()>& fn, int reps = 20) {
    return time_ms(b.raw, fn, reps);  // events on the backend's own stream
  };
  const int64_t T = 16384, C = 4096, H = 32, KV = 8, D = 128, F = 14336, V = 128256;
  const std::string tok = "16K tok";

  // ---- the ceiling: device-to-device copy ----
  if (want("copy")) {
    const size_t n = size_t(1) << 30;
    void* x = b.rand_buf(DType::bf16, n / 2);
    void* y = b.rand_buf(DType::bf16, n / 2);
    const double ms = timeit([&] { be.copy_on_device(s, y, x, n); });
    g_copy_gbs = 2.0 * n / ms / 1e6;
    g_rows.push_back({"copy D2D (ceiling)", "1 GiB", "GB/s", ms, g_copy_gbs, 1.0});
    b.free_all();
  }
  // ---- RMSNorm ----
  if (want("norm")) {
    Mat x = b.mat(DType::bf16, T, C), out = b.mat(DType::bf16, T, C), w = b.mat(DType::bf16, 1, C);
    Mat sum = b.mat(DType::bf16, T, C), dres = b.mat(DType::bf16, T, C);
    Mat dw = b.mat(DType::f32, 1, C);
    float* rstd = static_cast<float*>(b.rand_buf(DType::f32, size_t(T), 0.5f, 1.5f));
    double ms = timeit([&] { be.rmsnorm_forward(s, out, rstd, x, w, 1e-5f); });
    add_bw("rmsnorm_forward", tok + " x 4096", double(T) * C * 4 + T * 4.0, ms);
    ms = timeit([&] { be.add_rmsnorm_forward(s, sum, out, rstd, x, dres, w, 1e-5f); });
    add_bw("add_rmsnorm_forward", tok + " x 4096", double(T) * C * 8 + T * 4.0, ms);
    ms = timeit([&] { be.rmsnorm_backward(s, sum, dw, out, x, w, rstd, dres); });
    add_bw("rmsnorm_backward (+dres, dw)", tok + " x 4096", double(T) * C * 8 + T * 4.0, ms);
    // Qwen3 per-head q norm on [T, 32*128] groups.
    Mat wq = b.mat(DType::bf16, 1, D);
    ms = timeit([&] { be.rmsnorm_forward(s, out, nullptr, x, wq, 1e-6f); });
    add_bw("rmsnorm_forward per head (D=128)", tok + " x 32x128", double(T) * C * 4, ms);
    b.free_all();
  }
  // ---- RoPE on q and k, column blocks of the qkv output ----
  if (want("rope")) {
    const int64_t W = (H + 2 * KV) * D;
    Mat qkv = b.mat(DType::bf16, T, W);
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) pos[size_t(t)] = int32_t(t % 4096);
    std::vector<float> freq(D / 2);
    for (int i = 0; i < D / 2; ++i) freq[size_t(i)] = float(std::pow(500000.0, -2.0 * i / D));
    auto* dpos = static_cast<int32_t*>(b.rand_buf(DType::i32, size_t(T)));
    auto* dfreq = static_cast<float*>(b.rand_buf(DType::f32, size_t(D / 2)));
    upload(dpos, pos.data(), pos.size() * 4, "pos");
    upload(dfreq, freq.data(), freq.size() * 4, "freq");
    Mat q = qkv.col_block(0, H * D), k = qkv.col_block(H * D, KV * D);
    double ms = timeit([&] { be.rope_forward(s, q, int(H), int(D), dpos, dfreq); });
    add_bw("rope_forward q", tok + " x 32x128", double(T) * H * D * 4, ms);
    ms = timeit([&] { be.rope_forward(s, k, int(KV), int(D), dpos, dfreq); });
    add_bw("rope_forward k", tok + " x 8x128", double(T) * KV * D * 4, ms);
    b.free_all();
  }
  // ---- SwiGLU on the fused [T, 2F] gate_up output ----
  if (want("swiglu")) {
    Mat gu = b.mat(DType::bf16, T, 2 * F, -4.f, 4.f), out = b.mat(DType::bf16, T, F);
    Mat gate = gu.col_block(0, F), up = gu.col_block(F, F);
    double ms = timeit([&] { be.swiglu_forward(s, out, gate, up); });
    add_bw("swiglu_forward", tok + " x 14336", double(T) * F * 6, ms);
    ms = timeit([&] { be.swiglu_backward(s, gate, up, out, gate, up); });
    add_bw("swiglu_backward (in place)", tok + " x 14336", double(T) * F * 10, ms);
    b.free_all();
  }
  // ---- casts, axpy, sum of squares, AdamW, embedding ----
  if (want("elementwise")) {
    const int64_t n = int64_t(1) << 27;  // 128M elements (a 4096 x 32768 slab)
    Mat f = b.mat(DType::f32, 1, n), h = b.mat(DType::bf16, 1, n);
    double ms = timeit([&] { be.cast(s, h, f); });
    add_bw("cast f32->bf16", "128M", double(n) * 6, ms);
    ms = timeit([&] { be.cast(s, f, h); });
    add_bw("cast bf16->f32", "128M", double(n) * 6, ms);
    ms = timeit([&] { be.axpy(s, f, h, 0.5f); });
    add_bw("axpy f32 += bf16", "128M", double(n) * 10, ms);
    float* out = static_cast<float*>(b.rand_buf(DType::f32, 1));
    ms = timeit([&] { be.sum_squares(s, out, f); });
    add_bw("sum_squares f32", "128M", double(n) * 4, ms);
    b.free_all();
  }
  if (want("adamw")) {
    const int64_t n = int64_t(1) << 27;
    float* p = static_cast<float*>(b.rand_buf(DType::f32, size_t(n)));
    float* m = static_cast<float*>(b.rand_buf(DType::f32, size_t(n), -1e-3f, 1e-3f));
    float* v = static_cast<float*>(b.rand_buf(DType::f32, size_t(n), 0.f, 1e-4f));
    float* g = static_cast<float*>(b.rand_buf(DType::f32, size_t(n)));
    void* w = b.rand_buf(DType::bf16, size_t(n));
    AdamWStep st;
    st.lr = 1e-4f;
    st.weight_decay = 0.1f;
    st.step = 10;
    const double ms = timeit([&] { be.adamw(s, p, m, v, g, w, n, st); });
    add_bw("adamw (f32 p,m,v,g + bf16 out)", "128M params", double(n) * 30, ms);
    b.free_all();
  }
  if (want("embedding")) {
    Mat table = b.mat(DType::bf16, V, C), out = b.mat(DType::bf16, T, C);
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) ids[size_t(t)] = int32_t((t * 7919) % V);
    auto* dids = static_cast<int32_t*>(b.rand_buf(DType::i32, size_t(T)));
    upload(dids, ids.data(), ids.size() * 4, "ids");
    double ms = timeit([&] { be.embedding_forward(s, out, dids, table); });
    add_bw("embedding_forward", tok + " x 4096", double(T) * C * 4, ms);
    Mat dtable = b.mat(DType::f32, V, C);
    ms = timeit([&] { be.embedding_backward(s, dtable, dids, out); }, 5);
    add_bw("embedding_backward", tok + " x 4096", double(T) * C * 10, ms);
    b.free_all();
  }
  // ---- GEMM (the qkv projection) ----
  if (want("gemm")) {
    Mat x = b.mat(DType::bf16, T, C), w = b.mat(DType::bf16, (H + 2 * KV) * D, C);
    Mat y = b.mat(DType::bf16, T, (H + 2 * KV) * D);
    const double ms = timeit([&] { be.gemm(s, y, x, Trans::no, w, Trans::yes, 1.f, 0.f); });
    add_flops("gemm x @ Wqkv^T (bf16)", "16384x6144x4096", 2.0 * T * C * (H + 2 * KV) * D, ms);
    Mat dw = b.mat(DType::f32, (H + 2 * KV) * D, C);
    const double ms2 = timeit([&] { be.gemm(s, dw, y, Trans::yes, x, Trans::no, 1.f, 1.f); });
    add_flops("gemm dW += dy^T @ x (f32 acc)", "6144x4096x16384", 2.0 * T * C * (H + 2 * KV) * D,
              ms2);
    b.free_all();
  }
  // ---- the heuristic's GEMM candidates at the engine's layer shapes (only when asked) ----
  if (g_only.rfind("gemm_algos", 0) == 0) gemm_algos(b, C, (H + 2 * KV) * D, H * D, F);
  // ---- attention: each implementation, seq 1K..16K (16K tokens per call), then one sequence
  // of 32K, 64K, 128K; D 128 (32/8 heads) and D 64 (64/16 heads: the same hidden size and FLOPs
  // per token) ----
  if (runs_attention_rows()) attention_rows(b);
  // ---- attention over packed sequences of unequal lengths (varlen_mix) ----
  if (runs_varlen_rows()) varlen_rows(b);
  // ---- plan building over a run's stream of packed batches (only when asked) ----
  if (g_only.rfind("plans", 0) == 0) plan_stream_rows(b);
  // ---- fused LM head + cross-entropy ----
  if (want("lm_head")) {
    const int64_t chunk = 4096;
    Mat h = b.mat(DType::bf16, T, C), w = b.mat(DType::bf16, V, C, -0.05f, 0.05f);
    Mat dh = b.mat(DType::bf16, T, C), dw = b.mat(DType::f32, V, C);
    Mat scratch = b.mat(DType::f32, chunk, V);
    std::vector<int32_t> labels(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) labels[size_t(t)] = int32_t((t * 31) % V);
    auto* dl = static_cast<int32_t*>(b.rand_buf(DType::i32, size_t(T)));
    upload(dl, labels.data(), labels.size() * 4, "labels");
    float* loss = static_cast<float*>(b.rand_buf(DType::f32, 1));
    const double ms = timeit([&] {
      be.lm_head_loss(s, loss, dh, dw, h, w, dl, 1.f / float(T), scratch);
    }, 5);
    add_flops("lm_head_loss fwd+bwd (chunk 4096)", "16K tok, V 128256, C 4096",
              6.0 * double(T) * V * C, ms);
    std::printf("lm_head scratch (extra memory beyond inputs/grads): %.2f GiB\n",
                double(chunk) * V * 4 / double(1 << 30));
    b.free_all();
  }
}

}  // namespace
}  // namespace sf

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress survives a timeout
  const char* csv = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--quick")) sf::g_quick = true;
    else if (!std::strcmp(argv[i], "--csv") && i + 1 < argc) csv = argv[++i];
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) sf::g_only = argv[++i];
    else if (!std::strcmp(argv[i], "--span-ms") && i + 1 < argc) {
      char* end = nullptr;
      sf::g_span_ms = std::strtod(argv[++i], &end);
      if (end == argv[i] || *end != '\0' || !(sf::g_span_ms >= 0)) {
        std::fprintf(stderr, "bench_cuda_kernels: --span-ms '%s' is not a number of ms >= 0\n",
                     argv[i]);
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--seq") && i + 1 < argc) {
      char* end = nullptr;
      sf::g_seq = std::strtoll(argv[++i], &end, 10);
      if (end == argv[i] || *end != '\0' || sf::g_seq < 1024 || sf::g_seq > 131072 ||
          (sf::g_seq & (sf::g_seq - 1))) {
        std::fprintf(stderr, "bench_cuda_kernels: --seq '%s': the attention rows' lengths are "
                             "the powers of two 1024 .. 131072\n", argv[i]);
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--impl") && i + 1 < argc) {
      sf::g_impl = argv[++i];
      if (!sf::known_attention_impl(sf::g_impl)) {
        std::fprintf(stderr, "bench_cuda_kernels: --impl '%s': the attention rows' names are %s\n",
                     argv[i], sf::attention_impl_names().c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "bench_cuda_kernels: unknown argument, or one without its value: "
                           "'%s' (see the file's header)\n", argv[i]);
      return 2;
    }
  }
  if (sf::g_seq != 0 && sf::g_only.rfind("attention", 0) != 0) {
    std::fprintf(stderr, "bench_cuda_kernels: --seq picks among the fixed-length attention rows: "
                         "give --only attention (or attention:D64 / attention:D128) with it\n");
    return 2;
  }
  if (!sf::g_impl.empty() && !sf::runs_attention_rows() && !sf::runs_varlen_rows()) {
    std::fprintf(stderr, "bench_cuda_kernels: --impl picks among the attention rows, and --only "
                         "'%s' runs none (--only attention, attention:D64, varlen, ...)\n",
                 sf::g_only.c_str());
    return 2;
  }
  if (sf::CudaBackend::device_count() == 0) {
    std::printf("bench_cuda_kernels: no CUDA device, nothing to measure\n");
    return 0;
  }
  try {
    sf::Bench b;
    sf::run(b);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda_kernels: %s\n", e.what());
    return 1;
  }
  std::printf("\n%-36s %-34s %10s %12s %8s\n", "op", "shape", "ms", "rate", "of copy");
  for (auto& r : sf::g_rows)
    std::printf("%-36s %-34s %10.3f %8.1f %-7s %s\n", r.op.c_str(), r.shape.c_str(), r.ms, r.value,
                r.unit.c_str(), r.frac >= 0 ? sf::cat(int(std::lround(r.frac * 100)), "%").c_str() : "");
  if (csv) {
    FILE* f = std::fopen(csv, "w");
    if (f) {
      std::fprintf(f, "op,shape,ms,value,unit,frac_of_copy\n");
      for (auto& r : sf::g_rows)
        std::fprintf(f, "%s,%s,%.4f,%.2f,%s,%.3f\n", r.op.c_str(), r.shape.c_str(), r.ms, r.value,
                     r.unit.c_str(), r.frac);
      std::fclose(f);
    }
  }
  return 0;
}
