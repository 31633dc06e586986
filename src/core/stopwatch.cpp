#include "core/stopwatch.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace sf {

bool trace_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("SF_TRACE_STEPS");
    return e && *e && std::strcmp(e, "0") != 0;
  }();
  return on;
}

void trace_mark(const char* label, long long a) {
  if (!trace_enabled()) return;
  static const auto t0 = std::chrono::steady_clock::now();
  const double ms = seconds_since(t0) * 1e3;
  if (a >= 0) std::fprintf(stderr, "[trace] %10.3f %s %lld\n", ms, label, a);
  else std::fprintf(stderr, "[trace] %10.3f %s\n", ms, label);
}

}  // namespace sf
