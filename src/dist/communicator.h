// The collectives a data-parallel run needs between its ranks (docs/MULTI_GPU.md), as an
// abstract interface: ThreadCommunicator (ranks as threads of one process, for the CPU tests
// and the host backend) and NcclCommunicator (dist/cuda: one process per GPU) implement it.
//
// Contract of every call:
// - it is collective: every rank of the group makes the same calls in the same order, with the
//   same element counts (a mismatch is an Error on every rank);
// - it blocks until the call is complete on this rank; outputs are OVERWRITTEN (never
//   accumulated into); inputs are not changed unless the call is in place;
// - it waits at most timeout() for the other ranks; past it, it throws sf::Error
//   (ErrorKind::io) naming the call and the rank(s) that did not arrive where the transport
//   can tell (ThreadCommunicator does; NCCL cannot, and its message says so); the group is
//   then broken and every later call throws at once (a fault stops all ranks).
//
// Shards: reduce_scatter_sum and all_gather cut n elements into world_size() contiguous
// shards with shard_range(n, world_size(), rank), so uneven counts are allowed: the last
// ranks' shards may be shorter, or empty.
#pragma once
#include <chrono>
#include <cstddef>
#include <span>
#include <string>

namespace sf::dist {

using Timeout = std::chrono::milliseconds;

// The half-open element range [begin, end) of rank's shard of n elements over world ranks:
// shards of ceil(n / world) elements rounded up to a multiple of `align` (SIMD-aligned
// slices for the CPU AdamW), in rank order, the last ones clipped to n.
struct ShardRange {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};
ShardRange shard_range(size_t n, int world, int rank, size_t align = 1);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  Timeout timeout() const { return timeout_; }

  // data[i] = sum over ranks of data[i], in place; the same count on every rank.
  virtual void all_reduce_sum(std::span<float> data) = 0;
  virtual void all_reduce_sum(std::span<double> data) = 0;
  // recv = this rank's shard (shard_range(send.size(), ...)) of the sum over ranks of send;
  // recv.size() must equal that shard's size; recv must not overlap send.
  virtual void reduce_scatter_sum(std::span<const float> send, std::span<float> recv) = 0;
  // out[shard of rank r] = rank r's `mine`, for every r; mine.size() must equal this rank's
  // shard of out.size(); mine must not overlap out.
  virtual void all_gather(std::span<const float> mine, std::span<float> out) = 0;
  // Every rank's data = root's data (the same byte count on every rank).
  virtual void broadcast(std::span<std::byte> data, int root) = 0;
  // Returns once every rank has called it.
  virtual void barrier() = 0;
  // Breaks the group on behalf of this rank (it hit an error of its own and will not arrive):
  // every rank's pending and later calls throw an Error naming this rank and `why`, without
  // waiting for the timeout. Not collective; never throws.
  virtual void abort(const std::string& why) noexcept = 0;

 protected:
  explicit Communicator(Timeout timeout) : timeout_(timeout) {}

 private:
  Timeout timeout_;
};

}  // namespace sf::dist
