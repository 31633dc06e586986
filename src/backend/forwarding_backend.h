// ForwardingBackend: the base of Backend decorators. It wraps another backend and sends every
// compute op (and fill_zero) through one hook, run_op, with a key naming the op and its
// shapes; a decorator implements that hook and its own memory, copy and stream handling
// instead of forwarding thirty ops one by one: ProfilingBackend times each op under its key,
// ThreadedStreamsBackend runs it on the stream's thread.
#pragma once
#include <functional>
#include <string>

#include "backend/backend.h"

namespace sf {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : in_(inner) {}

  BackendKind kind() const override { return in_.kind(); }
  DType compute_dtype() const override { return in_.compute_dtype(); }
  size_t bytes_in_use() const override { return in_.bytes_in_use(); }
  size_t peak_bytes_in_use() const override { return in_.peak_bytes_in_use(); }
  size_t device_used_bytes() const override { return in_.device_used_bytes(); }
  std::string one_off_costs() const override { return in_.one_off_costs(); }
  bool annotates() const override { return in_.annotates(); }
  void range_push(const char* name) override { in_.range_push(name); }
  void range_pop() override { in_.range_pop(); }

  void fill_zero(Stream& s, void* d, size_t n) override;
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
  void attention_decode(Stream& s, Mat out, Mat q, Mat k_cache, Mat v_cache,
                        const AttentionShape& shape, int64_t kv_len) override;
  void swiglu_forward(Stream& s, Mat out, Mat gate, Mat up) override;
  void swiglu_backward(Stream& s, Mat dgate, Mat dup, Mat dout, Mat gate, Mat up) override;
  void lm_head_loss(Stream& s, float* loss_sum, Mat dh, Mat dw, Mat h, Mat w,
                    const int32_t* labels, float grad_scale, Mat scratch) override;
  void cast(Stream& s, Mat dst, Mat src) override;
  void axpy(Stream& s, Mat dst, Mat src, float alpha) override;
  void sum_squares(Stream& s, float* out, Mat x) override;
  void adamw(Stream& s, float* param, float* m, float* v, const float* grad, void* w_out,
             int64_t n, const AdamWStep& step) override;
  void adamw_state(Stream& s, const UnitStateView& state, int64_t off, int64_t len,
                   const float* grad, void* weights_out, std::span<const ParamRange> ranges,
                   const AdamWStep& step) override;

 protected:
  // Runs the op, given as op(backend, stream): the decorator passes the inner backend and
  // the stream the inner backend should see. `key`: the op's name and shapes, e.g.
  // "gemm 32768x4096x4096 bT" (M x N x K) or "rmsnorm_forward 16384x4096".
  using Op = std::function<void(Backend&, Stream&)>;
  virtual void run_op(Stream& s, std::string key, Op op) = 0;

  Backend& in_;
};

// A decorator that forwards everything, memory, copies and streams included, and runs each op
// on the inner backend at once: derive from it and override only what is observed or altered
// (tests record allocations, count an op's rows, leak on purpose, forget an event).
class PassThroughBackend : public ForwardingBackend {
 public:
  explicit PassThroughBackend(Backend& inner) : ForwardingBackend(inner) {}
  std::string name() const override { return in_.name(); }
  std::unique_ptr<Buffer> alloc(size_t n, const std::string& what) override { return in_.alloc(n, what); }
  std::unique_ptr<Buffer> alloc_host(size_t n, const std::string& what) override { return in_.alloc_host(n, what); }
  std::unique_ptr<Buffer> map_host(void* p, size_t n, const std::string& what) override {
    return in_.map_host(p, n, what);
  }
  void copy_to_device(Stream& s, void* d, const void* src, size_t n) override { in_.copy_to_device(s, d, src, n); }
  void copy_to_host(Stream& s, void* d, const void* src, size_t n) override { in_.copy_to_host(s, d, src, n); }
  void copy_on_device(Stream& s, void* d, const void* src, size_t n) override { in_.copy_on_device(s, d, src, n); }
  std::unique_ptr<Stream> create_stream(const std::string& n) override { return in_.create_stream(n); }
  std::unique_ptr<Event> create_event() override { return in_.create_event(); }
  Stream& default_stream() override { return in_.default_stream(); }

 protected:
  void run_op(Stream& s, std::string, Op op) override { op(in_, s); }
};

}  // namespace sf
