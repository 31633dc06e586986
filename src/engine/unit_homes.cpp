#include "engine/unit_homes.h"

#include <algorithm>

#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/data_parallel.h"  // kSliceAlign, the ranks' slices

namespace sf {

namespace {
const char* state_name(HomeState s) {
  switch (s) {
    case HomeState::weights: return "weights";
    case HomeState::gradient: return "its gradient";
    case HomeState::updating: return "an update in progress";
  }
  return "?";
}
}  // namespace

UnitHomes::UnitHomes(WindowContext& w) : w_(w) {
  const int n = w.n_units(), L = w.layout.n_layers;
  on_device_.assign(size_t(n), 0);
  for (int k = L - w.ec.resident_layers; k < L; ++k) on_device_[size_t(k + 1)] = 1;
  for (int k = 0; k < w.ec.device_adamw_layers; ++k) on_device_[size_t(k + 1)] = 1;
  on_device_[size_t(n - 1)] = w.ec.head_resident;
  shared_.assign(size_t(n), 0);
  for (int u = 0; u < n; ++u) {
    home_.push_back(w.bufs.find(BufferRole::home, u));
    next_.push_back(w.bufs.find(BufferRole::next_weights, u));
    shared_[size_t(u)] = w.bufs.shared(BufferRole::home, u);
  }
  upload_pending_.assign(size_t(n), 0);
  state_ = std::make_unique<std::atomic<uint8_t>[]>(size_t(n));
  for (int u = 0; u < n; ++u) state_[size_t(u)] = uint8_t(HomeState::weights);
  if (w.ec.from_master())
    ring_ = std::make_unique<GradientRing>(
        std::vector<Buffer*>{&w.bufs.at(BufferRole::grad_ring, 0), &w.bufs.at(BufferRole::grad_ring, 1)});
}

bool UnitHomes::any_shared() const {
  return std::any_of(shared_.begin(), shared_.end(), [](char c) { return c != 0; });
}

void UnitHomes::share_with_ranks(int rank, int world) {
  rank_ = rank;
  world_ = world;
}

const void* UnitHomes::host_weights(int u) const {
  if (!w_.reduced()) return w_.f32_weights(u);
  SF_CHECK(!(u > 0 && resident(u)), "resident unit ", u, " has no host weights");
  SF_CHECK(!from_master(u), "unit ", u, " streams from the fp32 master: it has no compute-dtype copy");
  return home_[size_t(u)]->data();
}

int64_t UnitHomes::max_resident_numel() const {
  int64_t m = 0;
  for (int u = 1; u < w_.n_units(); ++u)
    if (resident(u)) m = std::max(m, w_.layout.units[size_t(u)].numel);
  return m;
}

HomeState UnitHomes::state(int u) const {
  return HomeState(state_[size_t(u)].load(std::memory_order_acquire));
}

void UnitHomes::expect(int u, HomeState s, const char* by) const {
  const HomeState now = state(u);
  SF_CHECK(now == s, by, ": the home of unit ", u, " holds ", state_name(now), ", expected ", state_name(s));
}

void UnitHomes::set(int u, HomeState from, HomeState to, const char* by) {
  expect(u, from, by);
  state_[size_t(u)].store(uint8_t(to), std::memory_order_release);
}

void UnitHomes::take_next(int u) {
  if (!w_.reduced()) return;
  if (resident(u)) {
    // The next forward copies `next` home when it loads the unit; `next` is rewritten only
    // after this unit's next backward.
    upload_pending_[size_t(u)] = 1;
  } else {
    std::swap(home_[size_t(u)], next_[size_t(u)]);
  }
}

// A resident unit's speculated weights wait in `next` until the forward loads the unit: the
// copy goes on h2d in forward order, one layer ahead, instead of all units' copies queueing
// at the step boundary ahead of the embedding and the first layer.
void UnitHomes::upload_next(int u) {
  if (!upload_pending_[size_t(u)]) return;
  w_.be.copy_to_device(*w_.streams.h2d, home_[size_t(u)]->data(), next_[size_t(u)]->data(),
                       size_t(w_.store.numel(u)) * dtype_size(w_.cd));
  upload_pending_[size_t(u)] = 0;
}

void UnitHomes::refresh(DeviceAdamWHomes device_homes) {
  const bool with_device_units = device_homes == DeviceAdamWHomes::refresh;
  std::fill(upload_pending_.begin(), upload_pending_.end(), 0);  // the master is the truth now
  // A skipped step leaves device-AdamW layers' weights as they were too.
  for (int u = 0; u < w_.n_units(); ++u)
    state_[size_t(u)].store(uint8_t(HomeState::weights), std::memory_order_release);
  if (!w_.reduced()) {  // weights load straight from the master, or its decoded mirror
    for (int u = 0; u < w_.n_units(); ++u) {
      w_.follow_master(u, 0, w_.store.numel(u));
      w_.store.settle_mapping(u);
    }
    // A device-AdamW layer over a bf16 master reads its weights from its home.
    for (int u = 1; u < w_.n_units() && w_.ec.bf16_master() && with_device_units; ++u)
      if (w_.ec.device_adamw(u))
        w_.be.copy_to_device(*w_.streams.h2d, home_[size_t(u)]->data(), w_.f32_weights(u),
                             size_t(w_.store.numel(u)) * 4);
    w_.streams.h2d->synchronize();
    return;
  }
  const size_t es = dtype_size(w_.cd);
  std::vector<char> tmp;
  for (int u = 0; u < w_.n_units(); ++u) {
    if (!home_[size_t(u)] || (w_.ec.device_adamw(u) && !with_device_units)) continue;
    const size_t n = size_t(w_.store.numel(u));
    void* dst = home_[size_t(u)]->data();
    if (u > 0 && resident(u)) {
      tmp.resize(n * es);
      dst = tmp.data();
    }
    // A shared home: this rank's slice (the others write theirs).
    const dist::ShardRange part = shared(u) ? dist::shard_range(n, world_, rank_, kSliceAlign) : dist::ShardRange{0, n};
    host_pool().parallel_for(int64_t(part.size()), [&](int64_t b, int64_t e) {
      b += int64_t(part.begin);
      e += int64_t(part.begin);
      w_.master_to_compute(u, static_cast<char*>(dst) + size_t(b) * es, b, e);
    }, 1 << 16);
    w_.store.settle_mapping(u);  // a master on disk was read through the mapping: not RSS now
    if (u > 0 && resident(u)) {
      w_.be.copy_to_device(*w_.streams.h2d, home_[size_t(u)]->data(), tmp.data(), tmp.size());
      w_.streams.h2d->synchronize();
    }
  }
}

}  // namespace sf
