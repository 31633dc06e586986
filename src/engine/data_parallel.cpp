// UpdateCounters, the collectives of a data-parallel step and ShardedUpdate (data_parallel.h).
#include "engine/data_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <new>
#include <thread>

#include "core/error.h"
#include "optim/adamw.h"
#include "optim/grad_norm.h"

namespace sf {

// ---- UpdateCounters -----------------------------------------------------------------------

namespace {
constexpr size_t kHeader = 512;  // the counters start after the header, cache-line aligned
}

UpdateCounters::UpdateCounters(int n_units, int world) : magic_(kMagic), n_units_(n_units), world_(world) {
  for (int64_t i = 0; i < int64_t(n_units) * world; ++i) new (done() + i) std::atomic<int64_t>(0);
}

size_t UpdateCounters::bytes_for(int n_units, int world) {
  static_assert(sizeof(UpdateCounters) <= kHeader, "the header outgrew its room");
  return kHeader + size_t(n_units) * size_t(world) * sizeof(std::atomic<int64_t>);
}

std::atomic<int64_t>* UpdateCounters::done() const {
  return reinterpret_cast<std::atomic<int64_t>*>(reinterpret_cast<char*>(const_cast<UpdateCounters*>(this)) + kHeader);
}

UpdateCounters* UpdateCounters::create(void* mem, int n_units, int world) {
  SF_CHECK(reinterpret_cast<uintptr_t>(mem) % 8 == 0 && n_units > 0 && world > 0, "UpdateCounters::create");
  return new (mem) UpdateCounters(n_units, world);
}

UpdateCounters* UpdateCounters::attach(void* mem, int n_units, int world) {
  auto* c = static_cast<UpdateCounters*>(mem);
  SF_CHECK(c->magic_ == kMagic && c->n_units_ == n_units && c->world_ == world,
           "data parallel: the shared update counters were made for another run (", c->n_units_, " units, ",
           c->world_, " ranks; this one has ", n_units, " and ", world, ")");
  return c;
}

void UpdateCounters::slice_done(int u, int rank, int64_t round) {
  done()[size_t(u) * size_t(world_) + size_t(rank)].store(round, std::memory_order_release);
}

void UpdateCounters::fail(int rank, const std::string& why) noexcept {
  int32_t none = 0;
  if (!claimed_.compare_exchange_strong(none, 1, std::memory_order_acq_rel)) return;
  const size_t n = std::min(why.size(), sizeof(why_) - 1);
  std::memcpy(why_, why.data(), n);
  why_[n] = 0;
  failed_.store(rank + 1, std::memory_order_release);
}

std::string UpdateCounters::failure() const { return failed_rank() >= 0 ? std::string(why_) : std::string(); }

// Polls (the waiters are other processes too, so no condition variable): first spinning
// briefly, then sleeping 0.2 ms; a wait is normally short (the other ranks' AdamW of one unit).
void UpdateCounters::wait(int u, int64_t round, dist::Timeout timeout) const {
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    bool all = true;
    for (int r = 0; r < world_ && all; ++r)
      all = done()[size_t(u) * size_t(world_) + size_t(r)].load(std::memory_order_acquire) >= round;
    if (all) return;
    if (const int f = failed_rank(); f >= 0)
      SF_FAIL(io, "data parallel: rank ", f, " failed while this rank waited for the update of unit ", u,
              " (round ", round, "): ", failure());
    if (std::chrono::steady_clock::now() - start > timeout) {
      std::string behind;
      for (int r = 0; r < world_; ++r)
        if (done()[size_t(u) * size_t(world_) + size_t(r)].load(std::memory_order_acquire) < round)
          behind += cat(behind.empty() ? "" : ", ", r);
      SF_FAIL(io, "data parallel: rank(s) ", behind, " did not update their slice of unit ", u, " (round ", round,
              ") within ", timeout.count() / 1000.0, " s; the rank hangs or died (raise --dist-timeout if it is only slow)");
    }
    if (polls < 1000) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// ---- SharedTrainingState --------------------------------------------------------------------

namespace {
dist::SharedRegion make_or_open(dist::Communicator& comm, const std::string& name, size_t bytes, bool create) {
  if (create) {
    const size_t free = dist::shm_free_bytes();
    SF_REQUIRE(free == 0 || free >= bytes, "data parallel: /dev/shm has ", free >> 20, " MiB free, the shared ",
               "training state needs ", (bytes >> 20) + 1, " MiB; enlarge it (docker run --shm-size, or "
               "mount -o remount,size=... /dev/shm) or train with fewer parameters");
    return dist::SharedRegion::create(name, bytes);
  }
  return dist::SharedRegion::open(name, bytes);
}
}  // namespace

SharedTrainingState::SharedTrainingState(dist::Communicator& comm, const std::string& run_id,
                                         const std::vector<StateUnit>& units, StateFormat format)
    : comm_(comm), run_id_(run_id) {
  const int n_units = int(units.size()), world = comm.world_size();
  const size_t state_bytes = ParamStore::external_bytes(units, format);
  const size_t counter_bytes = UpdateCounters::bytes_for(n_units, world);
  const std::string state_name = dist::shared_region_name(run_id, "state");
  const std::string counters_name = dist::shared_region_name(run_id, "counters");
  const bool creator = comm.rank() == 0;
  try {
    map_regions(creator, state_name, state_bytes, counters_name, counter_bytes, n_units, world);
  } catch (const std::exception& e) {
    comm.abort(cat("rank ", comm.rank(), ": ", e.what()));  // the others would wait in a barrier
    throw;
  }
}

void SharedTrainingState::map_regions(bool creator, const std::string& state_name, size_t state_bytes,
                                      const std::string& counters_name, size_t counter_bytes, int n_units,
                                      int world) {
  dist::Communicator& comm = comm_;
  if (creator) {
    state_.emplace(make_or_open(comm, state_name, state_bytes, true));
    counters_.emplace(make_or_open(comm, counters_name, counter_bytes, true));
    view_ = UpdateCounters::create(counters_->data(), n_units, world);
  }
  comm.barrier();  // the regions exist
  if (!creator) {
    state_.emplace(make_or_open(comm, state_name, state_bytes, false));
    counters_.emplace(make_or_open(comm, counters_name, counter_bytes, false));
    view_ = UpdateCounters::attach(counters_->data(), n_units, world);
  }
  comm.barrier();  // every rank has mapped them
  if (creator) {
    state_->unlink();
    counters_->unlink();
  }
}

void SharedTrainingState::map_homes(size_t bytes) {
  dist::Communicator& comm = comm_;
  const double total = sum_over_ranks(comm, double(bytes));
  SF_REQUIRE(total == double(bytes) * comm.world_size(), "data parallel: the ranks planned different streamed "
             "homes (rank ", comm.rank(), ": ", bytes >> 20, " MiB, the ranks' mean ",
             size_t(total / comm.world_size()) >> 20, " MiB): they share one copy, so every GPU needs the same "
             "plan; give every rank the same --gpu-memory (and GPUs with as much free memory)");
  if (bytes == 0) return;
  const std::string name = dist::shared_region_name(run_id_, "homes");
  const bool creator = comm.rank() == 0;
  try {
    if (creator) homes_.emplace(make_or_open(comm, name, bytes, true));
    comm.barrier();  // the region exists
    if (!creator) homes_.emplace(make_or_open(comm, name, bytes, false));
    comm.barrier();  // every rank has mapped it
    if (creator) homes_->unlink();
  } catch (const std::exception& e) {
    comm.abort(cat("rank ", comm.rank(), ": ", e.what()));
    throw;
  }
}

DataParallel SharedTrainingState::data_parallel() const {
  DataParallel dp;
  dp.comm = &comm_;
  dp.counters = view_;
  dp.state = {state_->data(), state_->size()};
  if (homes_) dp.homes = {homes_->data(), homes_->size()};
  return dp;
}

// ---- collectives ----------------------------------------------------------------------------

// Each rank's value in its own slot of a zero vector: the all-reduce adds zeros to it (exact),
// and the slots are then added in rank order on every rank.
double sum_over_ranks(dist::Communicator& comm, double x) {
  std::vector<double> slots(size_t(comm.world_size()), 0.0);
  slots[size_t(comm.rank())] = x;
  comm.all_reduce_sum(std::span<double>(slots));
  double total = 0;
  for (double v : slots) total += v;
  return total;
}

void all_reduce_counts(dist::Communicator& comm, int64_t& n_valid, int64_t& n_tokens) {
  double c[2] = {double(n_valid), double(n_tokens)};  // < 2^53: exact
  comm.all_reduce_sum(std::span<double>(c, 2));
  n_valid = int64_t(c[0]);
  n_tokens = int64_t(c[1]);
}

// ---- ShardedUpdate --------------------------------------------------------------------------

namespace {
size_t padded_shard(size_t n, int world) {
  const size_t per = (n + size_t(world) - 1) / size_t(world);
  return (per + kSliceAlign - 1) / kSliceAlign * kSliceAlign;
}
}  // namespace

ShardedUpdate::ShardedUpdate(const DataParallel& dp, ParamStore& store) : dp_(dp), store_(store) {
  SF_CHECK(dp.active() && dp.counters, "ShardedUpdate without a communicator and counters");
  slices_.resize(size_t(store.n_units()));
}

size_t ShardedUpdate::host_bytes(const std::vector<int64_t>& numels, int world, bool device_reduced) {
  size_t most = 0, slices = 0;
  for (size_t u = 0; u < (device_reduced ? std::min<size_t>(1, numels.size()) : numels.size()); ++u) {
    const int64_t n = numels[u];
    most = std::max(most, padded_shard(size_t(n), world));
    slices += dist::shard_range(size_t(n), world, 0, kSliceAlign).size();  // rank 0's is the largest
  }
  return 4 * (slices + most * size_t(world) + most);
}

dist::ShardRange ShardedUpdate::slice(int u) const {
  return dist::shard_range(size_t(store_.numel(u)), dp_.world(), dp_.rank(), kSliceAlign);
}

// Grown to the largest unit reduced here (every unit on the host backend, the embedding alone
// on the GPU path).
float* ShardedUpdate::send_buffer(int u) {
  const size_t n = size_t(store_.numel(u)), padded = padded_shard(n, dp_.world()) * size_t(dp_.world());
  if (send_.size() < padded) send_.resize(padded);
  std::fill(send_.begin() + ptrdiff_t(n), send_.begin() + ptrdiff_t(padded), 0.f);
  return send_.data();
}

// The padded buffer's shard r is exactly [r * shard, (r + 1) * shard): shard_range of the
// padded count with align 1 (the communicator's cut) starts where the 64-aligned slice does.
void ShardedUpdate::reduce(int u) {
  const size_t n = size_t(store_.numel(u)), shard = padded_shard(n, dp_.world());
  if (recv_.size() < shard) recv_.resize(shard);
  slices_[size_t(u)].resize(slice(u).size());
  dp_.comm->reduce_scatter_sum(std::span<const float>(send_.data(), shard * size_t(dp_.world())),
                               std::span<float>(recv_.data(), shard));
  std::copy_n(recv_.begin(), slices_[size_t(u)].size(), slices_[size_t(u)].begin());
}

void ShardedUpdate::reduce_rows(int u, std::span<const int32_t> rows, const float* grad, int64_t cols) {
  float* dense = send_buffer(u);
  std::fill(dense, dense + store_.numel(u), 0.f);
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(dense + int64_t(rows[i]) * cols, grad + int64_t(i) * cols, size_t(cols) * 4);
  reduce(u);
}

double ShardedUpdate::local_sumsq(ThreadPool* pool, const float* device_norms) const {
  double total = 0;
  for (int u = 0; u < store_.n_units(); ++u) {
    const dist::ShardRange s = slice(u);
    if (s.size() == 0) continue;
    if (device_norms && u > 0) {
      total += double(device_norms[u]);
      continue;
    }
    SF_CHECK(slices_[size_t(u)].size() == s.size(), "data parallel: unit ", u, "'s gradient was not reduced");
    const std::vector<ParamRange> r = clip_ranges(store_.ranges(u), int64_t(s.begin), int64_t(s.size()));
    total += sum_squares_ranges(slices_[size_t(u)].data(), int64_t(s.size()), r, pool);
  }
  return total;
}

void ShardedUpdate::update(int u, const AdamWStep& s, ThreadPool* pool, int64_t round) {
  const dist::ShardRange sl = slice(u);
  if (sl.size() > 0) {
    SF_CHECK(slices_[size_t(u)].size() == sl.size(), "data parallel: unit ", u, "'s gradient was not reduced");
    const int64_t b = int64_t(sl.begin), n = int64_t(sl.size());
    const std::vector<ParamRange> r = clip_ranges(store_.ranges(u), b, n);
    adamw_update_ranges(store_.master(u) + b, store_.m(u) + b, store_.v(u) + b, slices_[size_t(u)].data(),
                        nullptr, n, r, s, pool);
  }
  dp_.counters->slice_done(u, dp_.rank(), round);
}

void ShardedUpdate::wait(int u) const { dp_.counters->wait(u, rounds_, dp_.comm->timeout()); }

void ShardedUpdate::wait_all() const {
  for (int u = 0; u < store_.n_units(); ++u) wait(u);
}

void ShardedUpdate::abort(const std::string& why) noexcept {
  dp_.counters->fail(dp_.rank(), why);
  dp_.comm->abort(why);
}

}  // namespace sf
