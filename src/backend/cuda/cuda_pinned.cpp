// Pinned host memory for the CUDA backend: the staging, home and activation-store buffers
// that DMA touches. Only those are pinned (fp32 master and Adam moments stay pageable):
// pinning is slow and can fail for very large sizes. map_host pins and maps a range the
// caller owns, for kernels that read a few scattered rows of a large host table.
#include <cuda_runtime_api.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>

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

// A registered range: unregistered (not freed) on destruction.
class MappedHostRange final : public Buffer {
 public:
  MappedHostRange(void* host, void* dev, size_t n) : host_(host), dev_(dev), n_(n) {}
  ~MappedHostRange() override { cudaHostUnregister(host_); }
  void* data() const override { return dev_; }
  size_t bytes() const override { return n_; }

 private:
  void* host_;
  void* dev_;
  size_t n_;
};
}  // namespace

std::unique_ptr<Buffer> CudaBackend::map_host(void* p, size_t bytes, const std::string& what) {
  // Registered in whole pages (the pages holding the range are mapped, so this stays inside).
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t b = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + std::max<size_t>(bytes, 1) + page - 1) / page * page;
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
  void* dp = static_cast<char*>(dev) + (reinterpret_cast<uintptr_t>(p) - b);
  return std::make_unique<MappedHostRange>(base, dp, bytes);
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
