// N ranks as processes (or threads) of ONE host, on the CPU: a Communicator over a POSIX
// shared-memory region (SharedRegion). For `slideformer train --gpus N --backend host` (CPU
// ranks, how CI tests data parallel across processes); GPU ranks use NCCL (NcclCommunicator).
//
// Every collective is a two-phase rendezvous, as ThreadCommunicator's: each rank copies its
// input (a piece of it: the region holds `capacity` bytes per rank, larger calls go in pieces)
// into its own slot and arrives; once every rank has arrived each computes ITS output alone from
// all the slots, summing in the FIXED order rank 0 + rank 1 + ... (bitwise the serial sum, the
// ThreadCommunicator's bits); then it departs, and no slot is written again before every rank
// has departed. The phases are per-rank atomic counters in the region, polled (the waiters are
// other processes); a wait longer than the timeout throws naming the ranks that did not arrive,
// and abort() (or a rank's failed call) records its message there, so every rank's pending and
// later calls throw it at once. communicator.h's contract otherwise.
//
// Set-up (docs/MULTI_GPU.md, "Host state in POSIX shared memory"): rank 0 create()s the region
// (region_bytes) and init()s it before the others open() it by name (the run id comes through the
// bootstrap); after a first barrier rank 0 unlinks the name.
#pragma once
#include <string>

#include "dist/communicator.h"
#include "dist/shared_memory.h"

namespace sf::dist {

class ShmCommunicator final : public Communicator {
 public:
  static size_t region_bytes(int world, size_t capacity);
  // The creator's: writes the header (world, capacity) into a zero-filled region.
  static void init(void* region, int world, size_t capacity);
  // rank's communicator over `region` (init()ed by the creator; the shape is checked).
  ShmCommunicator(SharedRegion region, int rank, int world, Timeout timeout);
  ~ShmCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  void all_reduce_sum(std::span<float> data) override;
  void all_reduce_sum(std::span<double> data) override;
  void reduce_scatter_sum(std::span<const float> send, std::span<float> recv) override;
  void all_gather(std::span<const float> mine, std::span<float> out) override;
  void broadcast(std::span<std::byte> data, int root) override;
  void barrier() override;
  void abort(const std::string& why) noexcept override;
  // The region's name removed (rank 0, after the first barrier).
  void unlink() { region_.unlink(); }

 private:
  struct Header;
  Header& header() const;
  std::byte* slot(int r) const;
  // Posts (op, count) and waits for every rank's post; checks they agree.
  void arrive(const char* op, size_t count);
  void depart(const char* op);
  void wait_phase(uint64_t phase, const char* op);
  [[noreturn]] void refuse(const std::string& why);
  template <class T>
  void all_reduce(std::span<T> data, const char* op);

  SharedRegion region_;
  int rank_, world_;
  size_t capacity_ = 0;
  uint64_t phase_ = 0;  // this rank's rendezvous points so far
};

}  // namespace sf::dist
