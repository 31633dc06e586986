// Where this process stands in a data-parallel run, from the torchrun-style environment that
// torchrun, Slurm wrappers and mpirun (-x) set: WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR,
// MASTER_PORT (docs/MULTI_GPU.md, "Launch").
//
// None of them set: a single process (world 1, rank 0, from_env false). Any of them set: all
// five are required (a partial set is a launcher mistake, never filled in with guesses), each
// validated; a bad one is an Error (ErrorKind::input) naming the variable, its value and the
// fix. Pure: the variables come through a lookup function, so tests need no real environment.
#pragma once
#include <functional>
#include <string>

namespace sf::dist {

struct LaunchEnv {
  int world_size = 1;
  int rank = 0;
  int local_rank = 0;        // which GPU of this host (the index among the visible devices)
  std::string master_addr;   // where rank 0 listens for the bootstrap (host name or address)
  int master_port = 0;
  bool from_env = false;     // false: none of the variables was set (a single process)
};

// The value of a variable, or nullptr where unset (std::getenv's contract).
using EnvLookup = std::function<const char*(const char*)>;

// The names this reads, in the order they are reported.
const char* const* launch_env_names();  // null-terminated
constexpr int kMaxWorldSize = 65536;

LaunchEnv launch_from_env(const EnvLookup& lookup);
LaunchEnv launch_from_env();  // the process's environment

}  // namespace sf::dist
