// The training state's store: in RAM, or with the AdamW moments in a file on disk (mapped):
// zero at the start, read and written like memory, nothing left in the directory, and clear
// errors for a directory that cannot hold them.
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>

#include <filesystem>
#include <vector>

#include "core/error.h"
#include "optim/param_store.h"
#include "model/model_presets.h"
#include "model/param_layout.h"
#include "test_util.h"

using namespace sf;
namespace fs = std::filesystem;

namespace {

using sf::test::TempDir;

ModelLayout tiny_layout() { return ModelLayout::build(model_preset("tiny")); }

TEST(ParamStore, MomentsOnDiskAreZeroWritableAndLeaveNothingBehind) {
  TempDir dir;
  const ModelLayout layout = tiny_layout();
  {
    ParamStore ram(state_units(layout)), disk(state_units(layout), dir.path.string());
    EXPECT_FALSE(ram.moments_on_disk());
    EXPECT_TRUE(disk.moments_on_disk());
    // Only the master counts as RAM when the moments are on disk.
    EXPECT_EQ(disk.host_bytes() * 3, ram.host_bytes());
    for (int u = 0; u < disk.n_units(); ++u) {
      disk.prefetch_moments(u);
      for (int64_t i = 0; i < disk.numel(u); ++i) {
        ASSERT_EQ(disk.m(u)[i], 0.f);
        ASSERT_EQ(disk.v(u)[i], 0.f);
      }
      // Distinct, non-overlapping arrays: write a pattern everywhere, read it all back.
      for (int64_t i = 0; i < disk.numel(u); ++i) {
        disk.m(u)[i] = float(u) + float(i) * 1e-3f;
        disk.v(u)[i] = -float(u) - float(i) * 1e-3f;
      }
    }
    for (int u = 0; u < disk.n_units(); ++u)
      for (int64_t i = 0; i < disk.numel(u); ++i) {
        ASSERT_EQ(disk.m(u)[i], float(u) + float(i) * 1e-3f) << u << " " << i;
        ASSERT_EQ(disk.v(u)[i], -float(u) - float(i) * 1e-3f) << u << " " << i;
      }
    EXPECT_GE(moments_file_bytes(state_units(layout)), 2 * sizeof(float) * size_t(layout.total_numel()));
    // The file has no name: the directory stays empty while it is in use.
    EXPECT_TRUE(fs::is_empty(dir.path));
  }
  EXPECT_TRUE(fs::is_empty(dir.path));
}

TEST(ParamStore, ClearErrorsForADirectoryThatCannotHoldTheMoments) {
  const ModelLayout layout = tiny_layout();
  try {
    ParamStore s(state_units(layout), "/nonexistent/sf-moments");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::input);
    EXPECT_NE(std::string(e.what()).find("--optimizer-dir /nonexistent/sf-moments"), std::string::npos)
        << e.what();
  }
  // A file size limit (as a full disk would) refuses the reservation up front, not later as
  // SIGBUS in an optimizer sweep.
  {
    TempDir dir;
    struct rlimit old {};
    ::getrlimit(RLIMIT_FSIZE, &old);
    auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old;
    small.rlim_cur = 1 << 20;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    std::string msg;
    try {
      ParamStore s(state_units(layout), dir.path.string());
    } catch (const Error& e) {
      msg = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::signal(SIGXFSZ, old_handler);
    EXPECT_NE(msg.find("cannot reserve"), std::string::npos) << msg;
    EXPECT_NE(msg.find("free space or choose another directory"), std::string::npos) << msg;
    EXPECT_TRUE(fs::is_empty(dir.path));
  }
  EXPECT_GT(disk_free_bytes(fs::temp_directory_path().string()), 0u);
  EXPECT_EQ(disk_free_bytes("/nonexistent/sf-moments"), 0u);
}

}  // namespace

namespace {

// Streamed moments: once the next unit is done, a unit's moments are on disk and out of the
// page cache (mincore), and read back unchanged.
TEST(ParamStore, StreamedMomentsAreWrittenAndDroppedBehindTheSweep) {
  TempDir dir;
  const ModelLayout layout = tiny_layout();
  ParamStore s(state_units(layout), dir.path.string(), true);
  ASSERT_TRUE(s.moments_on_disk());
  for (int u = 0; u < s.n_units(); ++u) {
    s.prefetch_moments(u);
    for (int64_t i = 0; i < s.numel(u); ++i) {
      s.m(u)[i] = 0.5f + float(i % 97);
      s.v(u)[i] = 2.0f + float(u);
    }
    s.moments_done(u);
  }
  // Unit 0 (the embedding, the largest) was dropped when unit 1 was done.
  const size_t page = size_t(::sysconf(_SC_PAGESIZE));
  const size_t bytes = size_t(s.numel(0)) * 4;
  std::vector<unsigned char> resident((bytes + page - 1) / page);
  ASSERT_EQ(::mincore(s.m(0), bytes, resident.data()), 0);
  size_t in_core = 0;
  for (unsigned char r : resident) in_core += r & 1;
  EXPECT_LT(in_core, resident.size() / 4) << in_core << " of " << resident.size() << " pages";
  for (int u = 0; u < s.n_units(); ++u)
    for (int64_t i = 0; i < s.numel(u); ++i) {
      ASSERT_EQ(s.m(u)[i], 0.5f + float(i % 97)) << u << " " << i;
      ASSERT_EQ(s.v(u)[i], 2.0f + float(u)) << u << " " << i;
    }
}

}  // namespace
