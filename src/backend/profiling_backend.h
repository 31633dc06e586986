// ProfilingBackend: a Backend that forwards every call to another one and times each compute
// op with the inner backend's timing events, to see where a layer's device time goes
// (bench_cuda_layer --profile). Memory, copies, streams and events pass straight through.
// Ops are keyed by name, GEMMs also by shape, transposes, output dtype and beta, so each of a
// layer's projections shows on its own line.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace sf {

class ProfilingBackend final : public Backend {
 public:
  explicit ProfilingBackend(Backend& inner) : in_(inner) {}

  struct Line {
    std::string op;
    int calls = 0;
    double seconds = 0;
  };
  // Waits for every timed op, then returns the totals per key (largest first) and clears
  // them. Ops the inner backend cannot time are counted with 0 s.
  std::vector<Line> take();

  BackendKind kind() const override { return in_.kind(); }
  std::string name() const override { return in_.name() + " (profiled)"; }
  DType compute_dtype() const override { return in_.compute_dtype(); }
  std::unique_ptr<Buffer> alloc(size_t bytes, const std::string& what) override { return in_.alloc(bytes, what); }
  std::unique_ptr<Buffer> alloc_host(size_t bytes, const std::string& what) override { return in_.alloc_host(bytes, what); }
  std::unique_ptr<Buffer> map_host(void* p, size_t bytes, const std::string& what) override { return in_.map_host(p, bytes, what); }
  size_t bytes_in_use() const override { return in_.bytes_in_use(); }
  size_t peak_bytes_in_use() const override { return in_.peak_bytes_in_use(); }
  void copy_to_device(Stream& s, void* d, const void* src, size_t n) override { in_.copy_to_device(s, d, src, n); }
  void copy_to_host(Stream& s, void* d, const void* src, size_t n) override { in_.copy_to_host(s, d, src, n); }
  void copy_on_device(Stream& s, void* d, const void* src, size_t n) override { in_.copy_on_device(s, d, src, n); }
  void fill_zero(Stream& s, void* d, size_t n) override;
  std::unique_ptr<Stream> create_stream(const std::string& n) override { return in_.create_stream(n); }
  std::unique_ptr<Event> create_event() override { return in_.create_event(); }
  std::unique_ptr<Event> create_timing_event() override { return in_.create_timing_event(); }
  Stream& default_stream() override { return in_.default_stream(); }

  void gemm(Stream& s, Mat c, Mat a, Trans ta, Mat b, Trans tb, float alpha, float beta) override;
  void bias_add(Stream& s, Mat x, Mat bias) override;
  void bias_backward(Stream& s, Mat dbias, Mat dy) override;
  void embedding_forward(Stream& s, Mat out, const int32_t* ids, Mat table) override;
  void embedding_backward(Stream& s, Mat dtable, const int32_t* ids, Mat dout) override;
  void rmsnorm_forward(Stream& s, Mat out, float* rstd, Mat x, Mat w, float eps) override;
  void add_rmsnorm_forward(Stream& s, Mat sum, Mat out, float* rstd, Mat a, Mat b, Mat w,
                           float eps) override;
  void rmsnorm_backward(Stream& s, Mat dx, Mat dw, Mat dout, Mat x, Mat w, const float* rstd,
                        Mat dres) override;
  void rope_forward(Stream& s, Mat x, int h, int d, const int32_t* pos, const float* f) override;
  void rope_backward(Stream& s, Mat dx, int h, int d, const int32_t* pos, const float* f) override;
  void attention_forward(Stream& s, Mat out, float* lse, Mat q, Mat k, Mat v,
                         const AttentionShape& sh, const int32_t* cu) override;
  void attention_backward(Stream& s, Mat dq, Mat dk, Mat dv, Mat dout, Mat out, const float* lse,
                          Mat q, Mat k, Mat v, const AttentionShape& sh, const int32_t* cu) override;
  void swiglu_forward(Stream& s, Mat out, Mat gate, Mat up) override;
  void swiglu_backward(Stream& s, Mat dgate, Mat dup, Mat dout, Mat gate, Mat up) override;
  void lm_head_loss(Stream& s, float* loss_sum, Mat dh, Mat dw, Mat h, Mat w,
                    const int32_t* labels, float grad_scale, Mat scratch) override;
  void cast(Stream& s, Mat dst, Mat src) override;
  void axpy(Stream& s, Mat dst, Mat src, float alpha) override;
  void sum_squares(Stream& s, float* out, Mat x) override;
  void adamw(Stream& s, float* param, float* m, float* v, const float* grad, void* w_out,
             int64_t n, const AdamWStep& step) override;

 private:
  struct Pending {
    std::string key;
    std::unique_ptr<Event> start, end;
  };
  // Runs fn on stream s between two timing events, under `key`.
  template <class F>
  void timed(Stream& s, std::string key, F&& fn);

  Backend& in_;
  std::vector<Pending> pending_;
  std::map<std::string, Line> lines_;
};

}  // namespace sf
