// CudaBackend: memory (counted, optionally budgeted), named streams with their workspaces,
// events, and the Backend ops, each forwarded to its launcher (kernels in backend/cuda/*.cu).
// GEMMs and the LM head's GEMMs go through cuda::GemmLt (cuBLASLt). Attention runs cuDNN's
// fused kernels where cuda::attention_impl() says so and cuDNN has a plan for the shape
// (cudnn_attention.h; workspace: one growable buffer per stream), else our kernels.
#include "backend/cuda/cuda_backend.h"


#include <nvtx3/nvToolsExtCudaRt.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/cudnn_attention.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/embedding.cuh"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/lm_head.cuh"
#include "backend/cuda/norm.cuh"
#include "backend/cuda/rope.cuh"
#include "backend/cuda/state_adamw.cuh"
#include "backend/cuda/swiglu.cuh"
#include "backend/cuda/workspace.h"

namespace sf {

// ---- memory ----------------------------------------------------------------------------------

class CudaBuffer final : public Buffer {
 public:
  CudaBuffer(CudaBackend& be, void* p, size_t n) : be_(be), p_(p), n_(n) {}
  ~CudaBuffer() override {
    cudaFree(p_);  // no throw from a destructor; a failed free only leaks
    be_.in_use_ -= n_;
  }
  void* data() const override { return p_; }
  size_t bytes() const override { return n_; }

 private:
  CudaBackend& be_;
  void* p_;
  size_t n_;
};

namespace {

std::string mib(size_t b) { return cat(b >> 20, " MiB"); }

class CudaEvent final : public Event {
 public:
  explicit CudaEvent(bool timing = false) {
    CUDA_CHECK(cudaEventCreateWithFlags(&e_, timing ? cudaEventDefault : cudaEventDisableTiming));
  }
  ~CudaEvent() override { cudaEventDestroy(e_); }
  void record(Stream& s) override;
  void wait(Stream& s) override;
  void synchronize() override { CUDA_CHECK(cudaEventSynchronize(e_)); }
  bool query() override {
    const cudaError_t r = cudaEventQuery(e_);
    if (r == cudaErrorNotReady) return false;
    CUDA_CHECK(r);
    return true;
  }
  // A diagnostic: an event pair that cannot be timed gives -1 rather than an error (the
  // failure is not sticky, nothing else is affected).
  double seconds_since(Event& start) override {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, static_cast<CudaEvent&>(start).e_, e_) != cudaSuccess) return -1;
    return double(ms) * 1e-3;
  }

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace

struct CudaBackend::StreamImpl final : public Stream {
  cudaStream_t s = nullptr;
  std::string name;
  std::unique_ptr<Buffer> gemm_ws, reduce_ws;
  std::unique_ptr<Buffer> attn_ws;  // cuDNN attention workspace, grown to the largest call
  size_t attn_ws_bytes = 0;

  explicit StreamImpl(const std::string& n) : name(n) {
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    nvtxNameCudaStreamA(s, name.c_str());
  }
  ~StreamImpl() override {
    if (s) {
      cudaStreamSynchronize(s);  // buffers below are freed right after; let the work finish
      cudaStreamDestroy(s);
    }
  }
  void synchronize() override { CUDA_CHECK(cudaStreamSynchronize(s)); }
};

namespace {
cudaStream_t raw(Stream& s) {
  auto* impl = dynamic_cast<CudaBackend::StreamImpl*>(&s);
  SF_CHECK(impl != nullptr, "a non-CUDA stream was passed to the CUDA backend");
  return impl->s;
}
}  // namespace

void CudaEvent::record(Stream& s) { CUDA_CHECK(cudaEventRecord(e_, raw(s))); }
void CudaEvent::wait(Stream& s) { CUDA_CHECK(cudaStreamWaitEvent(raw(s), e_, 0)); }

int CudaBackend::device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

CudaBackend::CudaBackend(int device, size_t memory_budget)
    : device_(device), budget_(memory_budget) {
  const int n = device_count();
  SF_REQUIRE(n > 0, "no CUDA device found (driver missing or no GPU); use the host backend");
  SF_REQUIRE(device >= 0 && device < n, "CUDA device ", device, " does not exist (", n,
             " found)");
  CUDA_CHECK(cudaSetDevice(device));
  // GEMM algorithm tuning (GemmLt: the first call of a beta-0 problem times the heuristic's
  // candidates and keeps one >= 3% faster) is on unless SF_GEMM_TUNE=0. Same-lease A/B on the
  // H200, 8B batch 64: 10,446 steady tokens/s tuned against 10,322. Off, the heuristic's
  // choice is the same every run, so a resumed run repeats an uninterrupted one bit for bit;
  // tuned, a resume may pick another tile shape (same results within bf16 GEMM rounding).
  const char* tune = std::getenv("SF_GEMM_TUNE");
  gemm_ = std::make_unique<cuda::GemmLt>(tune == nullptr || std::string(tune) != "0");
}

void CudaBackend::set_gemm_tuning(bool on) {
  CUDA_CHECK(cudaDeviceSynchronize());  // no GEMM may still use the old cache's descriptors
  gemm_ = std::make_unique<cuda::GemmLt>(on);
}

CudaBackend::~CudaBackend() {
  default_stream_.reset();
  gemm_.reset();
}

std::string CudaBackend::name() const {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device_) != cudaSuccess) return "cuda";
  return cat("cuda:", device_, " (", prop.name, ", sm_", prop.major, prop.minor, ")");
}

std::unique_ptr<Buffer> CudaBackend::alloc(size_t bytes, const std::string& what) {
  const size_t n = (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
  if (budget_ && in_use_.load() + n > budget_)
    SF_FAIL(out_of_memory, "GPU budget exceeded allocating ", mib(n), " for ", what, ": ",
            mib(in_use_.load()), " in use of a ", mib(budget_),
            " budget; raise the GPU memory budget or use smaller chunks");
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    SF_FAIL(out_of_memory, "cudaMalloc of ", mib(n), " for ", what, " failed (",
            cudaGetErrorString(e), "): ", mib(in_use_.load()), " in use by slideformer, ",
            mib(free_b), " free of ", mib(total_b), " on the device");
  }
  const size_t now = (in_use_ += n);
  size_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  return std::make_unique<CudaBuffer>(*this, p, n);
}

size_t CudaBackend::device_used_bytes() const {
  size_t free_b = 0, total_b = 0;
  if (cudaSetDevice(device_) != cudaSuccess || cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) {
    cudaGetLastError();  // a failed query must not surface as a later op's error
    return 0;
  }
  return total_b - free_b;
}

// cuDNN's plans are process-wide, so this counts those built for any backend of the process.
std::string CudaBackend::one_off_costs() const {
  return cuda::describe_plan_building(cuda::cudnn_attention_stats());
}

void CudaBackend::copy_to_device(Stream& s, void* dst, const void* src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, raw(s)));
}
void CudaBackend::copy_to_host(Stream& s, void* dst, const void* src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, raw(s)));
}
void CudaBackend::copy_on_device(Stream& s, void* dst, const void* src, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, raw(s)));
}
void CudaBackend::fill_zero(Stream& s, void* dst, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, raw(s)));
}

// ---- streams and events ------------------------------------------------------------------------

std::unique_ptr<Stream> CudaBackend::create_stream(const std::string& name) {
  CUDA_CHECK(cudaSetDevice(device_));
  return std::make_unique<StreamImpl>(name);
}
std::unique_ptr<Event> CudaBackend::create_event() { return std::make_unique<CudaEvent>(); }
std::unique_ptr<Event> CudaBackend::create_timing_event() { return std::make_unique<CudaEvent>(true); }

// NVTX 3 is header-only: without a profiler attached a push is a call through a null hook.
void CudaBackend::range_push(const char* name) { nvtxRangePushA(name); }
void CudaBackend::range_pop() { nvtxRangePop(); }
Stream& CudaBackend::default_stream() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!default_stream_) default_stream_ = std::make_unique<StreamImpl>("compute");
  return *default_stream_;
}

CUstream_st* CudaBackend::cuda_stream(Stream& s) { return raw(s); }

CudaBackend::StreamImpl& CudaBackend::impl(Stream& s) {
  auto* p = dynamic_cast<StreamImpl*>(&s);
  SF_CHECK(p != nullptr, "a non-CUDA stream was passed to the CUDA backend");
  return *p;
}

CudaBackend::Scratch CudaBackend::scratch(Stream& s) {
  StreamImpl& st = impl(s);
  if (!st.gemm_ws) {
    st.gemm_ws = alloc(kGemmWorkspaceBytes, cat("cuBLASLt workspace of stream ", st.name));
    st.reduce_ws = alloc(kReduceWorkspaceBytes, cat("reduction workspace of stream ", st.name));
  }
  return {st.gemm_ws->data(), st.reduce_ws->data()};
}

namespace {
cuda::Workspace reduce_ws(void* p) { return {p, CudaBackend::kReduceWorkspaceBytes}; }
}  // namespace

// ---- GEMM ------------------------------------------------------------------------------------

void CudaBackend::gemm(Stream& s, Mat c, Mat a, Trans ta, Mat b, Trans tb, float alpha,
                       float beta) {
  NVTX_RANGE("gemm");
  SF_CHECK(a.dtype == DType::bf16 && b.dtype == DType::bf16, "cuda gemm: a and b must be bf16, "
           "got ", dtype_name(a.dtype), " and ", dtype_name(b.dtype));
  SF_CHECK(c.dtype == DType::bf16 || c.dtype == DType::f32, "cuda gemm: c must be bf16 or f32, "
           "got ", dtype_name(c.dtype));
  const int64_t M = ta == Trans::no ? a.rows : a.cols;
  const int64_t K = ta == Trans::no ? a.cols : a.rows;
  const int64_t Kb = tb == Trans::no ? b.rows : b.cols;
  const int64_t N = tb == Trans::no ? b.cols : b.rows;
  SF_CHECK(K == Kb && c.rows == M && c.cols == N, "cuda gemm: op(a) is [", M, ", ", K,
           "], op(b) is [", Kb, ", ", N, "], c is [", c.rows, ", ", c.cols, "]");
  if (M == 0 || N == 0) return;
  if (K == 0) {  // empty product: c = beta * c
    cuda::launch_scale(raw(s), c, beta);
    return;
  }
  const Scratch ws = scratch(s);
  gemm_->run(raw(s), ws.gemm, kGemmWorkspaceBytes, c, a, ta, b, tb, alpha, beta);
}

void CudaBackend::bias_add(Stream& s, Mat x, Mat bias) { cuda::launch_bias_add(raw(s), x, bias); }

void CudaBackend::bias_backward(Stream& s, Mat dbias, Mat dy) {
  cuda::launch_bias_backward(raw(s), dbias, dy, reduce_ws(scratch(s).reduce));
}

// ---- embedding, norms, rope, attention, swiglu ----------------------------------------------

void CudaBackend::embedding_forward(Stream& s, Mat out, const int32_t* ids, Mat table) {
  cuda::launch_embedding_forward(raw(s), out, ids, table);
}
void CudaBackend::embedding_backward(Stream& s, Mat dtable, const int32_t* ids, Mat dout) {
  cuda::launch_embedding_backward(raw(s), dtable, ids, dout);
}

void CudaBackend::rmsnorm_forward(Stream& s, Mat out, float* rstd, Mat x, Mat w, float eps) {
  cuda::launch_rmsnorm_forward(raw(s), out, rstd, x, w, eps);
}
void CudaBackend::add_rmsnorm_forward(Stream& s, Mat sum, Mat out, float* rstd, Mat a, Mat b,
                                      Mat w, float eps) {
  cuda::launch_add_rmsnorm_forward(raw(s), sum, out, rstd, a, b, w, eps);
}
void CudaBackend::rmsnorm_backward(Stream& s, Mat dx, Mat dw, Mat dout, Mat x, Mat w,
                                   const float* rstd, Mat dres) {
  cuda::launch_rmsnorm_backward(raw(s), dx, dw, dout, x, w, rstd, dres,
                                reduce_ws(scratch(s).reduce));
}

void CudaBackend::rope_forward(Stream& s, Mat x, int n_heads, int head_dim, const int32_t* pos,
                               const float* inv_freq) {
  cuda::launch_rope(raw(s), x, n_heads, head_dim, pos, inv_freq, false);
}
void CudaBackend::rope_backward(Stream& s, Mat dx, int n_heads, int head_dim,
                                const int32_t* pos, const float* inv_freq) {
  cuda::launch_rope(raw(s), dx, n_heads, head_dim, pos, inv_freq, true);
}

// Attention: cuDNN's fused kernels where selected for the pass (cuda::attention_impl,
// cudnn_runs_pass) and cuDNN builds a plan for the shape, else ours. The cuDNN path's workspace
// belongs to the stream (counted like any buffer) and grows to the largest call; growing waits
// for the stream's work first.
namespace {
bool run_cudnn_attention(CudaBackend& be, Stream& s, const cuda::CudnnAttentionCall& c) {
  if (!cuda::cudnn_runs_pass(cuda::attention_impl(), c.backward)) return false;
  const size_t bytes = cuda::cudnn_attention_workspace_bytes(c);
  if (bytes == 0) return false;
  auto& st = dynamic_cast<CudaBackend::StreamImpl&>(s);
  if (st.attn_ws_bytes < bytes) {
    st.synchronize();
    st.attn_ws.reset();
    st.attn_ws_bytes = 0;
    try {
      st.attn_ws = be.alloc(bytes, cat("cuDNN attention workspace of stream ", st.name));
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::out_of_memory) throw;
      static std::once_flag once;
      std::call_once(once, [&] {
        std::fprintf(stderr, "sf: no memory for the cuDNN attention workspace (%zu bytes): "
                             "the native kernels run such calls (%s)\n", bytes, e.what());
      });
      return false;
    }
    st.attn_ws_bytes = bytes;
  }
  return cuda::cudnn_attention_run(raw(s), c, st.attn_ws->data(), st.attn_ws_bytes);
}
}  // namespace

void CudaBackend::attention_forward(Stream& s, Mat out, float* lse, Mat q, Mat k, Mat v,
                                    const AttentionShape& shape, const int32_t* cu_seqlens) {
  cuda::CudnnAttentionCall c;
  c.q = q;
  c.k = k;
  c.v = v;
  c.out = out;
  c.lse = lse;
  c.cu_seqlens = cu_seqlens;
  c.shape = shape;
  if (run_cudnn_attention(*this, s, c)) return;
  cuda::launch_attention_forward(raw(s), out, lse, q, k, v, shape, cu_seqlens);
}
void CudaBackend::attention_backward(Stream& s, Mat dq, Mat dk, Mat dv, Mat dout, Mat out,
                                     const float* lse, Mat q, Mat k, Mat v,
                                     const AttentionShape& shape, const int32_t* cu_seqlens) {
  cuda::CudnnAttentionCall c;
  c.q = q;
  c.k = k;
  c.v = v;
  c.out = out;
  c.lse = const_cast<float*>(lse);  // read only in the backward
  c.dq = dq;
  c.dk = dk;
  c.dv = dv;
  c.dout = dout;
  c.cu_seqlens = cu_seqlens;
  c.shape = shape;
  c.backward = true;
  if (run_cudnn_attention(*this, s, c)) return;
  cuda::launch_attention_backward(raw(s), dq, dk, dv, dout, out, lse, q, k, v, shape,
                                  cu_seqlens);
}

void CudaBackend::attention_decode(Stream& s, Mat out, Mat q, Mat k_cache, Mat v_cache,
                                   const AttentionShape& shape, int64_t kv_len) {
  cuda::launch_attention_decode(raw(s), out, q, k_cache, v_cache, shape, kv_len);
}
void CudaBackend::swiglu_forward(Stream& s, Mat out, Mat gate, Mat up) {
  cuda::launch_swiglu_forward(raw(s), out, gate, up);
}
void CudaBackend::swiglu_backward(Stream& s, Mat dgate, Mat dup, Mat dout, Mat gate, Mat up) {
  cuda::launch_swiglu_backward(raw(s), dgate, dup, dout, gate, up);
}

// ---- LM head + cross-entropy -------------------------------------------------------------------

void CudaBackend::lm_head_loss(Stream& s, float* loss_sum, Mat dh, Mat dw, Mat h, Mat w,
                               const int32_t* labels, float grad_scale, Mat scratch_m) {
  NVTX_RANGE("lm_head_loss");
  SF_CHECK(h.dtype == DType::bf16 && w.dtype == DType::bf16, "cuda lm_head_loss: h and w must "
           "be bf16, got ", dtype_name(h.dtype), " and ", dtype_name(w.dtype));
  const int64_t T = h.rows, C = h.cols, V = w.rows;
  SF_CHECK(w.cols == C, "cuda lm_head_loss: w is [", V, ", ", w.cols, "], h has ", C, " columns");
  SF_CHECK(scratch_m.dtype == DType::f32 && scratch_m.cols == V && scratch_m.rows >= 1,
           "cuda lm_head_loss: scratch is ", dtype_name(scratch_m.dtype), " [", scratch_m.rows,
           ", ", scratch_m.cols, "], expected f32 [chunk >= 1, vocab ", V, "]");
  SF_CHECK(loss_sum != nullptr, "cuda lm_head_loss: loss_sum is null");
  SF_CHECK(labels != nullptr || T == 0, "cuda lm_head_loss: labels is null");
  const bool want_dh = !dh.empty(), want_dw = !dw.empty();
  if (want_dh)
    SF_CHECK(dh.dtype == DType::bf16 && dh.rows == T && dh.cols == C, "cuda lm_head_loss: dh is ",
             dtype_name(dh.dtype), " [", dh.rows, ", ", dh.cols, "], expected bf16 [", T, ", ", C,
             "]");
  if (want_dw)
    SF_CHECK(dw.dtype == DType::f32 && dw.rows == V && dw.cols == C, "cuda lm_head_loss: dw is ",
             dtype_name(dw.dtype), " [", dw.rows, ", ", dw.cols, "], expected f32 [", V, ", ", C,
             "]");
  const cudaStream_t st = raw(s);
  const int64_t chunk = scratch_m.rows;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = std::min(chunk, T - t0);
    const Mat logits = scratch_m.row_block(0, n);
    const Mat hc = h.row_block(t0, n);
    gemm(s, logits, hc, Trans::no, w, Trans::yes, 1.f, 0.f);
    cuda::launch_ce_rows(st, logits, labels + t0, grad_scale, want_dh || want_dw);
    cuda::launch_ce_loss_sum(st, loss_sum, logits);
    const Mat dl = cuda::ce_dlogits_view(logits);
    if (want_dh) gemm(s, dh.row_block(t0, n), dl, Trans::no, w, Trans::no, 1.f, 0.f);
    if (want_dw) gemm(s, dw, dl, Trans::yes, hc, Trans::no, 1.f, 1.f);
  }
}

// ---- elementwise, reductions, optimizer ------------------------------------------------------

void CudaBackend::cast(Stream& s, Mat dst, Mat src) { cuda::launch_cast(raw(s), dst, src); }
void CudaBackend::axpy(Stream& s, Mat dst, Mat src, float alpha) {
  cuda::launch_axpy(raw(s), dst, src, alpha);
}
void CudaBackend::sum_squares(Stream& s, float* out, Mat x) {
  cuda::launch_sum_squares(raw(s), out, x, reduce_ws(scratch(s).reduce));
}
void CudaBackend::adamw(Stream& s, float* param, float* m, float* v, const float* grad,
                        void* weights_out, int64_t n, const AdamWStep& step) {
  cuda::launch_adamw(raw(s), param, m, v, grad, weights_out, n, step);
}
void CudaBackend::adamw_state(Stream& s, const UnitStateView& state, int64_t off, int64_t len,
                              const float* grad, void* weights_out,
                              std::span<const ParamRange> ranges, const AdamWStep& step) {
  cuda::launch_adamw_state(raw(s), state, off, len, grad, static_cast<uint16_t*>(weights_out),
                           ranges, step);
}

// ---- device info used by the launchers --------------------------------------------------------

namespace cuda {
int sm_count() {
  static std::mutex mu;
  static int counts[64] = {};
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  if (dev < 64 && counts[dev] > 0) return counts[dev];
  int n = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  if (dev < 64) counts[dev] = n;
  return n;
}
}  // namespace cuda

}  // namespace sf
