// The units' homes (sliding_executor.h): one compute-dtype buffer per layer and the head, in
// device memory (resident) or pinned host memory, holding the unit's weights from its update
// until its backward, then its gradient until the update turns it back into weights in place.
// With a speculative update, a unit may also have a "next" buffer for the weights its early
// update writes while the home still holds the gradient.
//
// What a home holds is explicit (HomeState) and every transition is checked: the forward
// loads only weights, grads_out sends a gradient only over weights, and only the update turns
// a gradient back. With an fp32 compute dtype weights load from the master and "weights" means
// the home's gradient is no longer needed.
#pragma once
#include <atomic>
#include <memory>
#include <vector>

#include "engine/gradient_ring.h"
#include "engine/window_context.h"

namespace sf {

enum class HomeState : uint8_t { weights, gradient, updating };

class UnitHomes {
 public:
  explicit UnitHomes(WindowContext& w);

  bool resident(int u) const { return on_device_[size_t(u)] != 0; }
  // A streamed home the data-parallel ranks of this host share (Tier::host_shared): this rank
  // writes only its slice of it (its gradient's shard, its update, a refresh), every rank
  // reads it whole once every slice is in.
  bool shared(int u) const { return shared_[size_t(u)] != 0; }
  bool any_shared() const;
  // This rank's place among the ranks that share the homes (the slices it writes).
  void share_with_ranks(int rank, int world);
  // A streamed layer with no home (EngineConfig::HostWeights::master): its weights load from
  // the fp32 master, its gradient lands in ring().
  bool from_master(int u) const { return w_.ec.from_master() && u >= 1 && !resident(u); }
  GradientRing& ring() const { return *ring_; }
  Buffer* home(int u) const { return home_[size_t(u)]; }
  Buffer* next(int u) const { return next_[size_t(u)]; }
  // The compute-dtype source of a streamed unit's weight load (the master with fp32 compute).
  const void* host_weights(int u) const;
  int64_t max_resident_numel() const;

  HomeState state(int u) const;
  void expect(int u, HomeState s, const char* by) const;
  void set(int u, HomeState from, HomeState to, const char* by);  // checked transition

  // The update left new weights in `next`: a host home swaps it in, a resident one copies it
  // home when the next forward loads the unit (upload_pending / upload_next).
  void take_next(int u);
  void upload_next(int u);  // on h2d; no-op unless take_next left a copy pending
  // Every home gets the master's compute-dtype weights again (a skipped step, or new state);
  // a shared home only this rank's slice (the caller then waits for the others: a barrier).
  // Device-AdamW layers' homes too when their state comes from the master (new state); a
  // skipped step leaves them as they are (their weights did not change).
  enum class DeviceAdamWHomes : uint8_t { keep, refresh };
  void refresh(DeviceAdamWHomes device_homes);

 private:
  WindowContext& w_;
  std::vector<Buffer*> home_, next_;  // [0]: the tied table's staging (no state)
  std::vector<char> on_device_, shared_;
  int rank_ = 0, world_ = 1;
  // Set by the update thread before the unit is marked done, read and cleared by the thread
  // driving the step after it waited for that unit.
  std::vector<char> upload_pending_;
  std::unique_ptr<std::atomic<uint8_t>[]> state_;
  std::unique_ptr<GradientRing> ring_;
};

}  // namespace sf
