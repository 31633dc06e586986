// cuDNN's run-time loader (cudnn_library.h) without a device: these run in CI's GPU-less
// test_cuda. A bad SF_CUDNN_LIB is an Error naming it and dlerror's text; a missing default
// library or one that is not cuDNN is "unavailable" without a throw; where the machine has
// cuDNN 9 on the loader's search path, it loads by name and by its full path. Each test
// goes through cudnn_library_probe, the process loader's steps with nothing kept, so the
// process's own load (cudnn_attention.cpp's) is not disturbed.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <optional>
#include <string>

#include "backend/cuda/cudnn_attention.h"
#include "backend/cuda/cudnn_library.h"
#include "core/error.h"
#include "scoped_env.h"

namespace sf::test {
namespace {

// SF_CUDNN_LIB for one test, restored after it.
struct ScopedCudnnLib : ScopedEnv {
  explicit ScopedCudnnLib(const std::optional<std::string>& value)
      : ScopedEnv("SF_CUDNN_LIB", value) {}
};

// The Error's message a probe throws, or "" where it throws none.
std::string probe_error(const std::vector<std::string>& names) {
  try {
    cuda::cudnn_library_probe(names);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::input) << e.what();
    return e.what();
  }
  return "";
}

const char* const kNoSuchLibrary = "libsf_test_no_such_cudnn.so.9";

TEST(CudnnLibrary, BadSfCudnnLibIsAnErrorNamingIt) {
  const ScopedCudnnLib env(std::string("/nonexistent"));
  // (Even with good default names after it: a named library is the only candidate.)
  const std::string msg = probe_error(cuda::cudnn_default_names());
  ASSERT_NE(msg, "") << "SF_CUDNN_LIB=/nonexistent did not throw";
  EXPECT_NE(msg.find("SF_CUDNN_LIB=/nonexistent"), std::string::npos) << msg;
  if (cuda::cudnn_attention_built())  // dlerror's text for a path that does not exist
    EXPECT_NE(msg.find("cannot open shared object file"), std::string::npos) << msg;
  else
    EXPECT_NE(msg.find("no cuDNN support"), std::string::npos) << msg;
}

TEST(CudnnLibrary, AbsentLibraryIsUnavailableWithoutThrowing) {
  const ScopedCudnnLib env(std::nullopt);
  cuda::CudnnLibraryInfo info;
  EXPECT_NO_THROW(info = cuda::cudnn_library_probe({kNoSuchLibrary}));
  EXPECT_FALSE(info.loaded);
  EXPECT_FALSE(info.opened);
  EXPECT_EQ(info.path, "");
  if (!cuda::cudnn_attention_built()) return;  // (why: the build has no headers)
  EXPECT_NE(info.why.find(kNoSuchLibrary), std::string::npos) << info.why;
  EXPECT_NE(info.why.find("cannot open shared object file"), std::string::npos) << info.why;
  const std::string note = cuda::cudnn_unavailable_note(info);
  EXPECT_NE(note.find(kNoSuchLibrary), std::string::npos) << note;
  EXPECT_NE(note.find("set SF_CUDNN_LIB=/path/to/libcudnn.so.9 or install cuDNN 9"),
            std::string::npos) << note;
  EXPECT_NE(note.find("slideformer's own kernels"), std::string::npos) << note;
}

// An empty SF_CUDNN_LIB counts as unset: the defaults are tried, nothing throws.
TEST(CudnnLibrary, EmptySfCudnnLibIsUnset) {
  const ScopedCudnnLib env(std::string(""));
  EXPECT_EQ(probe_error({kNoSuchLibrary}), "");
}

// A library that opens but is not cuDNN (libm): unavailable by default, an Error when named.
TEST(CudnnLibrary, NotCudnnIsRefused) {
  if (!cuda::cudnn_attention_built()) GTEST_SKIP() << "this build has no cuDNN headers";
  {
    const ScopedCudnnLib env(std::nullopt);
    const cuda::CudnnLibraryInfo info = cuda::cudnn_library_probe({kNoSuchLibrary, "libm.so.6"});
    EXPECT_FALSE(info.loaded);
    EXPECT_TRUE(info.opened);
    EXPECT_NE(info.why.find(kNoSuchLibrary), std::string::npos) << info.why;  // both named
    EXPECT_NE(info.why.find("libm.so.6"), std::string::npos) << info.why;
    EXPECT_NE(info.why.find("lacks cudnnGetVersion"), std::string::npos) << info.why;
  }
  const ScopedCudnnLib env(std::string("libm.so.6"));
  const std::string msg = probe_error({});
  EXPECT_NE(msg.find("SF_CUDNN_LIB=libm.so.6"), std::string::npos) << msg;
  EXPECT_NE(msg.find("lacks cudnnGetVersion"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cudnnBackendExecute"), std::string::npos) << msg;  // every one named
}

// cuDNN 9 on the search path (this machine's toolkit copy, through ld.so.conf) loads by name,
// then by the full path it was found at, through SF_CUDNN_LIB.
TEST(CudnnLibrary, LoadsCudnn9ByNameAndByPath) {
  if (!cuda::cudnn_attention_built()) GTEST_SKIP() << "this build has no cuDNN headers";
  cuda::CudnnLibraryInfo info;
  {
    const ScopedCudnnLib env(std::nullopt);
    info = cuda::cudnn_library_probe(cuda::cudnn_default_names());
  }
  if (!info.opened) GTEST_SKIP() << "no cuDNN on the loader's search path: " << info.why;
  ASSERT_TRUE(info.loaded) << info.why;
  EXPECT_EQ(info.version / 10000, 9);
  EXPECT_GE(info.version, cuda::kCudnnMinVersion);
  EXPECT_GT(info.cudart, 0);
  ASSERT_FALSE(info.path.empty());
  EXPECT_EQ(info.path.front(), '/') << info.path;  // dladdr's file, not the name asked for
  EXPECT_TRUE(std::filesystem::exists(info.path)) << info.path;

  const ScopedCudnnLib env(info.path);
  const cuda::CudnnLibraryInfo by_path = cuda::cudnn_library_probe({kNoSuchLibrary});
  EXPECT_TRUE(by_path.loaded) << by_path.why;
  EXPECT_EQ(by_path.version, info.version);
  EXPECT_EQ(std::filesystem::canonical(by_path.path), std::filesystem::canonical(info.path));
  EXPECT_NE(cuda::cudnn_version_text(by_path).find("cuDNN 9."), std::string::npos)
      << cuda::cudnn_version_text(by_path);
}

}  // namespace
}  // namespace sf::test
