// Wall-clock timing helpers (host steady clock) for the engine's step statistics.
#pragma once
#include <chrono>

namespace sf {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Adds the seconds of its scope to `sum` when it ends, whichever way (return, exception).
class ScopedSeconds {
 public:
  explicit ScopedSeconds(double& sum) : sum_(sum), t0_(std::chrono::steady_clock::now()) {}
  ~ScopedSeconds() { sum_ += seconds_since(t0_); }
  ScopedSeconds(const ScopedSeconds&) = delete;
  ScopedSeconds& operator=(const ScopedSeconds&) = delete;

 private:
  double& sum_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace sf

namespace sf {

// Host timeline of the engine's steps, for finding stalls: with SF_TRACE_STEPS=1 in the
// environment, trace_mark() prints "[trace] <ms since the process's first mark> <label>" to
// stderr (any thread); otherwise it costs one branch.
bool trace_enabled();
void trace_mark(const char* label, long long a = -1);

}  // namespace sf
