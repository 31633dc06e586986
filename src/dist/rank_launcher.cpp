// Starting and supervising the ranks of one host (contract in rank_launcher.h).
#include "dist/rank_launcher.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "dist/env_launch.h"
#include "dist/tcp_bootstrap.h"

extern char** environ;

namespace sf::dist {

static_assert(kRankStopSignal == SIGUSR1);

namespace {

using Clock = std::chrono::steady_clock;

// SIGTERM / SIGHUP received while launch_ranks waits: how many, and the first one.
std::atomic<int> g_stops{0}, g_first_stop{0};
extern "C" void on_launcher_stop(int sig) {
  int none = 0;
  g_first_stop.compare_exchange_strong(none, sig);
  g_stops.fetch_add(1);
}

// The handlers while the ranks run; the previous ones restored after.
class LauncherSignals {
 public:
  LauncherSignals() {
    g_stops = 0;
    g_first_stop = 0;
    struct sigaction sa {};
    sa.sa_handler = on_launcher_stop;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    ::sigaction(SIGTERM, &sa, &old_term_);
    ::sigaction(SIGHUP, &sa, &old_hup_);
  }
  ~LauncherSignals() {
    ::sigaction(SIGTERM, &old_term_, nullptr);
    ::sigaction(SIGHUP, &old_hup_, nullptr);
  }

 private:
  struct sigaction old_term_ {}, old_hup_ {};
};

// The parent's environment without the launcher's variables, plus rank r's.
std::vector<std::string> rank_environment(const RankLaunch& l, int port, int rank) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    bool ours = false;
    for (const char* const* n = launch_env_names(); *n != nullptr; ++n)
      ours = ours || kv.rfind(std::string(*n) + "=", 0) == 0;
    if (!ours) env.push_back(kv);
  }
  env.push_back(cat("WORLD_SIZE=", l.world_size));
  env.push_back(cat("RANK=", rank));
  env.push_back(cat("LOCAL_RANK=", rank));
  env.push_back(cat("MASTER_ADDR=", l.master_addr));
  env.push_back(cat("MASTER_PORT=", port));
  env.push_back(cat(kLauncherPidVariable, "=", ::getpid()));
  return env;
}

std::vector<char*> c_strings(std::vector<std::string>& v) {
  std::vector<char*> p;
  for (auto& s : v) p.push_back(s.data());
  p.push_back(nullptr);
  return p;
}

RankExit decode(int rank, int status) {
  RankExit x;
  x.rank = rank;
  x.signaled = WIFSIGNALED(status);
  x.signal = x.signaled ? WTERMSIG(status) : 0;
  x.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 0;
  return x;
}

bool failed(const RankExit& x) { return x.signaled || x.exit_code != 0; }

// After a stop was passed on: how a rank that stopped ends (0 once its run was complete, or the
// stop's 128 + signal), as opposed to one that failed.
bool stopped_as_asked(const RankExit& x) {
  if (x.signaled) return false;
  return x.exit_code == 0 || x.exit_code == 128 + kRankStopSignal || x.exit_code == 128 + SIGTERM ||
         x.exit_code == 128 + SIGHUP || x.exit_code == 128 + SIGINT;
}

std::string how(const RankExit& x) {
  if (!x.signaled) return cat("exited with status ", x.exit_code);
  const char* name = strsignal(x.signal);
  return cat("was killed by signal ", x.signal, " (", name != nullptr ? name : "?", ")",
             x.signal == SIGKILL ? ": the out-of-memory killer, or someone's kill -9" : "");
}

}  // namespace

LaunchResult launch_ranks(const RankLaunch& l) {
  SF_REQUIRE(!l.argv.empty(), "launch_ranks: no command");
  SF_REQUIRE(l.world_size >= 1, "--gpus ", l.world_size, " must be at least 1");
  LaunchResult res;
  // A free port: one the kernel hands out, released for rank 0 to bind (another process could
  // take it in between; rank 0 then reports the port in use).
  res.master_port = l.master_port != 0 ? l.master_port : BootstrapServer(l.master_addr, 0, l.world_size).port();
  std::vector<std::string> args = l.argv;
  std::vector<char*> argv = c_strings(args);
  LauncherSignals signals;
  std::vector<pid_t> pids;
  for (int r = 0; r < l.world_size; ++r) {
    std::vector<std::string> env = rank_environment(l, res.master_port, r);
    std::vector<char*> envp = c_strings(env);
    pid_t pid = 0;
    const int err = posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data());
    if (err != 0) {
      for (pid_t p : pids) ::kill(p, SIGKILL);
      for (pid_t p : pids) ::waitpid(p, nullptr, 0);
      SF_FAIL(input, "cannot start rank ", r, ": ", l.argv[0], ": ", std::strerror(err));
    }
    pids.push_back(pid);
  }
  res.exits.resize(pids.size());
  std::vector<bool> running(pids.size(), true);
  size_t left = pids.size();
  Clock::time_point kill_at = Clock::time_point::max();
  int stops_passed = 0;
  while (left > 0) {
    const int stops = g_stops.load();
    if (stops > stops_passed) {  // a stop from outside: passed on once, a second one kills
      res.stop_signal = g_first_stop.load();
      for (size_t q = 0; q < pids.size(); ++q)
        if (running[q]) ::kill(pids[q], stops_passed == 0 ? kRankStopSignal : SIGKILL);
      stops_passed = stops;
    }
    bool reaped = false;
    for (size_t r = 0; r < pids.size(); ++r) {
      if (!running[r]) continue;
      int status = 0;
      const pid_t got = ::waitpid(pids[r], &status, WNOHANG);
      if (got != pids[r]) continue;
      running[r] = false;
      --left;
      reaped = true;
      RankExit x = decode(int(r), status);
      x.stopped = res.failed_rank >= 0;
      res.exits[r] = x;
      if (res.failed_rank < 0 && failed(x) && !(res.stop_signal != 0 && stopped_as_asked(x))) {
        res.failed_rank = int(r);
        res.exit_code = x.signaled ? 128 + x.signal : x.exit_code;
        for (size_t q = 0; q < pids.size(); ++q)
          if (running[q]) ::kill(pids[q], SIGTERM);
        kill_at = Clock::now() + l.grace;
      }
    }
    if (Clock::now() >= kill_at) {
      for (size_t q = 0; q < pids.size(); ++q)
        if (running[q]) ::kill(pids[q], SIGKILL);
      kill_at = Clock::time_point::max();
    }
    if (!reaped && left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (res.failed_rank < 0 && res.stop_signal != 0) {
    res.exit_code = 128 + res.stop_signal;
    const char* name = strsignal(res.stop_signal);
    res.message = cat("stopped by signal ", res.stop_signal, " (", name != nullptr ? name : "?",
                      "), passed on to every rank: they stop after the same step and rank 0 saves");
  }
  if (res.failed_rank >= 0)
    res.message = cat("rank ", res.failed_rank, " of ", l.world_size, " ", how(res.exits[size_t(res.failed_rank)]),
                      l.world_size > 1 ? "; the other ranks were stopped (its own error, above, says why)" : "");
  return res;
}

}  // namespace sf::dist
