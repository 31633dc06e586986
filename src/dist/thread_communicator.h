// N ranks as threads of one process: a Communicator over a shared ThreadGroup (the
// rendezvous). For the CPU tests of data parallelism and the host backend's multi-rank runs.
//
// Reductions sum in a FIXED order, rank 0 + rank 1 + ... + rank N-1, left to right, element
// by element, so a result is bitwise reproducible and equals that serial sum (whatever the
// threads' timing). Every collective follows communicator.h's contract, timeouts included:
// the group waits at most its timeout for a rank, then throws on every waiting rank an Error
// naming the ranks that did not arrive, and stays broken (later calls throw at once).
//
// Usage: auto group = std::make_shared<ThreadGroup>(n, timeout); thread r then makes
// ThreadCommunicator comm(group, r) and calls the collectives. A group serves one set of
// ranks; each rank's communicator is used by one thread at a time. Buffers of different ranks
// must not overlap (a rank reads the others' inputs while they write their outputs).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dist/communicator.h"

namespace sf::dist {

class ThreadGroup {
 public:
  ThreadGroup(int world_size, Timeout timeout);
  int world_size() const { return world_; }
  Timeout timeout() const { return timeout_; }

  // What one rank brings to a collective (read by the others between the two rendezvous).
  struct Post {
    const char* op = "";       // the call's name, for errors and the mismatch check
    const void* send = nullptr;
    void* recv = nullptr;
    size_t count = 0;          // elements (bytes for broadcast) the call is defined by
    size_t recv_count = 0;
    int root = -1;
  };
  // Publishes `post` and waits until every rank has published theirs for this call; checks
  // that they agree (same op, count, root). Returns all ranks' posts.
  const std::vector<Post>& arrive(int rank, const Post& post);
  // Waits until every rank is done with the others' buffers for this call.
  void depart(int rank, const char* op);
  // Breaks the group: every waiting and later call throws `why`. First failure wins.
  void abort(const std::string& why) noexcept;

 private:
  void wait_all(std::unique_lock<std::mutex>& lock, int rank, uint64_t phase, const char* op);
  void fail(const std::string& why);  // caller holds the lock

  const int world_;
  const Timeout timeout_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Post> posts_;
  std::vector<uint64_t> phase_;  // per rank: rendezvous points reached so far
  std::string failure_;          // non-empty: the group is broken, and why
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadGroup> group, int rank);
  int rank() const override { return rank_; }
  int world_size() const override { return group_->world_size(); }

  void all_reduce_sum(std::span<float> data) override;
  void all_reduce_sum(std::span<double> data) override;
  void reduce_scatter_sum(std::span<const float> send, std::span<float> recv) override;
  void all_gather(std::span<const float> mine, std::span<float> out) override;
  void broadcast(std::span<std::byte> data, int root) override;
  void barrier() override;
  void abort(const std::string& why) noexcept override;

 private:
  // A caller's bad argument: breaks the group (the other ranks would wait in vain) and throws.
  [[noreturn]] void refuse(const std::string& why);
  template <class T>
  void all_reduce(std::span<T> data, const char* op);

  std::shared_ptr<ThreadGroup> group_;
  int rank_;
};

}  // namespace sf::dist
