// Parsing and validation of the launcher's variables (contract in env_launch.h).
#include "dist/env_launch.h"

#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"

namespace sf::dist {

namespace {

constexpr const char* kNames[] = {"WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", nullptr};

const char* kSetAll =
    "a multi-process launch sets WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT "
    "together (torchrun does; under Slurm or mpirun export them per task), or none of them for "
    "one process (`slideformer train --gpus N` sets them itself)";

// A whole decimal integer in [lo, hi]; anything else names the variable.
int parse_int(const char* name, const std::string& v, long lo, long hi, const std::string& what) {
  bool digits = !v.empty();
  for (char c : v) digits = digits && std::isdigit(static_cast<unsigned char>(c));
  long x = 0;
  if (digits && v.size() <= 9) x = std::strtol(v.c_str(), nullptr, 10);
  SF_REQUIRE(digits && v.size() <= 9 && x >= lo && x <= hi, name, "='", v, "' is not ", what,
             ": set ", name, " to a whole number from ", lo, " to ", hi);
  return static_cast<int>(x);
}

void check_addr(const std::string& addr) {
  SF_REQUIRE(!addr.empty(), "MASTER_ADDR is empty: set it to rank 0's host name or IP address "
             "(127.0.0.1 for one machine)");
  for (char c : addr)
    SF_REQUIRE(!std::isspace(static_cast<unsigned char>(c)) && std::isprint(static_cast<unsigned char>(c)),
               "MASTER_ADDR='", addr, "' holds a blank or control character: set it to rank 0's "
               "host name or IP address alone, e.g. MASTER_ADDR=10.0.0.1");
}

std::string join(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) {
    if (!s.empty()) s += ", ";
    s += n;
  }
  return s;
}

}  // namespace

const char* const* launch_env_names() { return kNames; }

LaunchEnv launch_from_env(const EnvLookup& lookup) {
  std::vector<std::string> set, missing;
  for (const char* const* n = kNames; *n != nullptr; ++n) (lookup(*n) != nullptr ? set : missing).push_back(*n);
  LaunchEnv env;
  if (set.empty()) return env;
  if (!missing.empty()) {
    const std::string s = join(set), m = join(missing);
    SF_FAIL(input, s, (set.size() == 1 ? " is" : " are"), " set but ", m,
            (missing.size() == 1 ? " is" : " are"), " not: ", kSetAll);
  }
  auto get = [&](const char* n) { return std::string(lookup(n)); };
  env.from_env = true;
  env.world_size = parse_int("WORLD_SIZE", get("WORLD_SIZE"), 1, kMaxWorldSize, "a number of ranks");
  const long last = env.world_size - 1;
  env.rank = parse_int("RANK", get("RANK"), 0, last,
                       cat("a rank of WORLD_SIZE=", env.world_size, " (ranks count from 0)"));
  env.local_rank = parse_int("LOCAL_RANK", get("LOCAL_RANK"), 0, last,
                             cat("a GPU index of this host below WORLD_SIZE=", env.world_size));
  env.master_addr = get("MASTER_ADDR");
  check_addr(env.master_addr);
  env.master_port = parse_int("MASTER_PORT", get("MASTER_PORT"), 1, 65535,
                              "a TCP port (rank 0 listens there; 0 would let each rank pick its own)");
  return env;
}

LaunchEnv launch_from_env() {
  return launch_from_env([](const char* n) { return static_cast<const char*>(std::getenv(n)); });
}

}  // namespace sf::dist
