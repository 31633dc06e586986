// `slideformer train --gpus N`'s launcher (docs/MULTI_GPU.md, "Launch" and "Faults"): starts N
// copies of one command as ranks 0..N-1 of one host, each with WORLD_SIZE, RANK, LOCAL_RANK,
// MASTER_ADDR and MASTER_PORT set (any inherited values of those replaced), and waits for them.
// The first rank that fails (a non-zero exit or a signal) stops the others: SIGTERM, then
// SIGKILL for those still running after `grace`; the result names that rank and how it ended.
// A rank that hangs is caught by the others' communicator timeouts (they exit non-zero), so the
// launcher itself never needs a timeout of its own.
//
// Stops from outside: a SIGTERM or SIGHUP sent to the launcher while it waits is passed to every
// rank as kRankStopSignal (SIGUSR1: "stop after the step and save", which a rank never takes as
// a second Ctrl-C, so one that got the SIGTERM itself too still saves); a second one kills the
// ranks. The ranks ask for kRankStopSignal when the launcher dies (PR_SET_PDEATHSIG, through
// kLauncherPidVariable), so even a kill -9 of the launcher leaves no rank running on. Ranks that
// end after a forwarded stop with 0 or 128 + a stop signal are stopped, not failed. Children are started with posix_spawnp (no
// fork of a threaded parent); a command that cannot be started is an Error before any rank runs.
#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace sf::dist {

constexpr int kRankStopSignal = 10;  // SIGUSR1 (Linux); checked against <signal.h> in the .cpp
// Set in every rank's environment to the launcher's pid (for the ranks' parent-death signal).
constexpr const char* kLauncherPidVariable = "SF_LAUNCHER_PID";

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
  int stop_signal = 0;      // SIGTERM / SIGHUP the launcher received and passed on (0: none)
};

LaunchResult launch_ranks(const RankLaunch& launch);

}  // namespace sf::dist
