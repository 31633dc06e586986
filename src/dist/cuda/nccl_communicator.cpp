// NCCL collectives with timeouts (contract in nccl_communicator.h).
#include "dist/cuda/nccl_communicator.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"

namespace sf::dist {

namespace {

using Clock = std::chrono::steady_clock;

void check_cuda(cudaError_t e, int rank, const char* what) {
  if (e != cudaSuccess) SF_FAIL(cuda, "rank ", rank, ": ", what, ": ", cudaGetErrorString(e));
}

// ncclCommInitRank blocks until every rank has joined: it runs on its own thread so that the
// constructor can give up after the timeout. A thread whose waiter gave up aborts the
// communicator should it form later.
struct Formation {
  std::mutex m;
  std::condition_variable cv;
  bool done = false, abandoned = false;
  int result = 0;
  cudaError_t cuda = cudaSuccess;
  void* comm = nullptr;
};

}  // namespace

NcclCommunicator::NcclCommunicator(const NcclLibrary& nccl, const NcclUniqueId& id, int world_size, int rank,
                                   int device, Timeout timeout)
    : Communicator(timeout), nccl_(nccl), world_(world_size), rank_(rank), device_(device) {
  SF_REQUIRE(world_size >= 1 && rank >= 0 && rank < world_size, "NCCL communicator: rank ", rank,
             " outside WORLD_SIZE=", world_size);
  auto f = std::make_shared<Formation>();
  std::thread([f, api = nccl.api(), id, world_size, rank, device] {
    const cudaError_t e = cudaSetDevice(device);
    void* comm = nullptr;
    const int r = e == cudaSuccess ? api.comm_init_rank(&comm, world_size, id, rank) : nccl::kSuccess;
    std::lock_guard<std::mutex> lock(f->m);
    if (f->abandoned && comm != nullptr) api.comm_abort(comm);
    f->done = true;
    f->result = r;
    f->cuda = e;
    f->comm = comm;
    f->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(f->m);
  if (!f->cv.wait_for(lock, timeout, [&] { return f->done; })) {
    f->abandoned = true;
    SF_FAIL(io, "rank ", rank, ": the NCCL communicator of ", world_size, " ranks did not form within ",
            timeout.count(), " ms: a rank is missing or cannot reach this one (NCCL cannot tell which; the "
            "other ranks' errors and the launcher name it; NCCL_DEBUG=INFO shows the attempts). This process "
            "must exit: NCCL's blocked formation cannot be cancelled");
  }
  check_cuda(f->cuda, rank, cat("cudaSetDevice(", device, ") (LOCAL_RANK names the GPU)").c_str());
  nccl_.check(f->result, cat("rank ", rank, ": ncclCommInitRank of ", world_size, " ranks").c_str());
  comm_ = f->comm;
  lock.unlock();
  check_cuda(cudaSetDevice(device_), rank_, "cudaSetDevice");
  check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), rank_, "cudaStreamCreate");
}

NcclCommunicator::~NcclCommunicator() {
  cudaSetDevice(device_);
  if (comm_ != nullptr) {
    // A broken group's peers may never finish: abort rather than wait for them.
    if (broken_.empty() && cudaStreamSynchronize(stream_) == cudaSuccess) nccl_.api().comm_destroy(comm_);
    else nccl_.api().comm_abort(comm_);
  }
  if (staging_ != nullptr) cudaFree(staging_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

void NcclCommunicator::abort(const std::string& why) noexcept {
  if (comm_ == nullptr) return;
  try {
    broken_ = cat("rank ", rank_, " aborted the NCCL communicator: ", why);
  } catch (...) {
    broken_ = "aborted";
  }
  nccl_.api().comm_abort(comm_);
  comm_ = nullptr;
}

void NcclCommunicator::check_usable(const char* op) const {
  if (comm_ == nullptr)
    SF_FAIL(io, "rank ", rank_, ": ", op, " on a broken NCCL communicator: ", broken_.empty() ? "aborted" : broken_);
}

void NcclCommunicator::enqueue(int result, const char* op) {
  if (result == nccl::kSuccess) return;
  const std::string what = cat("rank ", rank_, ": ", op);
  abort(what + " failed to enqueue");
  nccl_.check(result, what.c_str());
}

void* NcclCommunicator::stage(size_t bytes) {
  if (bytes > staging_bytes_) {
    check_cuda(cudaStreamSynchronize(stream_), rank_, "cudaStreamSynchronize");
    if (staging_ != nullptr) cudaFree(staging_);
    staging_ = nullptr;
    staging_bytes_ = 0;
    check_cuda(cudaMalloc(&staging_, bytes), rank_, cat("cudaMalloc of ", bytes, " staging bytes").c_str());
    staging_bytes_ = bytes;
  }
  return staging_;
}

void NcclCommunicator::wait(cudaStream_t stream, const char* op) {
  check_usable(op);
  const auto deadline = Clock::now() + timeout();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(stream);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) check_cuda(e, rank_, op);
    int async = nccl::kSuccess;
    nccl_.api().comm_get_async_error(comm_, &async);
    if (async != nccl::kSuccess && async != nccl::kInProgress) {
      const std::string what = cat("rank ", rank_, ": ", op);
      abort(what + " hit an NCCL error");
      nccl_.check(async, what.c_str());
    }
    if (Clock::now() >= deadline) {
      abort(cat(op, " timed out"));
      SF_FAIL(io, "rank ", rank_, ": ", op, " did not complete within ", timeout().count(), " ms: a rank did not "
              "arrive or a link hangs (NCCL cannot tell which rank; the other ranks' errors and the launcher "
              "name it); the communicator is aborted");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void NcclCommunicator::all_reduce_sum_device(float* data, size_t n, cudaStream_t stream) {
  check_usable("all_reduce_sum(f32)");
  enqueue(nccl_.api().all_reduce(data, data, n, nccl::kFloat32, nccl::kSum, comm_, stream), "ncclAllReduce(f32)");
}

void NcclCommunicator::reduce_scatter_sum_device(const float* send, float* recv, size_t shard, cudaStream_t stream) {
  check_usable("reduce_scatter_sum(f32)");
  enqueue(nccl_.api().reduce_scatter(send, recv, shard, nccl::kFloat32, nccl::kSum, comm_, stream),
          "ncclReduceScatter(f32)");
}

namespace {
template <class T>
constexpr int nccl_type() {
  return sizeof(T) == 8 ? nccl::kFloat64 : nccl::kFloat32;
}
}  // namespace

void NcclCommunicator::all_reduce_sum(std::span<float> data) {
  check_usable("all_reduce_sum(f32)");
  const size_t bytes = data.size_bytes();
  void* d = stage(bytes);
  check_cuda(cudaMemcpyAsync(d, data.data(), bytes, cudaMemcpyHostToDevice, stream_), rank_, "all_reduce h2d");
  enqueue(nccl_.api().all_reduce(d, d, data.size(), nccl_type<float>(), nccl::kSum, comm_, stream_), "ncclAllReduce(f32)");
  check_cuda(cudaMemcpyAsync(data.data(), d, bytes, cudaMemcpyDeviceToHost, stream_), rank_, "all_reduce d2h");
  wait(stream_, "all_reduce_sum(f32)");
}

void NcclCommunicator::all_reduce_sum(std::span<double> data) {
  check_usable("all_reduce_sum(f64)");
  const size_t bytes = data.size_bytes();
  void* d = stage(bytes);
  check_cuda(cudaMemcpyAsync(d, data.data(), bytes, cudaMemcpyHostToDevice, stream_), rank_, "all_reduce h2d");
  enqueue(nccl_.api().all_reduce(d, d, data.size(), nccl_type<double>(), nccl::kSum, comm_, stream_), "ncclAllReduce(f64)");
  check_cuda(cudaMemcpyAsync(data.data(), d, bytes, cudaMemcpyDeviceToHost, stream_), rank_, "all_reduce d2h");
  wait(stream_, "all_reduce_sum(f64)");
}

// NCCL's shards are equal: world x shard elements, shard = shard_range's (ceil(n / world)), the
// tail zero-padded on the device; each rank returns only its shard_range part.
void NcclCommunicator::reduce_scatter_sum(std::span<const float> send, std::span<float> recv) {
  const char* op = "reduce_scatter_sum(f32)";
  check_usable(op);
  const size_t n = send.size(), shard = (n + size_t(world_) - 1) / size_t(world_);
  const ShardRange mine = shard_range(n, world_, rank_);
  SF_CHECK(recv.size() == mine.size(), op, ": recv holds ", recv.size(), " elements, this rank's shard of ", n,
           " is ", mine.size());
  if (shard == 0) return;
  auto* d = static_cast<float*>(stage((size_t(world_) + 1) * shard * sizeof(float)));
  float* out = d + size_t(world_) * shard;
  check_cuda(cudaMemsetAsync(d, 0, size_t(world_) * shard * sizeof(float), stream_), rank_, "reduce_scatter pad");
  check_cuda(cudaMemcpyAsync(d, send.data(), send.size_bytes(), cudaMemcpyHostToDevice, stream_), rank_, "reduce_scatter h2d");
  enqueue(nccl_.api().reduce_scatter(d, out, shard, nccl::kFloat32, nccl::kSum, comm_, stream_), "ncclReduceScatter(f32)");
  if (!recv.empty())
    check_cuda(cudaMemcpyAsync(recv.data(), out, recv.size_bytes(), cudaMemcpyDeviceToHost, stream_), rank_,
               "reduce_scatter d2h");
  wait(stream_, op);
}

void NcclCommunicator::all_gather(std::span<const float> mine, std::span<float> out) {
  const char* op = "all_gather(f32)";
  check_usable(op);
  const size_t n = out.size(), shard = (n + size_t(world_) - 1) / size_t(world_);
  SF_CHECK(mine.size() == shard_range(n, world_, rank_).size(), op, ": this rank brings ", mine.size(),
           " elements, its shard of ", n, " is ", shard_range(n, world_, rank_).size());
  if (shard == 0) return;
  auto* d = static_cast<float*>(stage((size_t(world_) + 1) * shard * sizeof(float)));
  float* in = d + size_t(world_) * shard;
  check_cuda(cudaMemsetAsync(in, 0, shard * sizeof(float), stream_), rank_, "all_gather pad");
  if (!mine.empty())
    check_cuda(cudaMemcpyAsync(in, mine.data(), mine.size_bytes(), cudaMemcpyHostToDevice, stream_), rank_, "all_gather h2d");
  enqueue(nccl_.api().all_gather(in, d, shard, nccl::kFloat32, comm_, stream_), "ncclAllGather(f32)");
  check_cuda(cudaMemcpyAsync(out.data(), d, out.size_bytes(), cudaMemcpyDeviceToHost, stream_), rank_, "all_gather d2h");
  wait(stream_, op);
}

void NcclCommunicator::broadcast(std::span<std::byte> data, int root) {
  const char* op = "broadcast";
  check_usable(op);
  SF_CHECK(root >= 0 && root < world_, op, ": root ", root, " outside the world of ", world_);
  if (data.empty()) return;
  void* d = stage(data.size());
  check_cuda(cudaMemcpyAsync(d, data.data(), data.size(), cudaMemcpyHostToDevice, stream_), rank_, "broadcast h2d");
  enqueue(nccl_.api().broadcast(d, d, data.size(), nccl::kUint8, root, comm_, stream_), "ncclBroadcast");
  check_cuda(cudaMemcpyAsync(data.data(), d, data.size(), cudaMemcpyDeviceToHost, stream_), rank_, "broadcast d2h");
  wait(stream_, op);
}

void NcclCommunicator::barrier() {
  // NCCL has no barrier: a one-element all-reduce completes only once every rank took part.
  float one = 1.0f;
  all_reduce_sum(std::span<float>(&one, 1));
}

}  // namespace sf::dist
