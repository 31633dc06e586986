// NCCL's run-time loader (contract in nccl_library.h).
#include "dist/nccl_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "core/error.h"

namespace sf::dist {

namespace {

constexpr const char* kFix =
    "install NCCL 2 (e.g. the CUDA toolkit's libnccl.so.2 or the libnccl2 package) or set "
    "SF_NCCL_LIB=/path/to/libnccl.so.2; one GPU needs no NCCL (drop --gpus)";

template <class F>
void resolve(void* handle, const std::string& path, const char* name, F& fn) {
  dlerror();
  void* sym = dlsym(handle, name);
  if (sym == nullptr)
    SF_FAIL(io, "NCCL library ", path, " has no ", name, ": it is older than NCCL 2.12 or not NCCL; ", kFix);
  fn = reinterpret_cast<F>(sym);
}

}  // namespace

std::unique_ptr<NcclLibrary> NcclLibrary::open(const std::string& path) {
  std::unique_ptr<NcclLibrary> lib(new NcclLibrary());
  lib->path_ = path;
  dlerror();
  // RTLD_NODELETE: ncclGetUniqueId starts NCCL's bootstrap thread, which outlives any handle;
  // unmapping the library under it crashed test_dist at random (a thread in accept() waking up
  // in unmapped code) once this object was destroyed.
  lib->handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (lib->handle_ == nullptr) {
    const char* e = dlerror();
    SF_FAIL(io, "cannot load NCCL from ", path, " (", e != nullptr ? e : "dlopen failed", "): ", kFix);
  }
  NcclApi& a = lib->api_;
  void* h = lib->handle_;
  resolve(h, path, "ncclGetVersion", a.get_version);
  resolve(h, path, "ncclGetUniqueId", a.get_unique_id);
  resolve(h, path, "ncclGetErrorString", a.get_error_string);
  resolve(h, path, "ncclCommInitRank", a.comm_init_rank);
  resolve(h, path, "ncclCommDestroy", a.comm_destroy);
  resolve(h, path, "ncclCommAbort", a.comm_abort);
  resolve(h, path, "ncclCommGetAsyncError", a.comm_get_async_error);
  resolve(h, path, "ncclAllReduce", a.all_reduce);
  resolve(h, path, "ncclReduceScatter", a.reduce_scatter);
  resolve(h, path, "ncclAllGather", a.all_gather);
  resolve(h, path, "ncclBroadcast", a.broadcast);
  resolve(h, path, "ncclGroupStart", a.group_start);
  resolve(h, path, "ncclGroupEnd", a.group_end);
  const int rc = a.get_version(&lib->version_);
  if (rc != nccl::kSuccess) SF_FAIL(io, "NCCL library ", path, ": ncclGetVersion failed (", rc, "); ", kFix);
  if (lib->version_ < nccl::kMinVersion)
    SF_FAIL(io, "NCCL library ", path, " is ", lib->version_text(), "; slideformer needs NCCL >= 2.12: ", kFix);
  return lib;
}

const NcclLibrary& NcclLibrary::process() {
  static std::mutex m;
  static std::unique_ptr<NcclLibrary> lib;
  std::lock_guard<std::mutex> lock(m);
  if (!lib) {
    const char* e = std::getenv("SF_NCCL_LIB");
    lib = open(e != nullptr && *e != '\0' ? std::string(e) : std::string("libnccl.so.2"));
  }
  return *lib;
}

NcclLibrary::~NcclLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

std::string NcclLibrary::version_text() const {
  // Since 2.9: major * 10000 + minor * 100 + patch.
  return cat("NCCL ", version_ / 10000, ".", version_ / 100 % 100, ".", version_ % 100);
}

void NcclLibrary::check(int result, const char* what) const {
  if (result == nccl::kSuccess) return;
  const char* msg = api_.get_error_string != nullptr ? api_.get_error_string(result) : nullptr;
  SF_FAIL(io, what, " failed: ", msg != nullptr ? msg : "unknown NCCL error", " (", version_text(),
          "; NCCL_DEBUG=WARN says more)");
}

NcclUniqueId NcclLibrary::unique_id() const {
  NcclUniqueId id;
  check(api_.get_unique_id(&id), "ncclGetUniqueId");
  return id;
}

}  // namespace sf::dist
