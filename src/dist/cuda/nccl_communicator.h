// A Communicator over NCCL (docs/MULTI_GPU.md): one per rank and GPU, formed from rank 0's
// unique id (sent by the TCP bootstrap), NCCL dlopened through NcclLibrary.
//
// Two forms:
// - the Communicator calls (host spans): staged through a device buffer on the communicator's
//   own stream and waited for, for the small collectives (the norm's f64 scalar, flags,
//   broadcast of settings, barrier). Shards follow dist::shard_range (uneven counts padded to
//   NCCL's equal shards on the device; the pad is zero and never returned);
// - the device calls (device pointers, the caller's stream): enqueued, not waited for, for the
//   engine's gradients; wait(stream) then bounds them.
//
// Timeouts: formation and every wait poll, at most timeout(); past it, or on an asynchronous
// NCCL error, the communicator is aborted (ncclCommAbort, which releases kernels stuck in a
// collective) and the call throws sf::Error (ErrorKind::io). Unlike ThreadCommunicator, NCCL
// cannot tell which rank is missing: the message says so (the other ranks' errors and the
// launcher name it). A blocking ncclCommInitRank cannot be cancelled: after a formation
// timeout its thread stays blocked, and the process must exit (the launcher's job). Sums are
// NCCL's (ring or tree order): deterministic for a given world size and topology, not the
// rank-order serial sum of ThreadCommunicator.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "dist/communicator.h"
#include "dist/nccl_library.h"

namespace sf::dist {

class NcclCommunicator final : public Communicator {
 public:
  // `nccl` must outlive the communicator (NcclLibrary::process() does).
  NcclCommunicator(const NcclLibrary& nccl, const NcclUniqueId& id, int world_size, int rank, int device,
                   Timeout timeout);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  void all_reduce_sum(std::span<float> data) override;
  void all_reduce_sum(std::span<double> data) override;
  void reduce_scatter_sum(std::span<const float> send, std::span<float> recv) override;
  void all_gather(std::span<const float> mine, std::span<float> out) override;
  void broadcast(std::span<std::byte> data, int root) override;
  void barrier() override;
  // From the thread that uses the communicator, between calls (unlike ThreadCommunicator's,
  // not from another thread: wait() polls the communicator; its timeout is the watchdog).
  void abort(const std::string& why) noexcept override;

  // Device forms, enqueued on `stream`. reduce_scatter: send [world x shard], recv [shard]
  // (equal shards: the caller pads, e.g. the engine's accumulators to 64 x world elements).
  void reduce_scatter_sum_device(const float* send, float* recv, size_t shard, cudaStream_t stream);
  void all_reduce_sum_device(float* data, size_t n, cudaStream_t stream);
  // Returns once `stream`'s work is done; aborts and throws past timeout() or on an NCCL error.
  void wait(cudaStream_t stream, const char* op);

 private:
  void* stage(size_t bytes);  // the device staging buffer, grown to at least `bytes`
  void check_usable(const char* op) const;
  void enqueue(int result, const char* op);  // NCCL's return of an enqueue: aborts on failure

  const NcclLibrary& nccl_;
  int world_ = 1, rank_ = 0, device_ = 0;
  void* comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  void* staging_ = nullptr;
  size_t staging_bytes_ = 0;
  std::string broken_;  // non-empty: aborted, and why
};

}  // namespace sf::dist
