// DirectFile (io/direct_file.h): transfers split into requests round-trip exact bytes on both
// engines and both cache modes; injected ENOSPC / EIO / short transfers fail with Error(io)
// naming the directory, the operation, the errno text and the fix, and leave what was written
// before intact; a really full filesystem (a small tmpfs where the test may mount one, else
// RLIMIT_FSIZE) fails at construction, before anything runs.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "io/direct_file.h"

namespace sf {
namespace {

namespace fs = std::filesystem;

// Aligned buffer of random bytes (seeded), as O_DIRECT needs.
struct Buf {
  std::unique_ptr<void, decltype(&std::free)> p{nullptr, &std::free};
  size_t n = 0;
  explicit Buf(size_t bytes, uint32_t seed = 0) : p(std::aligned_alloc(DirectFile::kAlign, bytes), &std::free), n(bytes) {
    std::mt19937 g(seed);
    auto* w = static_cast<uint32_t*>(p.get());
    for (size_t i = 0; i < n / 4; ++i) w[i] = seed ? g() : 0;
  }
  char* data() const { return static_cast<char*>(p.get()); }
};

DirectFileOptions small_requests(IoEngine engine = IoEngine::io_uring, DirectIo direct = DirectIo::when_supported) {
  DirectFileOptions o;
  o.request_bytes = 64 << 10;  // many requests per transfer: splitting and the queue are exercised
  o.queue_depth = 4;
  o.engine = engine;
  o.direct = direct;
  return o;
}

std::string error_of(const std::function<void()>& f, ErrorKind* kind = nullptr) {
  try {
    f();
  } catch (const Error& e) {
    if (kind) *kind = e.kind();
    return e.what();
  }
  return "";
}

struct EngineCase {
  IoEngine engine;
  DirectIo direct;
};

class DirectFileRoundTrip : public ::testing::TestWithParam<EngineCase> {};

// Several transfers in flight at once, of sizes that are not request multiples, land exactly.
TEST_P(DirectFileRoundTrip, ConcurrentTransfersLandExactly) {
  const auto [engine, direct] = GetParam();
  const std::string dir = ::testing::TempDir();
  const size_t kBytes = 24 << 20;
  DirectFile f(dir, kBytes, small_requests(engine, direct));
  if (direct == DirectIo::buffered) EXPECT_FALSE(f.direct());
  if (direct == DirectIo::when_supported && filesystem_name(dir) == "ext4") EXPECT_TRUE(f.direct());
  Buf src(kBytes, 7), dst(kBytes);
  // Extents of 3 MiB + 12 KiB and smaller, back to back.
  std::vector<std::pair<size_t, size_t>> ext;
  for (size_t off = 0; off < kBytes;) {
    const size_t len = std::min(kBytes - off, (size_t(3) << 20) + 12288 * (ext.size() % 3));
    ext.push_back({off, len});
    off += len;
  }
  std::atomic<int> left{int(ext.size())};
  std::atomic<int> failures{0};
  for (auto [off, len] : ext)
    f.submit(IoOp::write, off, src.data() + off, len, [&](const std::string& e) {
      if (!e.empty()) ++failures;
      --left;
    });
  while (left.load() > 0) std::this_thread::yield();
  ASSERT_EQ(failures.load(), 0);
  for (size_t i = ext.size(); i-- > 0;) f.read(ext[i].first, dst.data() + ext[i].first, ext[i].second);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), kBytes), 0);
}

INSTANTIATE_TEST_SUITE_P(Engines, DirectFileRoundTrip,
                         ::testing::Values(EngineCase{IoEngine::io_uring, DirectIo::when_supported},
                                           EngineCase{IoEngine::io_uring, DirectIo::buffered},
                                           EngineCase{IoEngine::blocking, DirectIo::when_supported}),
                         [](const auto& info) {
                           return std::string(info.param.engine == IoEngine::io_uring ? "uring" : "blocking") +
                                  (info.param.direct == DirectIo::buffered ? "_buffered" : "_direct");
                         });

TEST(DirectFile, NewFileReadsZeros) {
  DirectFile f(::testing::TempDir(), 1 << 20, small_requests());
  Buf b(1 << 20, 3);
  f.read(0, b.data(), b.n);
  for (size_t i = 0; i < b.n; ++i) ASSERT_EQ(b.data()[i], 0) << i;
}

TEST(DirectFile, UnalignedTransferIsABug) {
  DirectFile f(::testing::TempDir(), 1 << 20, small_requests());
  Buf b(1 << 20, 3);
  ErrorKind k{};
  EXPECT_NE(error_of([&] { f.read(100, b.data(), 4096); }, &k), "");
  EXPECT_EQ(k, ErrorKind::internal);
  EXPECT_NE(error_of([&] { f.read(0, b.data(), 1 << 21); }), "");  // past the end
}

struct FaultCase {
  const char* name;
  IoOp op;
  IoFault fault;
  const char* text;  // in the message
};

class DirectFileFault : public ::testing::TestWithParam<FaultCase> {};

// A fault in one request of a later transfer: that transfer fails with the message, and the
// bytes written before read back unchanged.
TEST_P(DirectFileFault, FailsWithTheMessageAndKeepsEarlierData) {
  const FaultCase& c = GetParam();
  const std::string dir = ::testing::TempDir();
  const size_t kHalf = 4 << 20;
  DirectFile f(dir, 2 * kHalf, small_requests());
  Buf first(kHalf, 11), second(kHalf, 12), back(kHalf);
  f.write(0, first.data(), kHalf);
  const size_t bad = kHalf + (1 << 20);  // a request in the middle of the second extent
  f.set_fault_hook_for_test([&](IoOp op, size_t off, size_t) { return op == c.op && off == bad ? c.fault : IoFault{}; });
  ErrorKind kind{};
  const std::string msg = error_of(
      [&] {
        if (c.op == IoOp::write) f.write(kHalf, second.data(), kHalf);
        else f.read(kHalf, second.data(), kHalf);
      },
      &kind);
  EXPECT_EQ(kind, ErrorKind::io) << msg;
  for (const std::string part : {std::string("--optimizer-dir ") + dir, std::string(c.op == IoOp::write ? "writing" : "reading"),
                                 std::string("at offset ") + std::to_string(bad), std::string(c.text),
                                 std::string("free space on ") + dir + " or choose another --optimizer-dir"})
    EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
  f.set_fault_hook_for_test(nullptr);
  f.read(0, back.data(), kHalf);
  EXPECT_EQ(std::memcmp(back.data(), first.data(), kHalf), 0);
  f.write(kHalf, second.data(), kHalf);  // the file itself is fine: a retry works
  f.read(kHalf, back.data(), kHalf);
  EXPECT_EQ(std::memcmp(back.data(), second.data(), kHalf), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Faults, DirectFileFault,
    ::testing::Values(FaultCase{"enospc_write", IoOp::write, IoFault{ENOSPC}, "No space left on device"},
                      FaultCase{"eio_write", IoOp::write, IoFault{EIO}, "Input/output error"},
                      FaultCase{"short_write", IoOp::write, IoFault{0, 8192}, "short write: 8192 of 65536 bytes"},
                      FaultCase{"eio_read", IoOp::read, IoFault{EIO}, "Input/output error"},
                      FaultCase{"short_read", IoOp::read, IoFault{0, 0}, "short read: 0 of 65536 bytes"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(DirectFile, MissingDirectoryNamesTheFlag) {
  ErrorKind k{};
  const std::string msg = error_of([&] { DirectFile f("/nonexistent/sf-disk-tier", 1 << 20); }, &k);
  EXPECT_EQ(k, ErrorKind::input);  // a bad flag value
  EXPECT_NE(msg.find("--optimizer-dir /nonexistent/sf-disk-tier: cannot create"), std::string::npos) << msg;
}

// A filesystem with less room than the file: the reservation fails at construction.
void expect_reserve_fails(const std::string& dir, size_t bytes, const char* errno_text) {
  ErrorKind k{};
  const std::string msg = error_of([&] { DirectFile f(dir, bytes); }, &k);
  EXPECT_EQ(k, ErrorKind::io) << msg;
  EXPECT_NE(msg.find("cannot reserve"), std::string::npos) << msg;
  EXPECT_NE(msg.find(errno_text), std::string::npos) << msg;
  EXPECT_NE(msg.find("free space on " + dir + " or choose another --optimizer-dir"), std::string::npos) << msg;
}

TEST(DirectFile, FullTmpfsFailsAtConstruction) {
  const fs::path mnt = fs::path(::testing::TempDir()) / ("sf-full-tmpfs-" + std::to_string(::getpid()));
  fs::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=4m") != 0) {
    const int e = errno;
    fs::remove(mnt);
    GTEST_SKIP() << "cannot mount a 4 MiB tmpfs here (" << std::strerror(e)
                 << "; needs root); RlimitFullDiskFailsAtConstruction covers the same path";
  }
  expect_reserve_fails(mnt.string(), 8 << 20, "No space left on device");
  {
    DirectFile fits(mnt.string(), 2 << 20, small_requests());  // and one that fits works
    Buf b(2 << 20, 5), back(2 << 20);
    fits.write(0, b.data(), b.n);
    fits.read(0, back.data(), back.n);
    EXPECT_EQ(std::memcmp(b.data(), back.data(), b.n), 0);
  }
  ::umount(mnt.c_str());
  fs::remove(mnt);
}

// The process's file-size limit stands in for a full disk (EFBIG) where nothing can be mounted.
TEST(DirectFile, RlimitFullDiskFailsAtConstruction) {
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  rlimit lim = old;
  lim.rlim_cur = 4 << 20;
  auto* prev = ::signal(SIGXFSZ, SIG_IGN);  // else the kernel's signal ends the process
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &lim), 0);
  expect_reserve_fails(::testing::TempDir(), 8 << 20, "File too large");
  ::setrlimit(RLIMIT_FSIZE, &old);
  ::signal(SIGXFSZ, prev);
}

TEST(DirectFile, FilesystemName) {
  if (fs::exists("/dev/shm")) EXPECT_EQ(filesystem_name("/dev/shm"), "tmpfs");
  EXPECT_EQ(filesystem_name("/nonexistent/sf"), "an unreadable filesystem");
}

}  // namespace
}  // namespace sf
