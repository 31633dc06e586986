// NCCL's run-time loader: clear errors where NCCL is missing or something else is named; where
// the toolkit's libnccl loads (it needs no GPU for this), its version and unique ids, and the
// id carried to every rank by the TCP bootstrap; the declared ABI against nccl.h (compile time).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "dist/dist_test_util.h"
#include "dist/nccl_library.h"
#include "dist/tcp_bootstrap.h"

#if SF_TEST_NCCL_HEADER
#include <nccl.h>
#endif

namespace sf::dist {
namespace {

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::io);
    return e.what();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(NcclLibrary, AMissingLibraryNamesThePathAndTheFix) {
  const std::string m = message_of([] { NcclLibrary::open("/nonexistent/libnccl.so.2"); });
  EXPECT_NE(m.find("cannot load NCCL from /nonexistent/libnccl.so.2"), std::string::npos) << m;
  EXPECT_NE(m.find("SF_NCCL_LIB="), std::string::npos) << m;
}

TEST(NcclLibrary, ALibraryThatIsNotNcclIsRefused) {
  // libm: present on every glibc system, and without NCCL's symbols.
  const std::string m = message_of([] { NcclLibrary::open("libm.so.6"); });
  EXPECT_NE(m.find("NCCL library libm.so.6 has no ncclGetVersion"), std::string::npos) << m;
}

TEST(NcclLibrary, LoadsAndMakesUniqueIdsWithoutAGpu) {
  auto lib = test::toolkit_nccl();
  if (!lib) GTEST_SKIP() << "no libnccl.so.2 here";
  EXPECT_GE(lib->version(), nccl::kMinVersion);
  EXPECT_EQ(lib->version_text().rfind("NCCL 2.", 0), 0u) << lib->version_text();
  const NcclUniqueId a = lib->unique_id(), b = lib->unique_id();
  EXPECT_TRUE(std::any_of(a.bytes.begin(), a.bytes.end(), [](std::byte x) { return x != std::byte(0); }));
  EXPECT_NE(std::memcmp(a.bytes.data(), b.bytes.data(), a.bytes.size()), 0) << "each id is fresh";
  const std::string m = message_of([&] { lib->check(2, "ncclCommInitRank"); });  // ncclSystemError
  EXPECT_NE(m.find("ncclCommInitRank failed: "), std::string::npos) << m;
  EXPECT_NO_THROW(lib->check(nccl::kSuccess, "ncclGroupEnd"));
}

TEST(NcclLibrary, TheBootstrapCarriesRankZerosIdToEveryRank) {
  auto lib = test::toolkit_nccl();
  if (!lib) GTEST_SKIP() << "no libnccl.so.2 here";
  const int world = 3;
  BootstrapServer server("127.0.0.1", 0, world);
  const NcclUniqueId id = lib->unique_id();
  std::vector<NcclUniqueId> got(world);
  const auto errors = test::run_ranks(world, [&](int r) {
    if (r == 0) {
      server.serve(id.bytes, Timeout(30000));
      got[0] = id;
      return;
    }
    const auto blob = bootstrap_receive("127.0.0.1", server.port(), world, r, Timeout(30000));
    ASSERT_EQ(blob.size(), nccl::kUniqueIdBytes);
    std::copy(blob.begin(), blob.end(), got[static_cast<size_t>(r)].bytes.begin());
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
    EXPECT_EQ(got[static_cast<size_t>(r)].bytes, id.bytes) << "rank " << r;
  }
}

#if SF_TEST_NCCL_HEADER
// The ABI nccl_library.h declares without the header, checked where the build has nccl.h (a
// mismatch fails the build of this test, so no test case is needed for it).
static_assert(sizeof(NcclUniqueId) == sizeof(ncclUniqueId) && alignof(NcclUniqueId) == alignof(ncclUniqueId));
static_assert(nccl::kUniqueIdBytes == NCCL_UNIQUE_ID_BYTES);
static_assert(nccl::kSuccess == ncclSuccess && nccl::kInProgress == ncclInProgress);
static_assert(nccl::kUint8 == ncclUint8 && nccl::kFloat32 == ncclFloat32 && nccl::kFloat64 == ncclFloat64);
static_assert(nccl::kSum == ncclSum);
static_assert(sizeof(ncclResult_t) == sizeof(int) && sizeof(ncclDataType_t) == sizeof(int) &&
              sizeof(ncclRedOp_t) == sizeof(int) && sizeof(ncclComm_t) == sizeof(void*));
#endif

}  // namespace
}  // namespace sf::dist
