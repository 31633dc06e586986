// The host backend: fp32 reference implementation of every Backend op, on the CPU.
// Synchronous: an op is complete when its call returns; streams and events only keep the
// engine's ordering code identical on both backends. Memory is 64-byte aligned host memory.
#pragma once
#include <algorithm>
#include <atomic>

#include "backend/backend.h"

namespace sf {

class HostBackend final : public Backend {
 public:
  HostBackend() = default;
  BackendKind kind() const override { return BackendKind::host; }
  std::string name() const override { return "host"; }
  DType compute_dtype() const override { return DType::f32; }

  std::unique_ptr<Buffer> alloc(size_t bytes, const std::string& what) override;
  size_t bytes_in_use() const override { return in_use_.load(); }
  size_t peak_bytes_in_use() const override { return peak_.load(); }
  void copy_to_device(Stream& s, void* dst, const void* src, size_t bytes) override;
  void copy_to_host(Stream& s, void* dst, const void* src, size_t bytes) override;
  void copy_on_device(Stream& s, void* dst, const void* src, size_t bytes) override;
  void fill_zero(Stream& s, void* dst, size_t bytes) override;

  std::unique_ptr<Stream> create_stream(const std::string& name) override;
  std::unique_ptr<Event> create_event() override;
  Stream& default_stream() override;

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

 private:
  friend class HostBuffer;
  std::atomic<size_t> in_use_{0}, peak_{0};
  std::unique_ptr<Stream> default_stream_;
};

// Helpers shared by the host op files (src/backend/host/host_*.cpp); not a public API.
namespace host_detail {
// SF_CHECKs that m is an f32 view with ld >= cols and data when non-empty, naming op/arg.
void check_f32(const Mat& m, const char* op, const char* arg);
// SF_CHECKs m's shape.
void check_shape(const Mat& m, int64_t rows, int64_t cols, const char* op, const char* arg);
inline float* frow(const Mat& m, int64_t r) { return static_cast<float*>(m.data) + r * m.ld; }
// Rows per parallel range so that one range holds at least ~16K elements: small ops then
// run inline instead of waking the pool.
inline int64_t row_grain(int64_t cols) {
  return std::max<int64_t>(1, 16384 / std::max<int64_t>(1, cols));
}
// sum_i a[i]*b[i] in double, four partial sums in a fixed order (deterministic).
inline double dot_d(const float* a, const float* b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += double(a[i]) * b[i];
    s1 += double(a[i + 1]) * b[i + 1];
    s2 += double(a[i + 2]) * b[i + 2];
    s3 += double(a[i + 3]) * b[i + 3];
  }
  for (; i < n; ++i) s0 += double(a[i]) * b[i];
  return (s0 + s1) + (s2 + s3);
}
// sum_i a[i]*b[i] in f32 with eight partial sums combined in a fixed order: vectorisable by
// the compiler without -ffast-math, deterministic, and more accurate than one running sum.
inline float dot_f(const float* a, const float* b, int64_t n) {
  float s[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int u = 0; u < 8; ++u) s[u] += a[i + u] * b[i + u];
  float r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}
}  // namespace host_detail

}  // namespace sf
