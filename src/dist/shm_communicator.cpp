// ShmCommunicator (shm_communicator.h): the region's layout, the rendezvous, and each
// collective as pieces of at most `capacity` bytes per rank.
//
// Layout: [Header][one Post per rank, 64 bytes each][one slot per rank, capacity bytes each].
#include "dist/shm_communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "core/error.h"

namespace sf::dist {

namespace {

constexpr uint64_t kMagic = 0x73665f73686d636dull;  // "sf_shmcm"
constexpr size_t kHeaderBytes = 1024, kPostBytes = 64;

size_t align64(size_t x) { return (x + 63) / 64 * 64; }

struct Post {
  std::atomic<uint64_t> phase;
  uint64_t op;     // a hash of the call's name
  uint64_t count;  // what the call is defined by (elements; broadcast: bytes and root)
};
static_assert(sizeof(Post) <= kPostBytes && std::atomic<uint64_t>::is_always_lock_free);

uint64_t op_hash(const char* op) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (; *op; ++op) h = (h ^ uint64_t(uint8_t(*op))) * 1099511628211ull;
  return h;
}

}  // namespace

struct ShmCommunicator::Header {
  uint64_t magic;
  int32_t world;
  uint64_t capacity;
  std::atomic<int32_t> claimed;  // a rank is writing the failure
  std::atomic<int32_t> failed;   // 1: `why` holds the group's failure
  char why[768];
};

size_t ShmCommunicator::region_bytes(int world, size_t capacity) {
  static_assert(sizeof(Header) <= kHeaderBytes, "the header outgrew its room");
  return kHeaderBytes + align64(size_t(world) * kPostBytes) + size_t(world) * align64(capacity);
}

void ShmCommunicator::init(void* region, int world, size_t capacity) {
  SF_REQUIRE(world >= 1 && capacity >= 64, "ShmCommunicator: world ", world, ", capacity ", capacity);
  auto* h = new (region) Header{};
  h->world = world;
  h->capacity = align64(capacity);
  char* posts = static_cast<char*>(region) + kHeaderBytes;
  for (int r = 0; r < world; ++r) new (posts + size_t(r) * kPostBytes) Post{};
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
}

ShmCommunicator::ShmCommunicator(SharedRegion region, int rank, int world, Timeout timeout)
    : Communicator(timeout), region_(std::move(region)), rank_(rank), world_(world) {
  SF_REQUIRE(rank >= 0 && rank < world, "ShmCommunicator: rank ", rank, " of world ", world);
  const Header& h = header();
  SF_REQUIRE(h.magic == kMagic && h.world == world, "ShmCommunicator: the region ", region_.name(),
             " was not made for a group of ", world, " ranks (stale name from another run?)");
  capacity_ = h.capacity;
  SF_REQUIRE(region_.size() >= region_bytes(world, capacity_), "ShmCommunicator: the region ",
             region_.name(), " is smaller than its header says");
}

ShmCommunicator::~ShmCommunicator() = default;

ShmCommunicator::Header& ShmCommunicator::header() const { return *static_cast<Header*>(region_.data()); }

std::byte* ShmCommunicator::slot(int r) const {
  return static_cast<std::byte*>(region_.data()) + kHeaderBytes + align64(size_t(world_) * kPostBytes) +
         size_t(r) * capacity_;
}

namespace {
Post& post_of(void* region, int r) {
  return *reinterpret_cast<Post*>(static_cast<char*>(region) + kHeaderBytes + size_t(r) * kPostBytes);
}
}  // namespace

void ShmCommunicator::abort(const std::string& why) noexcept {
  Header& h = header();
  int32_t none = 0;
  if (!h.claimed.compare_exchange_strong(none, 1, std::memory_order_acq_rel)) return;
  std::string msg;
  try {
    msg = cat("rank ", rank_, " aborted the group: ", why);
  } catch (...) {
    msg = "a rank aborted the group";
  }
  const size_t n = std::min(msg.size(), sizeof(h.why) - 1);
  std::memcpy(h.why, msg.data(), n);
  h.why[n] = 0;
  h.failed.store(1, std::memory_order_release);
}

void ShmCommunicator::refuse(const std::string& why) {
  abort(why);
  throw Error(ErrorKind::internal, cat("rank ", rank_, ": ", why));
}

// Polls: a short spin first (the other ranks are usually close), then 0.1 ms sleeps.
void ShmCommunicator::wait_phase(uint64_t phase, const char* op) {
  Header& h = header();
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    if (h.failed.load(std::memory_order_acquire)) SF_FAIL(io, op, ": ", std::string(h.why));
    bool all = true;
    for (int r = 0; r < world_ && all; ++r) all = post_of(region_.data(), r).phase.load(std::memory_order_acquire) >= phase;
    if (all) return;
    if (std::chrono::steady_clock::now() - start > timeout()) {
      std::string missing;
      for (int r = 0; r < world_; ++r)
        if (post_of(region_.data(), r).phase.load(std::memory_order_acquire) < phase)
          missing += cat(missing.empty() ? "" : ", ", r);
      const std::string why = cat(op, ": rank(s) ", missing, " did not arrive within ", timeout().count() / 1000.0,
                                  " s (a rank hangs or died; raise the timeout if it is only slow)");
      abort(why);
      SF_FAIL(io, "rank ", rank_, ": ", why);
    }
    if (polls < 2000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

void ShmCommunicator::arrive(const char* op, size_t count) {
  Post& me = post_of(region_.data(), rank_);
  me.op = op_hash(op);
  me.count = count;
  me.phase.store(++phase_, std::memory_order_release);
  wait_phase(phase_, op);
  for (int r = 0; r < world_; ++r) {
    const Post& p = post_of(region_.data(), r);
    if (p.op != me.op || p.count != count)
      refuse(cat(op, ": rank ", r, " made another call or count (", p.count, " against this rank's ", count,
                 "); every rank must make the same collectives in the same order"));
  }
}

void ShmCommunicator::depart(const char* op) {
  post_of(region_.data(), rank_).phase.store(++phase_, std::memory_order_release);
  wait_phase(phase_, op);
}

template <class T>
void ShmCommunicator::all_reduce(std::span<T> data, const char* op) {
  const size_t piece = capacity_ / sizeof(T);
  std::vector<T> sum;
  for (size_t off = 0; off < data.size() || off == 0; off += piece) {
    const size_t len = std::min(piece, data.size() - off);
    std::memcpy(slot(rank_), data.data() + off, len * sizeof(T));
    arrive(op, data.size());
    sum.assign(reinterpret_cast<const T*>(slot(0)), reinterpret_cast<const T*>(slot(0)) + len);
    for (int r = 1; r < world_; ++r) {
      const T* s = reinterpret_cast<const T*>(slot(r));
      for (size_t i = 0; i < len; ++i) sum[i] += s[i];
    }
    depart(op);
    std::copy(sum.begin(), sum.end(), data.begin() + ptrdiff_t(off));
    if (data.empty()) break;
  }
}

void ShmCommunicator::all_reduce_sum(std::span<float> data) { all_reduce(data, "all_reduce_sum(f32)"); }
void ShmCommunicator::all_reduce_sum(std::span<double> data) { all_reduce(data, "all_reduce_sum(f64)"); }

// Pieces over the shard index k: each rank's slot holds, for every destination rank q, the
// elements [k, k + len) of q's shard (zeros past its end), q-major.
void ShmCommunicator::reduce_scatter_sum(std::span<const float> send, std::span<float> recv) {
  const char* op = "reduce_scatter_sum";
  const ShardRange mine = shard_range(send.size(), world_, rank_);
  if (recv.size() != mine.size())
    refuse(cat(op, ": recv holds ", recv.size(), " elements, this rank's shard of ", send.size(), " is ",
               mine.size(), " (dist::shard_range)"));
  const size_t largest = shard_range(send.size(), world_, 0).size();
  const size_t piece = std::max<size_t>(1, capacity_ / sizeof(float) / size_t(world_));
  for (size_t k = 0; k < largest || k == 0; k += piece) {
    const size_t len = std::min(piece, largest - k);
    float* out = reinterpret_cast<float*>(slot(rank_));
    for (int q = 0; q < world_; ++q) {
      const ShardRange s = shard_range(send.size(), world_, q);
      for (size_t i = 0; i < len; ++i) out[size_t(q) * piece + i] = k + i < s.size() ? send[s.begin + k + i] : 0.f;
    }
    arrive(op, send.size());
    const size_t n = k < mine.size() ? std::min(len, mine.size() - k) : 0;
    for (size_t i = 0; i < n; ++i) {
      float acc = reinterpret_cast<const float*>(slot(0))[size_t(rank_) * piece + i];
      for (int r = 1; r < world_; ++r) acc += reinterpret_cast<const float*>(slot(r))[size_t(rank_) * piece + i];
      recv[k + i] = acc;
    }
    depart(op);
    if (largest == 0) break;
  }
}

void ShmCommunicator::all_gather(std::span<const float> mine, std::span<float> out) {
  const char* op = "all_gather";
  const ShardRange own = shard_range(out.size(), world_, rank_);
  if (mine.size() != own.size())
    refuse(cat(op, ": this rank brings ", mine.size(), " elements, its shard of ", out.size(), " is ", own.size(),
               " (dist::shard_range)"));
  const size_t largest = shard_range(out.size(), world_, 0).size();
  const size_t piece = capacity_ / sizeof(float);
  for (size_t k = 0; k < largest || k == 0; k += piece) {
    const size_t len = std::min(piece, largest - k);
    const size_t n_me = k < mine.size() ? std::min(len, mine.size() - k) : 0;
    std::memcpy(slot(rank_), mine.data() + std::min(k, mine.size()), n_me * sizeof(float));
    arrive(op, out.size());
    for (int r = 0; r < world_; ++r) {
      const ShardRange s = shard_range(out.size(), world_, r);
      const size_t n = k < s.size() ? std::min(len, s.size() - k) : 0;
      std::memcpy(out.data() + s.begin + k, slot(r), n * sizeof(float));
    }
    depart(op);
    if (largest == 0) break;
  }
}

void ShmCommunicator::broadcast(std::span<std::byte> data, int root) {
  const char* op = "broadcast";
  if (root < 0 || root >= world_) refuse(cat(op, ": root ", root, " is not a rank of ", world_));
  for (size_t off = 0; off < data.size() || off == 0; off += capacity_) {
    const size_t len = std::min(capacity_, data.size() - off);
    if (rank_ == root) std::memcpy(slot(root), data.data() + off, len);
    arrive(op, data.size() * size_t(world_) + size_t(root));  // a different root is a mismatch too
    if (rank_ != root) std::memcpy(data.data() + off, slot(root), len);
    depart(op);
    if (data.empty()) break;
  }
}

void ShmCommunicator::barrier() {
  arrive("barrier", 0);
  depart("barrier");
}

}  // namespace sf::dist
