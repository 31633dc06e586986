// Data parallel in the engine (docs/MULTI_GPU.md): N ranks, each running its own executor over
// its share of every global batch, sharing ONE host training state. What a rank needs beyond
// the one-rank engine lives here:
//
// - DataParallel: the executor's description of the run (absent = one rank, today's path):
//   the Communicator, the state memory every rank's ParamStore is carved from, and the
//   UpdateCounters the ranks share;
// - UpdateCounters: per unit and rank, the last update round whose slice that rank has
//   written; a rank reads a unit's weights only once every rank's slice of the last round is
//   in (the per-unit "all slices updated" wait). It lives in memory the ranks share (the
//   process heap for ranks as threads, a SharedRegion for processes), so it is made of
//   lock-free atomics only, and it carries the first failure, so that a rank that throws stops
//   the others' waits at once;
// - ShardedUpdate: one rank's part of a step's update. Each unit's f32 gradient of this rank
//   is padded (zeros) to N equal 64-aligned shards and reduce-scattered (sum, rank order), so
//   this rank keeps slice r = dist::shard_range(P, N, r, 64) of the summed gradient; the global
//   norm is the f64 sum over ranks (rank order) of each rank's slices' sums of squares; the
//   rank's AdamW updates its slice of master, m and v in place. The embedding's gradient is
//   sparse per rank (its tokens' rows): it is spread into the padded dense [V, C] buffer and
//   reduced like any unit (exact; 4 B x V x C of traffic per step, fine on the host backend,
//   the sparse gather of MULTI_GPU.md is for the GPU path).
//
// Every collective here is called by every rank in the same order (unit order is the
// schedule's, the same everywhere). Errors: a timeout or another rank's failure is an Error
// (io) naming the rank and the wait.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dist/communicator.h"
#include "dist/shared_memory.h"
#include "engine/window_buffers.h"
#include "optim/adamw_step.h"
#include "optim/param_store.h"

namespace sf {

class ThreadPool;

// The 64-element alignment of the slices: whole SIMD vectors and cache lines for the AdamW.
constexpr size_t kSliceAlign = 64;

class UpdateCounters {
 public:
  static size_t bytes_for(int n_units, int world);
  // Placement in `mem` (bytes_for bytes, 8-byte aligned): create() by one rank before the
  // others attach() (which checks the shape).
  static UpdateCounters* create(void* mem, int n_units, int world);
  static UpdateCounters* attach(void* mem, int n_units, int world);

  // Rank `rank` has written its slice of unit u for update round `round` (release).
  void slice_done(int u, int rank, int64_t round);
  // Until every rank's slice of unit u for `round` is in (acquire). Throws Error(io) when a
  // rank failed (naming it) or after `timeout` (naming the ranks behind).
  void wait(int u, int64_t round, dist::Timeout timeout) const;
  // Records rank's failure and its message (the first one wins; the message cut to what the
  // header holds), so that every waiter stops and says why.
  void fail(int rank, const std::string& why) noexcept;
  int failed_rank() const { return failed_.load(std::memory_order_acquire) - 1; }
  std::string failure() const;  // the failed rank's message ("" while none failed)

 private:
  UpdateCounters(int n_units, int world);
  std::atomic<int64_t>* done() const;  // [n_units][world], after the header

  static constexpr uint64_t kMagic = 0x73665f6470637472ull;  // "sf_dpctr"
  uint64_t magic_;
  int32_t n_units_, world_;
  std::atomic<int32_t> claimed_{0};  // a rank is writing its message
  std::atomic<int32_t> failed_{0};   // rank + 1 of the first failure (its message written), 0 none
  char why_[384] = {};
};
static_assert(std::atomic<int64_t>::is_always_lock_free && std::atomic<int32_t>::is_always_lock_free,
              "UpdateCounters live in memory shared between processes");

class Stream;

struct DataParallel {
  dist::Communicator* comm = nullptr;  // null: one rank (nothing below is used)
  UpdateCounters* counters = nullptr;  // shared by the ranks
  ExternalStateMemory state;           // the one state: ParamStore::external_bytes, zero-filled
  // The GPU path's streamed homes, one copy for the ranks (Tier::host_shared; shared_bytes of
  // the plan's buffer list): every rank's plan must stream the same units.
  SharedHomeMemory homes;
  // The GPU path (a reduced compute dtype, docs/MULTI_GPU.md "Gradients"): enqueues on `stream`
  // the in-place sum reduce-scatter of `data`, world x `shard` f32 on the device, leaving
  // this rank's shard at data + rank x shard (NcclCommunicator::reduce_scatter_sum_device).
  // Unset on the host backend, whose gradients are reduced from their homes.
  std::function<void(float* data, size_t shard, Stream& stream)> device_reduce_scatter;
  bool active() const { return comm != nullptr; }
  int rank() const { return comm ? comm->rank() : 0; }
  int world() const { return comm ? comm->world_size() : 1; }
};

// The ranks' one state and counters in named POSIX shared memory, for ranks that are processes
// (docs/MULTI_GPU.md, "Host state in POSIX shared memory"): collective. Rank 0 creates both
// regions (zero-filled, the whole size committed: a small /dev/shm is an Error naming
// --shm-size and the bytes, before anything is loaded) and the counters in them; after a
// barrier the other ranks open them by name; after a second barrier rank 0 removes the names,
// so nothing is left in /dev/shm after any exit. run_id: the same on every rank (rank 0's,
// through the bootstrap).
class SharedTrainingState {
 public:
  SharedTrainingState(dist::Communicator& comm, const std::string& run_id, const std::vector<StateUnit>& units,
                      StateFormat format);
  DataParallel data_parallel() const;
  // Collective, once the plan is known: the region of the ranks' shared homes (`bytes`, this
  // rank's plan's shared_bytes), made like the state's. Every rank's plan must want the same
  // bytes (the same units streamed): an Error names the ranks' figures otherwise. 0 (f32
  // compute, or every home resident): nothing is mapped.
  void map_homes(size_t bytes);

 private:
  void map_regions(bool creator, const std::string& state_name, size_t state_bytes,
                   const std::string& counters_name, size_t counter_bytes, int n_units, int world);
  dist::Communicator& comm_;
  std::string run_id_;
  std::optional<dist::SharedRegion> state_, counters_, homes_;
  UpdateCounters* view_ = nullptr;
};

// A step's token counts summed over the ranks (exact: integers in double); the counts of this
// rank's share in, the global ones out.
void all_reduce_counts(dist::Communicator& comm, int64_t& n_valid, int64_t& n_tokens);
// sum over ranks of x, added in rank order (every rank gets the same bits).
double sum_over_ranks(dist::Communicator& comm, double x);

class ShardedUpdate {
 public:
  // store: this rank's view of the shared state (units, ranges).
  ShardedUpdate(const DataParallel& dp, ParamStore& store);
  // The host bytes a rank's ShardedUpdate holds for units of these sizes (its slices, the
  // padded send buffer and the shard it receives): for the plan's memory table.
  // device_reduced: the layers and head are reduced on the device (the GPU path), so only the
  // embedding's slice and send buffer are the ShardedUpdate's.
  static size_t host_bytes(const std::vector<int64_t>& numels, int world, bool device_reduced = false);

  const DataParallel& dp() const { return dp_; }
  dist::ShardRange slice(int u) const;
  // Unit u's padded gradient buffer: the caller writes its numel f32 values, the rest is 0.
  float* send_buffer(int u);
  // Collective: reduce-scatters send_buffer(u); this rank keeps its slice of the sum.
  void reduce(int u);
  // The same for a sparse gradient of `rows` (increasing ids) x `cols` f32 values, the rows of
  // a [numel / cols, cols] unit (the embedding).
  void reduce_rows(int u, std::span<const int32_t> rows, const float* grad, int64_t cols);
  // Sum of squares of this rank's slices (unit order, each over its parameter ranges);
  // device_norms (the GPU path): units 1.. take theirs from it (the device's sums of the slices).
  double local_sumsq(ThreadPool* pool, const float* device_norms = nullptr) const;
  // The next update round's number (after a step decided not to skip; every rank agrees).
  int64_t begin_round() { return ++rounds_; }
  // AdamW of this rank's slice of unit u with its reduced gradient (fp32 state), then the
  // counters say so.
  void update(int u, const AdamWStep& s, ThreadPool* pool, int64_t round);
  // This rank's slice of unit u for `round` is written (for updates made outside update()).
  void slice_done(int u, int64_t round) { dp_.counters->slice_done(u, dp_.rank(), round); }
  // Every rank's slice of unit u for `round` is in.
  void wait_round(int u, int64_t round) const { dp_.counters->wait(u, round, dp_.comm->timeout()); }
  // Every rank's slice of unit u (of every unit) of the last round is in.
  void wait(int u) const;
  void wait_all() const;
  // This rank failed with `why`: the group is broken for every rank. Never throws.
  void abort(const std::string& why) noexcept;

 private:
  DataParallel dp_;
  ParamStore& store_;
  std::vector<float> send_, recv_;          // padded whole unit; padded shard
  // Per unit: this rank's slice of the summed gradient (allocated by its first reduce).
  std::vector<std::vector<float>> slices_;
  int64_t rounds_ = 0;
};

}  // namespace sf
