// The speculative update's state (host_updater.h), shared by the thread driving the step
// (which marks gradients ready and closes the backward) and phase A on the update thread.
#pragma once
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <vector>

#include "optim/adamw_step.h"

namespace sf {

struct SpeculationState {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> ready;       // gradient of the unit is (being) copied home
  std::vector<char> speculated;  // AdamW already applied with coefficient 1
  std::vector<double> sumsq;     // per unit, in double on the host
  std::vector<char> have_sq;     // sumsq[u] is known
  double busy_seconds = 0;       // phase A's time in AdamW (and norms) this step
  std::exception_ptr error;
  AdamWStep step;                // the speculated step (grad_scale 1)
  bool active = false;           // this step speculates
  bool running = false;          // phase A is posted and has not returned
  bool stop = false;             // abandon the loop (a step that threw, or destruction)
  std::atomic<bool> closing{false};  // the backward is over: take no new unit
  // The flag is set under the mutex: set without it, the loop could test its wait predicate
  // (closing still false), miss this notify, and sleep forever.
  void close() {
    {
      std::lock_guard<std::mutex> lk(mu);
      closing = true;
    }
    cv.notify_all();
  }
  void wait_returned() {
    std::unique_lock<std::mutex> lk(mu);
    cv.wait(lk, [&] { return !running; });
  }
};

}  // namespace sf
