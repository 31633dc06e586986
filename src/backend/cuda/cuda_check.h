// Check macros for the CUDA runtime and cuBLASLt, plus the NVTX range every launcher opens.
// A failing call throws sf::Error(ErrorKind::cuda) naming the statement, file and line and the
// CUDA error string; library code never exits.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include "core/error.h"

namespace sf::cuda_detail {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* stmt, const char* file, int line) {
  throw Error(ErrorKind::cuda, cat("CUDA error ", cudaGetErrorName(e), " (",
                                   cudaGetErrorString(e), ") in `", stmt, "` at ", file, ":",
                                   line));
}

[[noreturn]] inline void throw_cublas(cublasStatus_t s, const char* stmt, const char* file,
                                      int line) {
  throw Error(ErrorKind::cuda, cat("cuBLASLt error ", int(s), " (", cublasLtGetStatusString(s),
                                   ") in `", stmt, "` at ", file, ":", line));
}

// Scoped NVTX range (header-only nvtx3): shows each op by name in Nsight timelines.
class NvtxRange {
 public:
  explicit NvtxRange(const char* name) { nvtxRangePushA(name); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace sf::cuda_detail

#define CUDA_CHECK(stmt)                                                              \
  do {                                                                                \
    cudaError_t sf_cuda_err_ = (stmt);                                                \
    if (sf_cuda_err_ != cudaSuccess)                                                  \
      ::sf::cuda_detail::throw_cuda(sf_cuda_err_, #stmt, __FILE__, __LINE__);         \
  } while (0)

// After a kernel launch: catches bad launch configurations at once (asynchronous faults
// surface at the next synchronising call).
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())

#define CUBLAS_CHECK(stmt)                                                            \
  do {                                                                                \
    cublasStatus_t sf_cublas_st_ = (stmt);                                            \
    if (sf_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                       \
      ::sf::cuda_detail::throw_cublas(sf_cublas_st_, #stmt, __FILE__, __LINE__);      \
  } while (0)

#define SF_NVTX_CONCAT2(a, b) a##b
#define SF_NVTX_CONCAT(a, b) SF_NVTX_CONCAT2(a, b)
#define NVTX_RANGE(name) ::sf::cuda_detail::NvtxRange SF_NVTX_CONCAT(sf_nvtx_, __LINE__)(name)
