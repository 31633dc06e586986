// Pinned host memory for the CUDA backend: the staging, home and activation-store buffers
// that DMA touches. Only those are pinned (fp32 master and Adam moments stay pageable):
// pinning is slow and can fail for very large sizes. map_host pins and maps a range the
// caller owns, for kernels that read a few scattered rows of a large host table.
#include <cuda_runtime_api.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"

namespace sf {

namespace {
class PinnedBuffer final : public Buffer {
 public:
  PinnedBuffer(void* p, size_t n) : p_(p), n_(n) {}
  ~PinnedBuffer() override { cudaFreeHost(p_); }
  void* data() const override { return p_; }
  size_t bytes() const override { return n_; }

 private:
  void* p_;
  size_t n_;
};

// The page ranges this process has registered, counted: two backends of one process (ranks
// as threads) may map the same host memory (the shared state's table, shared homes), which
// CUDA registers once per process; the last mapping's end unregisters it.
struct Registration {
  uintptr_t end = 0;
  void* dev = nullptr;  // the device address of the range's first byte
  int count = 0;
};
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<uintptr_t, Registration>& registry() {  // by the range's first page
  static std::map<uintptr_t, Registration> r;
  return r;
}

// A registered range: unregistered (not freed) when its last mapping ends.
class MappedHostRange final : public Buffer {
 public:
  MappedHostRange(uintptr_t base, void* dev, size_t n) : base_(base), dev_(dev), n_(n) {}
  ~MappedHostRange() override {
    std::lock_guard<std::mutex> lk(registry_mutex());
    auto it = registry().find(base_);
    if (it != registry().end() && --it->second.count == 0) {
      cudaHostUnregister(reinterpret_cast<void*>(base_));
      registry().erase(it);
    }
  }
  void* data() const override { return dev_; }
  size_t bytes() const override { return n_; }

 private:
  uintptr_t base_;
  void* dev_;
  size_t n_;
};
}  // namespace

std::unique_ptr<Buffer> CudaBackend::map_host(void* p, size_t bytes, const std::string& what) {
  // Registered in whole pages (the pages holding the range are mapped, so this stays inside).
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + std::max<size_t>(bytes, 1) + page - 1) / page * page;
  const uintptr_t off = reinterpret_cast<uintptr_t>(p) - b;
  std::lock_guard<std::mutex> lk(registry_mutex());
  if (auto it = registry().find(b); it != registry().end() && it->second.end == e) {
    ++it->second.count;  // mapped before in this process: the same pages
    return std::make_unique<MappedHostRange>(b, static_cast<char*>(it->second.dev) + off, bytes);
  }
  void* base = reinterpret_cast<void*>(b);
  cudaError_t err = cudaHostRegister(base, e - b, cudaHostRegisterPortable | cudaHostRegisterMapped);
  void* dev = nullptr;
  if (err == cudaSuccess) {
    err = cudaHostGetDevicePointer(&dev, base, 0);
    if (err != cudaSuccess) cudaHostUnregister(base);
  }
  if (err != cudaSuccess) {
    cudaGetLastError();
    SF_FAIL(out_of_memory, "cannot page-lock ", bytes >> 20, " MiB of host memory for ", what,
            " so the GPU can read it (", cudaGetErrorString(err),
            "); free host memory or lower --host-memory");
  }
  registry()[b] = Registration{e, dev, 1};
  return std::make_unique<MappedHostRange>(b, static_cast<char*>(dev) + off, bytes);
}

std::unique_ptr<Buffer> CudaBackend::alloc_host(size_t bytes, const std::string& what) {
  size_t n = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = nullptr;
  cudaError_t e = cudaHostAlloc(&p, n, cudaHostAllocPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();
    SF_FAIL(out_of_memory, "cannot pin ", n >> 20, " MiB of host memory for ", what, " (",
            cudaGetErrorString(e), "); lower the batch or --host-memory");
  }
  return std::make_unique<PinnedBuffer>(p, n);
}

}  // namespace sf
