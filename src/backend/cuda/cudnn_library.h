// cuDNN loaded at run time (dlopen), never linked: a slideformer binary starts and trains
// without cuDNN; only the cuDNN attention path (cudnn_attention.cpp) needs it.
//
// The process loads it once, on first use, trying in order:
//   $SF_CUDNN_LIB (a path or a library name; empty counts as unset): when set, it is the only
//                 candidate and any failure (cannot open, a function missing, not 9.x >= 9.6)
//                 is an Error naming SF_CUDNN_LIB and the reason (dlerror's text).
//   libcudnn.so.9, then libcudnn.so, through the dynamic loader's search path.
// libcudnn.so.9 is cuDNN's dispatcher: it opens its sub-libraries (libcudnn_graph.so.9, the
// engine libraries) itself, through its RUNPATH $ORIGIN, so a full path to any cuDNN 9 copy
// (PyTorch's pip wheel's included) works. It is opened RTLD_NOW | RTLD_LOCAL: the sub-libraries
// take no symbol from the dispatcher (their only cuDNN dependency is libcudnn_graph.so.9,
// their own DT_NEEDED), and nothing else in the process should bind to our copy.
//
// Every cudnn* function the attention path calls is resolved with dlsym into CudnnApi, typed
// from cudnn_graph.h's prototypes. The successful load prints one stderr line with the version
// and the file. A failed default load throws nothing: CudnnLibraryInfo::why says what was tried
// and cudnn_unavailable_note is the one stderr line its user prints (cudnn_attention.cpp, once,
// then runs the native attention kernels).
//
// CudnnApi exists only in builds with cuDNN >= 9.6 headers (SF_WITH_CUDNN, from CMake); the
// rest of this header is the same in every CUDA build (tests use it without cuDNN's headers).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#if SF_WITH_CUDNN
#include <cudnn_graph.h>
#if CUDNN_VERSION < 90600
#error "SF_WITH_CUDNN needs cuDNN >= 9.6 headers (CMake checks cudnn_version.h; it disagrees)"
#endif
#endif

namespace sf::cuda {

#if SF_WITH_CUDNN
// X-macro: every cuDNN function slideformer calls (add one here before calling it).
#define SF_CUDNN_FUNCTIONS(X)                                                             \
  X(cudnnGetVersion) X(cudnnGetCudartVersion) X(cudnnGetErrorString)                      \
  X(cudnnGetLastErrorString) X(cudnnCreate) X(cudnnSetStream)                             \
  X(cudnnBackendCreateDescriptor) X(cudnnBackendDestroyDescriptor)                        \
  X(cudnnBackendSetAttribute) X(cudnnBackendGetAttribute) X(cudnnBackendFinalize)         \
  X(cudnnBackendExecute)

// The loaded library's functions (members named as cuDNN names them).
struct CudnnApi {
#define SF_CUDNN_MEMBER(fn) decltype(&::fn) fn = nullptr;
  SF_CUDNN_FUNCTIONS(SF_CUDNN_MEMBER)
#undef SF_CUDNN_MEMBER
};

// The process's table (loads on the first call); nullptr where cuDNN is unavailable. Throws
// Error for a bad SF_CUDNN_LIB (again on each call).
const CudnnApi* cudnn_api();
#endif

// The oldest cuDNN the attention graphs run on (int64 ragged offsets, the un-zeroed dQ
// accumulator), in cudnnGetVersion's encoding (major * 10000 + minor * 100 + patch).
constexpr int64_t kCudnnMinVersion = 90600;

// What a load found.
struct CudnnLibraryInfo {
  bool loaded = false;   // a candidate opened, resolved every function and is 9.x >= 9.6
  bool opened = false;   // some candidate opened (false: none was found at all)
  std::string path;      // the file loaded (dladdr of cudnnGetVersion)
  int64_t version = 0;   // cudnnGetVersion()
  int64_t cudart = 0;    // cudnnGetCudartVersion(): the CUDA runtime it was built for
  std::string why;       // not loaded: each candidate and why it failed
};

// The process's load (loads on the first call; same Error as cudnn_api()).
CudnnLibraryInfo cudnn_library_info();

// "cuDNN 9.19.0 (built for CUDA 13.0)" of a loaded library.
std::string cudnn_version_text(const CudnnLibraryInfo& info);

// The stderr note for an unavailable library: what was tried and the fix.
std::string cudnn_unavailable_note(const CudnnLibraryInfo& info);

// Test hook: the process loader's steps (SF_CUDNN_LIB read from the environment now, `names`
// in place of the default list), printing nothing and keeping nothing (a library it opens is
// closed again). Throws the same Error for a bad SF_CUDNN_LIB.
CudnnLibraryInfo cudnn_library_probe(const std::vector<std::string>& names);

// The default candidates after SF_CUDNN_LIB: libcudnn.so.9, libcudnn.so.
const std::vector<std::string>& cudnn_default_names();

}  // namespace sf::cuda
