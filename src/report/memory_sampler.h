// Memory over a run, sampled once per step: the process's resident set (VmRSS, and VmHWM, its
// high-water mark, from one read of /proc/self/status) and the backend's device bytes, which
// the caller passes in (report sees no backend). Also what the samples say: growth after a
// step (flat memory: a leak shows as growth that never stops), and a one-line summary against
// the plan's byte counts.
//
// The CSV (optional) is overwritten when the sampler opens: a header, then one row per
// sample, appended and flushed as it is taken, so a run cut short leaves its samples.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

namespace sf {

struct MemorySample {
  int64_t step = 0;           // 0: before the engine was built (the baseline)
  size_t rss_bytes = 0;       // resident now
  size_t peak_rss_bytes = 0;  // resident at most, since the process started
  size_t gpu_bytes = 0;       // the backend's own allocations now (host backend: host memory)
  size_t gpu_used_bytes = 0;  // the device's bytes in use as its driver counts them (host: 0)
};

// The plan's totals the samples are held against. unified: the backend's "device" is host
// memory (the host backend), so the resident set holds both.
struct MemoryPlan {
  size_t host_bytes = 0, device_bytes = 0;
  bool unified = false;
  size_t rss_bytes() const { return host_bytes + (unified ? device_bytes : 0); }
};

// The most any sample after `step` exceeds the sample of `step` (0 when none does), for the
// resident set and the backend's bytes, and the step where each maximum was. Error(input)
// when no sample has that step.
struct MemoryGrowth {
  size_t rss_bytes = 0, gpu_bytes = 0;
  int64_t rss_step = -1, gpu_step = -1;  // -1: no growth
};
MemoryGrowth memory_growth_after(std::span<const MemorySample> samples, int64_t step);

class MemorySampler {
 public:
  // The CSV's header, in column order.
  static const char* csv_header();

  // Takes the baseline sample (step 0, device bytes 0: nothing is built yet). csv empty: no
  // file; else Error(io) naming it when it cannot be written.
  explicit MemorySampler(const MemoryPlan& plan, const std::filesystem::path& csv = {});

  // One /proc read; appends the sample (and its CSV row) and returns it.
  const MemorySample& sample(int64_t step, size_t gpu_bytes, size_t gpu_used_bytes);

  const std::vector<MemorySample>& samples() const { return samples_; }
  const MemoryPlan& plan() const { return plan_; }

  // "memory: peak RSS X GiB (plan Y, Z before the engine), peak GPU Z GiB (plan W), growth
  // after step K: R MiB RSS, G MiB GPU". peak_gpu_bytes: the backend's own peak counter (it
  // sees peaks inside a step that no sample does). Growth is left out when no sample follows
  // step K.
  std::string summary_line(size_t peak_gpu_bytes, int64_t after_step) const;

 private:
  void write_row(const MemorySample& s);

  MemoryPlan plan_;
  std::vector<MemorySample> samples_;
  std::filesystem::path csv_file_;
  std::ofstream csv_;
};

}  // namespace sf
