// ThreadedStreamsBackend: gives a synchronous backend (the host reference) real asynchronous
// streams, so the engine's cross-stream ordering is checked on any CPU, in CI.
//
// The host backend runs every op when it is called; its streams and events do nothing, so a
// missing event wait in the engine cannot show there, only on a GPU. Here each stream is a
// worker thread that runs its ops in order (CUDA's stream semantics): a call enqueues and
// returns, record() puts a marker in the stream's queue, wait() makes the waiting stream's
// worker block until that marker has run, synchronize() blocks the caller. Freeing memory
// first drains every stream (as cudaFree does). With jitter, each op first sleeps a random
// 0..max_jitter_us microseconds, so the streams interleave differently on every run and a
// missing wait shows as a wrong result instead of being hidden by lucky timing.
//
// Errors thrown by an op are kept and rethrown by the stream's next synchronize() (CUDA's
// asynchronous errors). Copies read their host source when they run, as pinned copies do.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>
#include <string>

#include "backend/backend.h"

namespace sf {

class ThreadedStreamsBackend final : public Backend {
 public:
  struct Options {
    uint64_t seed = 1;       // jitter of stream i uses seed + i
    int max_jitter_us = 0;   // 0: no sleeps (still asynchronous)
    // Lazy: a stream runs an op only once something waits for it (a synchronize, an event
    // wait or synchronize reaching past it, a free) or after lazy_timeout_ms. Then a consumer
    // that forgot to wait runs before its producer deterministically, not by chance.
    bool lazy = false;
    int lazy_timeout_ms = 50;
  };
  explicit ThreadedStreamsBackend(Backend& inner) : ThreadedStreamsBackend(inner, Options{}) {}
  ThreadedStreamsBackend(Backend& inner, Options o);
  // Owning the inner backend (e.g. one that make_executor hands out).
  ThreadedStreamsBackend(std::unique_ptr<Backend> inner, Options o)
      : ThreadedStreamsBackend(*inner, o) {
    owned_ = std::move(inner);
  }
  ~ThreadedStreamsBackend() override;

  // Runs fn on s's worker after everything enqueued on s before (tests gate a stream with it).
  void enqueue(Stream& s, std::function<void()> fn);
  // Lazy: ops that ran because they had waited lazy_timeout_ms, not because something waited
  // for them. The engine never relies on that (it synchronizes before the host reads): its
  // tests expect 0.
  uint64_t ops_run_unforced() const { return unforced_.load(); }

  BackendKind kind() const override { return in_.kind(); }
  std::string name() const override { return in_.name() + " (threaded streams)"; }
  DType compute_dtype() const override { return in_.compute_dtype(); }
  std::unique_ptr<Buffer> alloc(size_t bytes, const std::string& what) override;
  std::unique_ptr<Buffer> alloc_host(size_t bytes, const std::string& what) override;
  std::unique_ptr<Buffer> map_host(void* p, size_t bytes, const std::string& what) override;
  size_t bytes_in_use() const override { return in_.bytes_in_use(); }
  size_t peak_bytes_in_use() const override { return in_.peak_bytes_in_use(); }
  void copy_to_device(Stream& s, void* d, const void* src, size_t n) override;
  void copy_to_host(Stream& s, void* d, const void* src, size_t n) override;
  void copy_on_device(Stream& s, void* d, const void* src, size_t n) override;
  void fill_zero(Stream& s, void* d, size_t n) override;
  std::unique_ptr<Stream> create_stream(const std::string& name) override;
  std::unique_ptr<Event> create_event() override;
  Stream& default_stream() override;

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

  struct Queue;   // one stream's ops and counters (the .cpp)
  class Worker;  // one stream's thread

 private:
  // Enqueues fn(inner backend, inner stream) on s.
  void post(Stream& s, std::function<void(Backend&, Stream&)> fn);
  std::unique_ptr<Buffer> drained_on_free(std::unique_ptr<Buffer> b);
  void synchronize_all();

  std::unique_ptr<Backend> owned_;  // declared first: destroyed after the streams
  Backend& in_;
  Options opt_;
  std::mutex mu_;
  std::vector<std::shared_ptr<Queue>> live_;  // every stream's queue (drained before a free)
  uint64_t n_streams_ = 0;
  std::atomic<uint64_t> unforced_{0};
  std::unique_ptr<Stream> default_;
};

}  // namespace sf
