// HostBackend memory, streams and events. Everything is synchronous on the host.
#include <cstdlib>
#include <cstring>

#include "backend/host/host_backend.h"
#include "core/error.h"

namespace sf {

class HostBuffer final : public Buffer {
 public:
  HostBuffer(HostBackend& be, void* p, size_t n) : be_(be), p_(p), n_(n) {}
  ~HostBuffer() override {
    std::free(p_);
    be_.in_use_ -= n_;
  }
  void* data() const override { return p_; }
  size_t bytes() const override { return n_; }

 private:
  HostBackend& be_;
  void* p_;
  size_t n_;
};

namespace {
class HostStream final : public Stream {
 public:
  void synchronize() override {}
};
class HostEvent final : public Event {
 public:
  void record(Stream&) override {}
  void wait(Stream&) override {}
  void synchronize() override {}
  bool query() override { return true; }
};
}  // namespace

std::unique_ptr<Buffer> HostBackend::alloc(size_t bytes, const std::string& what) {
  size_t n = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, n);
  if (!p) SF_FAIL(out_of_memory, "host backend: cannot allocate ", n, " bytes for ", what);
  size_t now = (in_use_ += n);
  size_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  return std::make_unique<HostBuffer>(*this, p, n);
}

void HostBackend::copy_to_device(Stream&, void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void HostBackend::copy_to_host(Stream&, void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}
void HostBackend::copy_on_device(Stream&, void* dst, const void* src, size_t bytes) {
  std::memmove(dst, src, bytes);
}
void HostBackend::fill_zero(Stream&, void* dst, size_t bytes) { std::memset(dst, 0, bytes); }

std::unique_ptr<Stream> HostBackend::create_stream(const std::string&) {
  return std::make_unique<HostStream>();
}
std::unique_ptr<Event> HostBackend::create_event() { return std::make_unique<HostEvent>(); }
Stream& HostBackend::default_stream() {
  if (!default_stream_) default_stream_ = std::make_unique<HostStream>();
  return *default_stream_;
}

}  // namespace sf
