// MemorySampler (see memory_sampler.h): per-step samples, their CSV and their summary.
#include "report/memory_sampler.h"

#include <cerrno>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "core/error.h"
#include "core/host_memory.h"

namespace sf {

namespace {

double gib(size_t b) { return double(b) / double(size_t(1) << 30); }
double mib(size_t b) { return double(b) / double(size_t(1) << 20); }

std::string write_error(const std::filesystem::path& file) {
  const int err = errno;
  return cat(file.string(), ": cannot write the memory log (", err ? std::strerror(err) : "stream error",
             "); check that its directory exists and is writable");
}

}  // namespace

MemoryGrowth memory_growth_after(std::span<const MemorySample> samples, int64_t step) {
  const MemorySample* base = nullptr;
  for (const MemorySample& s : samples)
    if (s.step == step) base = &s;
  SF_REQUIRE(base, "memory growth after step ", step, ": no sample of that step (",
             samples.size(), " samples); sample every step or pick a sampled one");
  MemoryGrowth g;
  for (const MemorySample& s : samples) {
    if (s.step <= step) continue;
    if (s.rss_bytes > base->rss_bytes + g.rss_bytes) {
      g.rss_bytes = s.rss_bytes - base->rss_bytes;
      g.rss_step = s.step;
    }
    if (s.gpu_bytes > base->gpu_bytes + g.gpu_bytes) {
      g.gpu_bytes = s.gpu_bytes - base->gpu_bytes;
      g.gpu_step = s.step;
    }
  }
  return g;
}

const char* MemorySampler::csv_header() {
  return "step,rss_bytes,peak_rss_bytes,gpu_bytes,plan_host_bytes,plan_device_bytes,gpu_used_bytes";
}

MemorySampler::MemorySampler(const MemoryPlan& plan, const std::filesystem::path& csv)
    : plan_(plan), csv_file_(csv) {
  if (!csv_file_.empty()) {
    errno = 0;
    csv_.open(csv_file_, std::ios::out | std::ios::trunc);
    if (!csv_.good()) SF_FAIL(io, write_error(csv_file_));
    csv_ << csv_header() << "\n";
  }
  sample(0, 0, 0);
}

const MemorySample& MemorySampler::sample(int64_t step, size_t gpu_bytes, size_t gpu_used_bytes) {
  const ProcessMemory pm = process_memory();
  samples_.push_back({step, pm.rss_bytes, pm.peak_rss_bytes, gpu_bytes, gpu_used_bytes});
  if (csv_.is_open()) write_row(samples_.back());
  return samples_.back();
}

void MemorySampler::write_row(const MemorySample& s) {
  errno = 0;
  csv_ << s.step << ',' << s.rss_bytes << ',' << s.peak_rss_bytes << ',' << s.gpu_bytes << ','
       << plan_.host_bytes << ',' << plan_.device_bytes << ',' << s.gpu_used_bytes << '\n';
  csv_.flush();  // one small write per step: the log survives a run that is killed
  if (!csv_.good()) SF_FAIL(io, write_error(csv_file_));
}

std::string MemorySampler::summary_line(size_t peak_gpu_bytes, int64_t after_step) const {
  const MemorySample& base = samples_.front();
  const MemorySample& last = samples_.back();
  std::ostringstream os;
  os << std::fixed << std::setprecision(2) << "memory: peak RSS " << gib(last.peak_rss_bytes)
     << " GiB (plan " << gib(plan_.rss_bytes()) << ", " << gib(base.rss_bytes)
     << " before the engine), peak GPU " << gib(peak_gpu_bytes) << " GiB (plan "
     << gib(plan_.device_bytes) << ")";
  if (last.step > after_step) {
    const MemoryGrowth g = memory_growth_after(samples_, after_step);
    os << ", growth after step " << after_step << ": " << mib(g.rss_bytes) << " MiB RSS, "
       << mib(g.gpu_bytes) << " MiB GPU";
  }
  return os.str();
}

}  // namespace sf
