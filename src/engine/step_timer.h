// The GPU-busy share of a step: timing events around every compute op on the compute stream,
// split into forward and backward, plus the idle gap between two training steps; and the
// wall-clock split of the host's run into forward+head and backward. No-ops where the backend
// cannot time events, or past the pairs allocated for the planned schedule.
#pragma once
#include <chrono>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "engine/step_executor.h"

namespace sf {

class StepTimer {
 public:
  StepTimer(Backend& be, Stream& compute, int max_ops);
  void start_run();
  int begin(bool backward);  // before a compute op; returns its pair (-1: none)
  void end(int t);
  void forward_done();       // the forward and head are done (compute synchronised)
  void run_done();
  // Busy and idle device time of the last run (finished) into st; then marks its end.
  void report(StepStats& st);
  void forget_step_end() { step_end_recorded_ = false; }  // an evaluation is not idle time
  double forward_seconds() const { return phase_[0]; }
  double backward_seconds() const { return phase_[1]; }

 private:
  Stream& compute_;
  std::vector<std::unique_ptr<Event>> start_, end_;
  std::unique_ptr<Event> step_end_;  // after the last compute op of the previous step
  int used_ = 0, first_bwd_ = -1;
  bool step_end_recorded_ = false;
  double tail_prev_ = 0;  // the previous step from its last compute op to step_end
  std::chrono::steady_clock::time_point t0_;
  double phase_[2] = {0, 0};
};

}  // namespace sf
