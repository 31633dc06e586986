// cuDNN's run-time loader (contract in cudnn_library.h).
#include "backend/cuda/cudnn_library.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "core/error.h"

namespace sf::cuda {

namespace {

// $SF_CUDNN_LIB, or "" where unset or empty.
std::string explicit_library() {
  const char* e = std::getenv("SF_CUDNN_LIB");
  return e == nullptr ? std::string() : std::string(e);
}

}  // namespace

const std::vector<std::string>& cudnn_default_names() {
  static const std::vector<std::string> names{"libcudnn.so.9", "libcudnn.so"};
  return names;
}

std::string cudnn_version_text(const CudnnLibraryInfo& info) {
  const int64_t v = info.version, c = info.cudart;
  return cat("cuDNN ", v / 10000, ".", v / 100 % 100, ".", v % 100, " (built for CUDA ",
             c / 1000, ".", c / 10 % 100, ")");
}

std::string cudnn_unavailable_note(const CudnnLibraryInfo& info) {
  return cat("sf: cuDNN not loaded (", info.why,
             "); set SF_CUDNN_LIB=/path/to/libcudnn.so.9 or install cuDNN 9; attention runs on "
             "slideformer's own kernels");
}

#if !SF_WITH_CUDNN

// Built without cuDNN >= 9.6 headers: nothing to load; a library named anyway is an Error
// rather than a value silently ignored.
namespace {
CudnnLibraryInfo no_headers() {
  const std::string lib = explicit_library();
  SF_REQUIRE(lib.empty(), "SF_CUDNN_LIB=", lib, " is set, but this build has no cuDNN support "
             "(CMake found no cuDNN >= 9.6 headers): unset it, or rebuild with cuDNN 9's "
             "headers in the CUDA toolkit");
  CudnnLibraryInfo info;
  info.why = "this build has no cuDNN >= 9.6 headers";
  return info;
}
}  // namespace

CudnnLibraryInfo cudnn_library_info() { return no_headers(); }
CudnnLibraryInfo cudnn_library_probe(const std::vector<std::string>&) { return no_headers(); }

#else

namespace {

struct CloseLibrary {
  void operator()(void* h) const { dlclose(h); }
};
using LibraryHandle = std::unique_ptr<void, CloseLibrary>;

// One candidate opened, its functions resolved and its version checked; "" or why not (the
// handle is then closed).
std::string open_candidate(const std::string& name, LibraryHandle& handle, CudnnApi& api,
                           CudnnLibraryInfo& info) {
  dlerror();
  handle.reset(dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL));
  if (!handle) {
    const char* e = dlerror();
    return cat(name, ": ", e != nullptr ? e : "dlopen failed");
  }
  info.opened = true;
  std::string missing;
#define SF_CUDNN_RESOLVE(fn)                                                 \
  api.fn = reinterpret_cast<decltype(api.fn)>(dlsym(handle.get(), #fn));    \
  if (api.fn == nullptr) missing += cat(missing.empty() ? "" : ", ", #fn);
  SF_CUDNN_FUNCTIONS(SF_CUDNN_RESOLVE)
#undef SF_CUDNN_RESOLVE
  Dl_info where{};
  const bool named = api.cudnnGetVersion != nullptr &&
                     dladdr(reinterpret_cast<void*>(api.cudnnGetVersion), &where) != 0 &&
                     where.dli_fname != nullptr;
  info.path = named ? where.dli_fname : name;
  const std::string at = info.path == name ? name : cat(name, " (", info.path, ")");
  if (!missing.empty()) {
    handle.reset();
    return cat(at, ": not cuDNN 9, it lacks ", missing);
  }
  info.version = int64_t(api.cudnnGetVersion());
  info.cudart = int64_t(api.cudnnGetCudartVersion());
  // (The headers are 9.x: their enums and attribute numbers are 9's, so another major is out.)
  if (info.version / 10000 != 9 || info.version < kCudnnMinVersion) {
    handle.reset();
    return cat(at, ": ", cudnn_version_text(info), ", need 9.x >= 9.6");
  }
  return "";
}

// The loader's steps (contract in the header); on success `handle` and `api` hold the library.
CudnnLibraryInfo load(const std::vector<std::string>& names, LibraryHandle& handle,
                      CudnnApi& api) {
  CudnnLibraryInfo info;
  const std::string lib = explicit_library();
  if (!lib.empty()) {
    const std::string why = open_candidate(lib, handle, api, info);
    SF_REQUIRE(why.empty(), "SF_CUDNN_LIB=", lib, " cannot be used: ", why,
               ". Point it at cuDNN 9's libcudnn.so.9 (>= 9.6; PyTorch's copy is "
               "site-packages/nvidia/cudnn/lib/libcudnn.so.9), or unset it");
    info.loaded = true;
    return info;
  }
  std::string tried;
  for (const std::string& name : names) {
    CudnnLibraryInfo one;
    const std::string why = open_candidate(name, handle, api, one);
    info.opened = info.opened || one.opened;
    if (why.empty()) {
      one.loaded = true;
      return one;
    }
    tried += cat(tried.empty() ? "" : "; ", why);
  }
  info.why = names.empty() ? "no library to try" : tried;
  return info;
}

// A cuDNN built for another CUDA major than the runtime this process uses may work (it brings
// its own cuBLAS through its RUNPATH) or fail its plans: said once, with the load.
std::string cuda_major_remark(int64_t cudnn_cudart) {
  int ours = 0;
  if (cudaRuntimeGetVersion(&ours) != cudaSuccess || ours / 1000 == cudnn_cudart / 1000) return "";
  return cat(" (this process runs CUDA runtime ", ours / 1000, ".", ours / 10 % 100,
             "; if cuDNN's plans fail, point SF_CUDNN_LIB at a cuDNN 9 built for CUDA ",
             ours / 1000, ")");
}

// The process's library: loaded once, never closed (plans and handles live until exit).
struct Process {
  LibraryHandle handle;
  CudnnApi api;
  CudnnLibraryInfo info;
};

const Process& process() {
  // (A throw, a bad SF_CUDNN_LIB, leaves it unset: the next call tries and throws again.)
  static const Process* p = [] {
    auto q = std::make_unique<Process>();
    q->info = load(cudnn_default_names(), q->handle, q->api);
    if (q->info.loaded)
      std::fprintf(stderr, "sf: attention can use %s from %s%s\n",
                   cudnn_version_text(q->info).c_str(), q->info.path.c_str(),
                   cuda_major_remark(q->info.cudart).c_str());
    return q.release();  // never destroyed: cuDNN handles must not outlive the library
  }();
  return *p;
}

}  // namespace

const CudnnApi* cudnn_api() {
  const Process& p = process();
  return p.info.loaded ? &p.api : nullptr;
}

CudnnLibraryInfo cudnn_library_info() { return process().info; }

CudnnLibraryInfo cudnn_library_probe(const std::vector<std::string>& names) {
  LibraryHandle handle;
  CudnnApi api;
  return load(names, handle, api);  // the handle closes here
}

#endif  // SF_WITH_CUDNN

}  // namespace sf::cuda
