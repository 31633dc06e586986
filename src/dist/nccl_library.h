// NCCL, loaded at run time (docs/MULTI_GPU.md, "Bootstrap"): dlopen of $SF_NCCL_LIB, else
// libnccl.so.2, never linked, so a build runs where NCCL is absent and a one-GPU run never
// touches it. Only a multi-GPU run asks for it, and then its absence is an Error naming the
// library, SF_NCCL_LIB and the fix.
//
// The C ABI is declared here (no nccl.h, which drags in the CUDA headers): opaque handles as
// void*, enums as int, the 128-byte unique id as bytes; tests/dist checks these constants
// against nccl.h where the toolkit is present. NCCL's C API is stable across 2.x; the loader
// requires >= 2.12 (ncclCommGetAsyncError, ncclCommAbort and the version encoding it reads).
//
// What needs no GPU (and is tested on the CPU): loading, the version, a unique id (rank 0's
// blob for the TCP bootstrap). The collectives take device pointers and a cudaStream_t: the
// NCCL communicator that calls them is the next step (not built yet).
#pragma once
#include <array>
#include <cstddef>
#include <memory>
#include <string>

namespace sf::dist {

namespace nccl {
constexpr int kSuccess = 0, kInProgress = 7;                  // ncclResult_t
constexpr int kUint8 = 1, kFloat32 = 7, kFloat64 = 8;         // ncclDataType_t
constexpr int kSum = 0;                                       // ncclRedOp_t
constexpr size_t kUniqueIdBytes = 128;                        // NCCL_UNIQUE_ID_BYTES
constexpr int kMinVersion = 21200;                            // 2.12.0, ncclGetVersion's code
}  // namespace nccl

struct NcclUniqueId {
  std::array<std::byte, nccl::kUniqueIdBytes> bytes{};
};

// The entry points, as the C ABI has them (int for every enum, void* for comm and stream).
struct NcclApi {
  int (*get_version)(int*) = nullptr;
  int (*get_unique_id)(NcclUniqueId*) = nullptr;
  const char* (*get_error_string)(int) = nullptr;
  int (*comm_init_rank)(void** comm, int nranks, NcclUniqueId id, int rank) = nullptr;
  int (*comm_destroy)(void* comm) = nullptr;
  int (*comm_abort)(void* comm) = nullptr;
  int (*comm_get_async_error)(void* comm, int* result) = nullptr;
  int (*all_reduce)(const void* send, void* recv, size_t count, int dtype, int op, void* comm, void* stream) = nullptr;
  int (*reduce_scatter)(const void* send, void* recv, size_t recv_count, int dtype, int op, void* comm,
                        void* stream) = nullptr;
  int (*all_gather)(const void* send, void* recv, size_t send_count, int dtype, void* comm, void* stream) = nullptr;
  int (*broadcast)(const void* send, void* recv, size_t count, int dtype, int root, void* comm, void* stream) = nullptr;
  int (*group_start)() = nullptr;
  int (*group_end)() = nullptr;
};

class NcclLibrary {
 public:
  // Opens `path` (a file name dlopen searches for, or a path), resolves every entry point and
  // checks the version; Error (ErrorKind::io) naming the path and what failed otherwise.
  static std::unique_ptr<NcclLibrary> open(const std::string& path);
  // The process's NCCL: $SF_NCCL_LIB or libnccl.so.2, opened once (an Error is rethrown to
  // every caller, never cached as success).
  static const NcclLibrary& process();
  ~NcclLibrary();
  NcclLibrary(const NcclLibrary&) = delete;
  NcclLibrary& operator=(const NcclLibrary&) = delete;

  const NcclApi& api() const { return api_; }
  const std::string& path() const { return path_; }
  int version() const { return version_; }         // e.g. 22809
  std::string version_text() const;                // "NCCL 2.28.9"
  // A fresh unique id (rank 0 calls it, then the bootstrap sends it to the others).
  NcclUniqueId unique_id() const;
  // Throws Error naming `what` and NCCL's message unless result is ncclSuccess.
  void check(int result, const char* what) const;

 private:
  NcclLibrary() = default;
  void* handle_ = nullptr;
  std::string path_;
  int version_ = 0;
  NcclApi api_;
};

}  // namespace sf::dist
