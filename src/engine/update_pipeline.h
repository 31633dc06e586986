// Runs the optimizer update of every unit, in a given order, on a background thread, and
// lets the next step wait for exactly the unit it needs: layer k of step t+1 starts as soon as
// update k of step t is done, so the CPU optimizer overlaps the next forward.
#pragma once
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sf {

class UpdatePipeline {
 public:
  ~UpdatePipeline();
  // Starts update(u) for u in `order`. Any previous round must have been waited for.
  void start(std::vector<int> order, std::function<void(int)> update);
  // Blocks until update(unit) of the current round is done (returns at once when idle).
  // Rethrows an exception thrown by any update.
  void wait(int unit);
  void wait_all();
  bool busy() const { return thread_.joinable(); }
  // Seconds callers spent blocked in wait() since the last call; the last round's duration.
  double take_wait_seconds();
  double last_round_seconds() const { return round_seconds_; }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char> done_;  // indexed by unit
  bool finished_ = true;
  std::exception_ptr error_;
  std::thread thread_;
  double wait_seconds_ = 0, round_seconds_ = 0;
};

}  // namespace sf
