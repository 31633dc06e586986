// launch_ranks with shell scripts as ranks: each gets its own RANK and the shared variables;
// the first rank that fails (an exit status or a signal) is named and stops the others
// (SIGTERM, then SIGKILL for one that ignores it); a command that cannot start is an Error.
// The long-running ranks are only ever stopped, never waited out.
#include <gtest/gtest.h>

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "dist/rank_launcher.h"
#include "dist/dist_test_util.h"

namespace sf::dist {
namespace {
using test::slurp;

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "sf_launch_XXXXXX").string();
    path = mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

RankLaunch shell(int world, const std::string& script) {
  RankLaunch l;
  l.argv = {"sh", "-c", script};
  l.world_size = world;
  return l;
}

TEST(RankLauncher, EveryRankGetsItsVariables) {
  TempDir dir;
  setenv("RANK", "99", 1);  // inherited values are replaced, never passed on
  const LaunchResult r = launch_ranks(shell(3, "echo \"$WORLD_SIZE $RANK $LOCAL_RANK $MASTER_ADDR $MASTER_PORT\" > " +
                                                   dir.path.string() + "/rank$RANK"));
  unsetenv("RANK");
  EXPECT_EQ(r.failed_rank, -1) << r.message;
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.message, "");
  ASSERT_GT(r.master_port, 0);
  for (int k = 0; k < 3; ++k)
    EXPECT_EQ(slurp(dir.path / ("rank" + std::to_string(k))),
              "3 " + std::to_string(k) + " " + std::to_string(k) + " 127.0.0.1 " + std::to_string(r.master_port) + "\n");
  ASSERT_EQ(r.exits.size(), 3u);
  for (const auto& x : r.exits) EXPECT_FALSE(x.signaled || x.exit_code != 0 || x.stopped);
}

TEST(RankLauncher, TheFirstFailureIsNamedAndStopsTheOthers) {
  // Rank 1 fails; the others would run for a minute.
  const LaunchResult r = launch_ranks(shell(3, "if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 60"));
  EXPECT_EQ(r.failed_rank, 1);
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_NE(r.message.find("rank 1 of 3 exited with status 3; the other ranks were stopped"), std::string::npos)
      << r.message;
  for (int k : {0, 2}) {
    EXPECT_TRUE(r.exits[size_t(k)].stopped) << "rank " << k;
    EXPECT_TRUE(r.exits[size_t(k)].signaled && r.exits[size_t(k)].signal == SIGTERM) << "rank " << k;
  }
}

TEST(RankLauncher, ARankThatIgnoresSigtermIsKilledAfterTheGrace) {
  // Rank 0 dies only once rank 1 ignores SIGTERM (its file says so), whatever the scheduling.
  TempDir dir;
  const std::string ready = (dir.path / "ready").string();
  RankLaunch l = shell(2, "if [ \"$RANK\" = 0 ]; then while [ ! -e " + ready + " ]; do sleep 0.05; done; kill -9 $$; fi; "
                          "trap '' TERM; touch " + ready + "; while :; do sleep 0.1; done");
  l.grace = std::chrono::milliseconds(500);
  const LaunchResult r = launch_ranks(l);
  EXPECT_EQ(r.failed_rank, 0);
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  EXPECT_NE(r.message.find("rank 0 of 2 was killed by signal 9"), std::string::npos) << r.message;
  EXPECT_TRUE(r.exits[1].stopped);
  EXPECT_TRUE(r.exits[1].signaled && r.exits[1].signal == SIGKILL) << "SIGTERM was ignored";
}

TEST(RankLauncher, ACommandThatCannotStartIsAnError) {
  RankLaunch l;
  l.argv = {"/nonexistent/slideformer"};
  l.world_size = 2;
  try {
    launch_ranks(l);
    FAIL() << "started";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot start rank 0: /nonexistent/slideformer"), std::string::npos) << e.what();
  }
  EXPECT_THROW(launch_ranks(RankLaunch{}), Error) << "no command";
}

}  // namespace
}  // namespace sf::dist
