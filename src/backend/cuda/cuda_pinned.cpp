// Pinned host memory for the CUDA backend: the staging, home and activation-store buffers
// that DMA touches. Only those are pinned (fp32 master and Adam moments stay pageable):
// pinning is slow and can fail for very large sizes.
#include <cuda_runtime_api.h>

#include <algorithm>

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
}  // namespace

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
