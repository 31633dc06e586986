#include "backend/profiling_backend.h"

#include <algorithm>

#include "core/error.h"

namespace sf {

void ProfilingBackend::run_op(Stream& s, std::string key, Op op) {
  Pending p{std::move(key), in_.create_timing_event(), in_.create_timing_event()};
  if (p.start) p.start->record(s);
  op(in_, s);
  if (p.end) p.end->record(s);
  pending_.push_back(std::move(p));
}

std::vector<ProfilingBackend::Line> ProfilingBackend::take() {
  for (Pending& p : pending_) {
    Line& l = lines_[p.key];
    l.op = p.key;
    ++l.calls;
    if (p.start && p.end) {
      p.end->synchronize();
      l.seconds += std::max(0.0, p.end->seconds_since(*p.start));
    }
  }
  pending_.clear();
  std::vector<Line> out;
  for (auto& [k, l] : lines_) out.push_back(l);
  lines_.clear();
  std::sort(out.begin(), out.end(), [](const Line& a, const Line& b) { return a.seconds > b.seconds; });
  return out;
}

}  // namespace sf
