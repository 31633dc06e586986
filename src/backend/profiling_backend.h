// ProfilingBackend: a Backend that forwards every call to another one and times each compute
// op with the inner backend's timing events, to see where a layer's device time goes
// (bench_cuda_layer --profile). Memory, copies, streams and events pass straight through.
// Ops are keyed by name and shapes (ForwardingBackend's keys: GEMMs by shape, transposes,
// output dtype and beta), so each of a layer's projections shows on its own line.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/forwarding_backend.h"

namespace sf {

class ProfilingBackend final : public ForwardingBackend {
 public:
  explicit ProfilingBackend(Backend& inner) : ForwardingBackend(inner) {}

  struct Line {
    std::string op;
    int calls = 0;
    double seconds = 0;
  };
  // Waits for every timed op, then returns the totals per key (largest first) and clears
  // them. Ops the inner backend cannot time are counted with 0 s.
  std::vector<Line> take();

  std::string name() const override { return in_.name() + " (profiled)"; }
  std::unique_ptr<Buffer> alloc(size_t bytes, const std::string& what) override { return in_.alloc(bytes, what); }
  std::unique_ptr<Buffer> alloc_host(size_t bytes, const std::string& what) override { return in_.alloc_host(bytes, what); }
  std::unique_ptr<Buffer> map_host(void* p, size_t bytes, const std::string& what) override { return in_.map_host(p, bytes, what); }
  void copy_to_device(Stream& s, void* d, const void* src, size_t n) override { in_.copy_to_device(s, d, src, n); }
  void copy_to_host(Stream& s, void* d, const void* src, size_t n) override { in_.copy_to_host(s, d, src, n); }
  void copy_on_device(Stream& s, void* d, const void* src, size_t n) override { in_.copy_on_device(s, d, src, n); }
  std::unique_ptr<Stream> create_stream(const std::string& n) override { return in_.create_stream(n); }
  std::unique_ptr<Event> create_event() override { return in_.create_event(); }
  std::unique_ptr<Event> create_timing_event() override { return in_.create_timing_event(); }
  Stream& default_stream() override { return in_.default_stream(); }

 private:
  // The op runs at once on the caller's stream (the inner backend's), between two timing
  // events, under `key`.
  void run_op(Stream& s, std::string key, Op op) override;

  struct Pending {
    std::string key;
    std::unique_ptr<Event> start, end;
  };
  std::vector<Pending> pending_;
  std::map<std::string, Line> lines_;
};

}  // namespace sf
