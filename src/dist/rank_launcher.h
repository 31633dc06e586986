// `slideformer train --gpus N`'s launcher (docs/MULTI_GPU.md, "Launch" and "Faults"): starts N
// copies of one command as ranks 0..N-1 of one host, each with WORLD_SIZE, RANK, LOCAL_RANK,
// MASTER_ADDR and MASTER_PORT set (any inherited values of those replaced), and waits for them.
// The first rank that fails (a non-zero exit or a signal) stops the others: SIGTERM, then
// SIGKILL for those still running after `grace`; the result names that rank and how it ended.
// A rank that hangs is caught by the others' communicator timeouts (they exit non-zero), so the
// launcher itself never needs a timeout of its own. Children are started with posix_spawnp (no
// fork of a threaded parent); a command that cannot be started is an Error before any rank runs.
#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace sf::dist {

struct RankLaunch {
  std::vector<std::string> argv;  // the program (searched in PATH) and its arguments
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;            // 0: a free port, picked here
  std::chrono::milliseconds grace{30000};  // SIGTERM -> SIGKILL for the other ranks
};

struct RankExit {
  int rank = 0;
  int exit_code = 0;   // valid when !signaled
  bool signaled = false;
  int signal = 0;      // valid when signaled
  bool stopped = false;  // ended by the launcher after another rank's failure
};

struct LaunchResult {
  int failed_rank = -1;     // the first rank that failed; -1: every rank exited 0
  int exit_code = 0;        // what the launcher should exit with: the failed rank's code, 128 + signal
  std::string message;      // empty when all succeeded; names the rank and how it ended
  std::vector<RankExit> exits;  // by rank
  int master_port = 0;      // the port the ranks were given
};

LaunchResult launch_ranks(const RankLaunch& launch);

}  // namespace sf::dist
