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
// Lazy mode (the engine's tests): a stream runs an op only once something waits for it, and
// never because time passed, so what a test sees cannot depend on the machine's load. Every
// blocking wait forces what it waits for (a wait can only name a marker already recorded, so
// forcing cannot deadlock); the one way left to depend on a stream's own progress, polling
// query(), is caught by counting polls (lazy_poll_limit), not by a clock. A host loop that
// spins on memory a stream writes, with no backend call, would hang here: nothing sees it.
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

#include "backend/forwarding_backend.h"

namespace sf {

class ThreadedStreamsBackend final : public ForwardingBackend {
 public:
  struct Options {
    uint64_t seed = 1;       // jitter of stream i uses seed + i
    int max_jitter_us = 0;   // 0: no sleeps (still asynchronous)
    // Lazy: a stream runs an op only once something waits for it: a synchronize, an event
    // wait or synchronize reaching past it, a free, the stream's destruction. Never by itself:
    // a consumer that forgot to wait runs before its producer, and a host read that forgot to
    // synchronize sees the old data, on every run and under any load.
    bool lazy = false;
    // Lazy: a host that asks query() this many times about the same record while nothing has
    // forced it is polling for progress it never waits for (a GPU would make it; here it never
    // comes). Its stream is then made to run up to the record and the ops that forces are
    // counted in ops_run_unforced(). A count, not a time: the engine's own queries (phase A
    // asks about each candidate unit once per pick, a few per record) stay far below it.
    int lazy_poll_limit = 10000;
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
  // Lazy: ops that ran because a host polled for them (lazy_poll_limit), not because
  // something waited for them. The engine never relies on a stream's own progress (it waits
  // or synchronizes before it reads): its tests expect 0. Deterministic: no clock is involved.
  uint64_t ops_run_unforced() const { return unforced_->load(); }

  std::string name() const override { return in_.name() + " (threaded streams)"; }
  std::unique_ptr<Buffer> alloc(size_t bytes, const std::string& what) override;
  std::unique_ptr<Buffer> alloc_host(size_t bytes, const std::string& what) override;
  std::unique_ptr<Buffer> map_host(void* p, size_t bytes, const std::string& what) override;
  void copy_to_device(Stream& s, void* d, const void* src, size_t n) override;
  void copy_to_host(Stream& s, void* d, const void* src, size_t n) override;
  void copy_on_device(Stream& s, void* d, const void* src, size_t n) override;
  std::unique_ptr<Stream> create_stream(const std::string& name) override;
  std::unique_ptr<Event> create_event() override;
  Stream& default_stream() override;

  struct Queue;   // one stream's ops and counters (the .cpp)
  class Worker;  // one stream's thread

 private:
  // Enqueues op(inner backend, inner stream) on s (every op: its arguments by value).
  void run_op(Stream& s, std::string key, Op op) override;
  std::unique_ptr<Buffer> drained_on_free(std::unique_ptr<Buffer> b);
  void synchronize_all();

  std::unique_ptr<Backend> owned_;  // destroyed after the streams (members go in reverse)
  Options opt_;
  std::mutex mu_;
  std::vector<std::shared_ptr<Queue>> live_;  // every stream's queue (drained before a free)
  uint64_t n_streams_ = 0;
  // Shared with the events (an event may outlive the backend).
  std::shared_ptr<std::atomic<uint64_t>> unforced_ = std::make_shared<std::atomic<uint64_t>>(0);
  std::unique_ptr<Stream> default_;
};

}  // namespace sf
