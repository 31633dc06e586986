// The ranks' first contact (docs/MULTI_GPU.md, "Bootstrap"): rank 0 listens on
// MASTER_ADDR:MASTER_PORT; every other rank connects and introduces itself (rank, world
// size); once ALL ranks are there, rank 0 sends each the same blob (the NCCL unique id, the
// run id), so the bootstrap is also the run's first barrier.
//
// Wire format (integers as 4 little-endian bytes): hello = magic "SFB1", version, world size,
// rank; reply = magic, status (0: the blob follows; 1: refused, a message follows), length,
// then the bytes. Connections that do not start with the magic (a port scanner, a stray
// client) are closed and counted, never fatal.
//
// Errors (sf::Error; the message names the address, the rank(s) and the fix): the address is
// in use or not this host's (rank 0), it does not resolve, connection refused until the
// timeout (the others: rank 0 not started or another address), a rank missing after the
// timeout (rank 0 names it and tells every connected rank), a world-size mismatch or a rank
// that connects twice (every rank involved fails), no reply within the timeout.
#pragma once
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "dist/communicator.h"  // Timeout
#include "dist/env_launch.h"

namespace sf::dist {

constexpr size_t kMaxBootstrapBlob = size_t(1) << 20;

class BootstrapServer {
 public:
  // Binds and listens at once (so a port already taken fails here); port 0: an ephemeral
  // port, which port() reports.
  BootstrapServer(const std::string& addr, int port, int world_size);
  ~BootstrapServer();
  BootstrapServer(const BootstrapServer&) = delete;
  BootstrapServer& operator=(const BootstrapServer&) = delete;

  int port() const { return port_; }
  // Waits up to `timeout` until ranks 1..world-1 have each connected once, then sends every
  // one `blob` (at most kMaxBootstrapBlob bytes). Throws (after telling the connected ranks
  // why) when one is missing, or a hello is refused.
  void serve(std::span<const std::byte> blob, Timeout timeout);

 private:
  std::string addr_;
  int port_ = 0;
  int world_ = 1;
  int fd_ = -1;
};

// Rank `rank` (1..world-1): connects to rank 0 (retrying while refused), says hello, and
// returns the blob; all within `timeout`.
std::vector<std::byte> bootstrap_receive(const std::string& addr, int port, int world_size, int rank,
                                         Timeout timeout);

// Both sides from the launcher's variables: rank 0 serves `blob` and returns it, the others
// return what they receive; world 1 returns `blob` without any socket.
std::vector<std::byte> tcp_bootstrap(const LaunchEnv& env, std::span<const std::byte> blob, Timeout timeout);

}  // namespace sf::dist
