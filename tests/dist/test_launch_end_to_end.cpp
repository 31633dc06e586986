// The pieces together, across real processes: launch_ranks starts this test binary N times as
// ranks (each running only DistChild's test, disabled in a normal run), each reads its place
// from the environment (launch_from_env) and joins the TCP bootstrap; a rank that dies early
// stops the others. Only the ranks' exit statuses and the files they write are checked.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "dist/env_launch.h"
#include "dist/rank_launcher.h"
#include "dist/tcp_bootstrap.h"
#include "dist/dist_test_util.h"

namespace sf::dist {
namespace {
using test::slurp;

namespace fs = std::filesystem;

std::vector<std::byte> id_blob() {
  std::vector<std::byte> b(128);
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::byte(static_cast<unsigned>(i * 91 + 7));
  return b;
}

// A rank: joins the bootstrap and writes what it received to $SF_TEST_LAUNCH_OUT/rank<r>.
TEST(DistChild, DISABLED_JoinsTheBootstrapFromTheEnvironment) {
  const LaunchEnv env = launch_from_env();
  ASSERT_TRUE(env.from_env);
  const char* out = std::getenv("SF_TEST_LAUNCH_OUT");
  ASSERT_NE(out, nullptr);
  const auto got = tcp_bootstrap(env, env.rank == 0 ? id_blob() : std::vector<std::byte>{}, Timeout(60000));
  std::ofstream f(fs::path(out) / ("rank" + std::to_string(env.rank)));
  f << env.world_size << " " << env.local_rank << " " << (got == id_blob() ? "id" : "wrong id") << "\n";
}

struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "sf_e2e_XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

// sh runs this binary's child test with the output directory; `before` runs first (a fault).
RankLaunch child_ranks(int world, const fs::path& out, const std::string& before = "") {
  const std::string exe = fs::read_symlink("/proc/self/exe").string();
  RankLaunch l;
  l.world_size = world;
  l.argv = {"sh", "-c", before + "SF_TEST_LAUNCH_OUT='" + out.string() + "' exec '" + exe +
                            "' --gtest_filter=DistChild.* --gtest_also_run_disabled_tests > /dev/null"};
  return l;
}

TEST(LaunchEndToEnd, RanksStartedByTheLauncherGetRankZerosId) {
  TempDir dir;
  const LaunchResult r = launch_ranks(child_ranks(3, dir.path));
  EXPECT_EQ(r.failed_rank, -1) << r.message;
  for (int k = 0; k < 3; ++k)
    EXPECT_EQ(slurp(dir.path / ("rank" + std::to_string(k))), "3 " + std::to_string(k) + " id\n") << "rank " << k;
}

TEST(LaunchEndToEnd, ARankThatDiesStopsTheOthers) {
  TempDir dir;
  // Rank 2 dies before joining: ranks 0 and 1 would wait a minute for it in the bootstrap.
  const LaunchResult r = launch_ranks(child_ranks(3, dir.path, "if [ \"$RANK\" = 2 ]; then exit 5; fi; "));
  EXPECT_EQ(r.failed_rank, 2);
  EXPECT_EQ(r.exit_code, 5);
  EXPECT_NE(r.message.find("rank 2 of 3 exited with status 5"), std::string::npos) << r.message;
  for (int k : {0, 1}) EXPECT_TRUE(r.exits[size_t(k)].stopped) << "rank " << k;
  EXPECT_FALSE(fs::exists(dir.path / "rank0")) << "rank 0 never got every rank";
}

}  // namespace
}  // namespace sf::dist
