#include "engine/step_timer.h"

#include <algorithm>

#include "core/stopwatch.h"

namespace sf {

StepTimer::StepTimer(Backend& be, Stream& compute, int max_ops) : compute_(compute) {
  for (int i = 0; i < max_ops; ++i) {
    auto a = be.create_timing_event(), b = be.create_timing_event();
    if (!a || !b) break;
    start_.push_back(std::move(a));
    end_.push_back(std::move(b));
  }
  if (!start_.empty()) step_end_ = be.create_timing_event();
}

void StepTimer::start_run() {
  used_ = 0;
  first_bwd_ = -1;
  phase_[0] = phase_[1] = 0;
  t0_ = std::chrono::steady_clock::now();
}

int StepTimer::begin(bool backward) {
  if (backward && first_bwd_ < 0) first_bwd_ = used_;
  if (used_ >= int(start_.size())) return -1;
  start_[size_t(used_)]->record(compute_);
  return used_++;
}

void StepTimer::end(int t) {
  if (t >= 0) end_[size_t(t)]->record(compute_);
}

void StepTimer::forward_done() {
  const auto t1 = std::chrono::steady_clock::now();
  phase_[0] = std::chrono::duration<double>(t1 - t0_).count();
  t0_ = t1;
}

void StepTimer::run_done() { (phase_[0] == 0 ? phase_[0] : phase_[1]) = seconds_since(t0_); }

void StepTimer::report(StepStats& st) {
  if (used_ == 0) return;
  const int n = used_, first_bwd = first_bwd_ < 0 ? n : first_bwd_;
  double busy_f = 0, busy_b = 0;
  for (int i = 0; i < n; ++i) {
    const double d = end_[size_t(i)]->seconds_since(*start_[size_t(i)]);
    if (d < 0) return;  // the backend cannot time
    (i < first_bwd ? busy_f : busy_b) += d;
  }
  st.gpu_busy_seconds = busy_f + busy_b;
  auto span = [](Event& to, Event& from) { return std::max(0.0, to.seconds_since(from)); };
  if (first_bwd > 0)
    st.gpu_idle_forward_seconds = std::max(0.0, span(*end_[size_t(first_bwd - 1)], *start_[0]) - busy_f);
  if (first_bwd < n)
    st.gpu_idle_backward_seconds =
        std::max(0.0, span(*end_[size_t(n - 1)], *start_[size_t(first_bwd)]) - busy_b);
  // The boundary: this run's end (marked by the previous call) to its first compute op, plus
  // the previous run's tail after its last compute op.
  if (step_end_recorded_) st.gpu_idle_before_seconds = tail_prev_ + span(*start_[0], *step_end_);
  step_end_->record(compute_);  // now: the next step measures from here
  compute_.synchronize();
  tail_prev_ = span(*step_end_, *end_[size_t(n - 1)]);
  step_end_recorded_ = true;
}

}  // namespace sf
