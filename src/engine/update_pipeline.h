// The update thread: one persistent thread that runs the optimizer's work in the order it
// is posted. A round runs update(u) for every unit in a given order and lets the next step
// wait for exactly the unit it needs: layer k of step t+1 starts as soon as update k of step
// t is done, so the CPU optimizer overlaps the next forward. Other work (the speculative
// update's phase A) is posted as a job behind the round before it.
#pragma once
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace sf {

class UpdatePipeline {
 public:
  UpdatePipeline();
  ~UpdatePipeline();  // after the posted work is done
  UpdatePipeline(const UpdatePipeline&) = delete;
  UpdatePipeline& operator=(const UpdatePipeline&) = delete;

  // Starts update(u) for u in `order`, then after() (when given): work that no wait(u) waits
  // for but wait_all() does (a compact state's commits). Any previous round must have been
  // waited for.
  void start(std::vector<int> order, std::function<void(int)> update, std::function<void()> after = {});
  // Runs job on the update thread after what was posted before it. The job reports its own
  // errors (they do not reach wait()).
  void post(std::function<void()> job);
  // Blocks until update(unit) of the current round is done (returns at once when idle).
  // Rethrows an exception thrown by any update.
  void wait(int unit);
  void wait_all();  // the current round is finished; rethrows its error
  // Seconds callers spent blocked in wait() since the last call; the last round's duration.
  double take_wait_seconds();
  double last_round_seconds() const { return round_seconds_; }

 private:
  void loop();
  void run_round(const std::vector<int>& order, const std::function<void(int)>& update,
                 const std::function<void()>& after);

  std::mutex mu_;
  std::condition_variable cv_;       // round progress (done_, finished_)
  std::condition_variable work_cv_;  // new work or stop
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::vector<char> done_;  // indexed by unit
  bool finished_ = true;
  std::exception_ptr error_;
  double wait_seconds_ = 0, round_seconds_ = 0;
  std::thread thread_;  // last: starts once the rest is constructed
};

}  // namespace sf
