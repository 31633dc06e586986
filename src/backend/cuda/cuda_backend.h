// The CUDA backend: bf16 storage, fp32 accumulation, every op enqueued on a CUDA stream.
//
// Memory: alloc() is cudaMalloc counted by a byte counter (bytes_in_use / peak), optionally
// capped by a budget (the planner's --gpu-memory): CUDA enforces no budget, so we do.
// Streams: created non-blocking and named (NVTX). Each stream that runs a compute op owns a
// workspace allocated at its first such op and counted like any buffer: the cuBLASLt
// workspace (kGemmWorkspaceBytes) and the reduction scratch (kReduceWorkspaceBytes). So ops on
// different streams never share scratch, and no op allocates after that first one.
// Streams must not outlive the backend (their workspace is its memory).
// Ops: see backend.h; the kernels and their contracts live in backend/cuda/*.cuh. Mats are
// checked (dtype, shape) before anything is enqueued; GPU-side faults surface at the next
// synchronising call as Error(ErrorKind::cuda).
#pragma once
#include <atomic>
#include <memory>
#include <mutex>

#include "backend/backend.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*; keeps cuda_runtime.h out of this header

namespace sf {
namespace cuda {
class GemmLt;
}

class CudaBackend final : public Backend {
 public:
  static constexpr size_t kGemmWorkspaceBytes = size_t(32) << 20;
  static constexpr size_t kReduceWorkspaceBytes = size_t(8) << 20;

  // Uses CUDA device `device` (made current on this thread). memory_budget == 0: no cap
  // beyond the device itself.
  explicit CudaBackend(int device = 0, size_t memory_budget = 0);
  ~CudaBackend() override;

  // Number of CUDA devices (0 without a GPU or driver); never throws.
  static int device_count();

  BackendKind kind() const override { return BackendKind::cuda; }
  std::string name() const override;
  DType compute_dtype() const override { return DType::bf16; }
  int device() const { return device_; }

  std::unique_ptr<Buffer> alloc(size_t bytes, const std::string& what) override;
  // Pinned (page-locked) host memory, so copies are true asynchronous DMA (cuda_pinned.cpp).
  std::unique_ptr<Buffer> alloc_host(size_t bytes, const std::string& what) override;
  // Page-locks and maps the range (cudaHostRegister): kernels read it over PCIe.
  std::unique_ptr<Buffer> map_host(void* p, size_t bytes, const std::string& what) override;
  size_t bytes_in_use() const override { return in_use_.load(); }
  size_t peak_bytes_in_use() const override { return peak_.load(); }
  void reset_peak() { peak_.store(in_use_.load()); }
  size_t device_used_bytes() const override;  // cudaMemGetInfo of device(); 0 if it fails
  std::string one_off_costs() const override;  // cuDNN's attention plans built so far
  void copy_to_device(Stream& s, void* dst, const void* src, size_t bytes) override;
  void copy_to_host(Stream& s, void* dst, const void* src, size_t bytes) override;
  void copy_on_device(Stream& s, void* dst, const void* src, size_t bytes) override;
  void fill_zero(Stream& s, void* dst, size_t bytes) override;

  std::unique_ptr<Stream> create_stream(const std::string& name) override;
  // The CUDA stream behind a Stream of this backend (for interop and timing with events).
  static CUstream_st* cuda_stream(Stream& s);
  std::unique_ptr<Event> create_event() override;
  std::unique_ptr<Event> create_timing_event() override;
  bool annotates() const override { return true; }
  void range_push(const char* name) override;
  void range_pop() override;
  Stream& default_stream() override;

  // GEMM algorithm tuning on or off (cuda::GemmLt; the constructor reads SF_GEMM_TUNE=1).
  // Starts a fresh algorithm cache; call with no GEMM in flight (bench_cuda_layer --gemm-ab).
  void set_gemm_tuning(bool on);
  void gemm(Stream& s, Mat c, Mat a, Trans ta, Mat b, Trans tb, float alpha,
            float beta) override;
  void bias_add(Stream& s, Mat x, Mat bias) override;
  void bias_backward(Stream& s, Mat dbias, Mat dy) override;
  void embedding_forward(Stream& s, Mat out, const int32_t* ids, Mat table) override;
  void embedding_backward(Stream& s, Mat dtable, const int32_t* ids, Mat dout) override;
  void rmsnorm_forward(Stream& s, Mat out, float* rstd, Mat x, Mat w, float eps) override;
  void add_rmsnorm_forward(Stream& s, Mat sum, Mat out, float* rstd, Mat a, Mat b, Mat w,
                           float eps) override;
  void rmsnorm_backward(Stream& s, Mat dx, Mat dw, Mat dout, Mat x, Mat w, const float* rstd,
                        Mat dres) override;
  void rope_forward(Stream& s, Mat x, int n_heads, int head_dim, const int32_t* pos,
                    const float* inv_freq) override;
  void rope_backward(Stream& s, Mat dx, int n_heads, int head_dim, const int32_t* pos,
                     const float* inv_freq) override;
  void attention_forward(Stream& s, Mat out, float* lse, Mat q, Mat k, Mat v,
                         const AttentionShape& shape, const int32_t* cu_seqlens) override;
  void attention_backward(Stream& s, Mat dq, Mat dk, Mat dv, Mat dout, Mat out,
                          const float* lse, Mat q, Mat k, Mat v, const AttentionShape& shape,
                          const int32_t* cu_seqlens) override;
  void attention_decode(Stream& s, Mat out, Mat q, Mat k_cache, Mat v_cache,
                        const AttentionShape& shape, int64_t kv_len) override;
  void swiglu_forward(Stream& s, Mat out, Mat gate, Mat up) override;
  void swiglu_backward(Stream& s, Mat dgate, Mat dup, Mat dout, Mat gate, Mat up) override;
  void lm_head_loss(Stream& s, float* loss_sum, Mat dh, Mat dw, Mat h, Mat w,
                    const int32_t* labels, float grad_scale, Mat scratch) override;
  void cast(Stream& s, Mat dst, Mat src) override;
  void axpy(Stream& s, Mat dst, Mat src, float alpha) override;
  void sum_squares(Stream& s, float* out, Mat x) override;
  void adamw(Stream& s, float* param, float* m, float* v, const float* grad, void* weights_out,
             int64_t n, const AdamWStep& step) override;
  void adamw_state(Stream& s, const UnitStateView& state, int64_t off, int64_t len,
                   const float* grad, void* weights_out, std::span<const ParamRange> ranges,
                   const AdamWStep& step) override;

  struct StreamImpl;  // the Stream implementation (opaque; defined in cuda_backend.cpp)

 private:
  friend class CudaBuffer;
  StreamImpl& impl(Stream& s);
  // The stream's workspace, allocated at its first compute op.
  struct Scratch {
    void* gemm;
    void* reduce;
  };
  Scratch scratch(Stream& s);

  int device_ = 0;
  size_t budget_ = 0;
  std::atomic<size_t> in_use_{0}, peak_{0};
  std::unique_ptr<cuda::GemmLt> gemm_;
  std::unique_ptr<Stream> default_stream_;
  std::mutex mu_;
};

}  // namespace sf
