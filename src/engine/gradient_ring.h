// Where a layer's gradient lands on the host when the weights stream from the master
// (EngineConfig::HostWeights::master): a ring of buffers, each holding one unit's gradient
// from its copy home until its update has read it. The thread driving the backward claims
// the next buffer for each unit (blocking until the update of the unit that used it before
// has released it: the backward then runs at the CPU optimizer's pace, which is the bound of
// such a step anyway); the update thread reads and releases it. abort() wakes a waiting
// claimer when the update side failed, so a broken update never hangs the backward.
#pragma once
#include <condition_variable>
#include <mutex>
#include <vector>

#include "backend/backend.h"

namespace sf {

class GradientRing {
 public:
  explicit GradientRing(std::vector<Buffer*> buffers);

  void reset(int n_units);     // a new step: every buffer free, no unit placed
  void* claim(int unit);       // blocks until the next buffer is free; it is unit's until released
  void* of(int unit) const;    // the buffer claimed for unit
  void release(int unit);
  void abort();                // claim() throws from now until reset()

 private:
  std::vector<Buffer*> bufs_;
  std::vector<int> owner_;     // per buffer: the unit holding it, -1 free
  std::vector<int> slot_of_;   // per unit: its buffer, -1 none
  size_t next_ = 0;
  bool aborted_ = false;
  mutable std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace sf
