#include "engine/hardware_probe.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <iomanip>
#include <sstream>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/stopwatch.h"
#include "optim/state_disk.h"

namespace sf {

namespace {

// Copies n values in [-1, 1) of dtype t to dst on the device (zeros would make the GEMM run
// faster than real data): a 4M-value block from a fixed LCG, repeated.
void upload_random(Backend& be, Stream& s, void* dst, DType t, size_t n) {
  const size_t block = std::min(n, size_t(1) << 22);
  std::vector<float> f(block);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (auto& v : f) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v = float(int64_t(x >> 40) - (int64_t(1) << 23)) / float(int64_t(1) << 23);
  }
  std::vector<unsigned char> bytes(block * dtype_size(t));
  convert_from_f32(f.data(), bytes.data(), t, block);
  for (size_t off = 0; off < n; off += block) {
    const size_t m = std::min(block, n - off);
    be.copy_to_device(s, static_cast<unsigned char*>(dst) + off * dtype_size(t), bytes.data(),
                      m * dtype_size(t));
    s.synchronize();  // the staging vector is reused
  }
}

// Best-of-reps seconds of fn, each timed to completion on stream s, after three warm-ups (a
// GPU just woken up needs a few milliseconds to reach its clocks).
template <class Fn>
double best_seconds(Stream& s, int reps, Fn&& fn) {
  for (int i = 0; i < 3; ++i) fn();
  s.synchronize();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    s.synchronize();
    best = std::min(best, seconds_since(t0));
  }
  return std::max(best, 1e-9);
}

}  // namespace

DeviceProbe probe_device(Backend& be, const ProbeShape& sh) {
  SF_CHECK(sh.m > 0 && sh.n > 0 && sh.k > 0 && sh.copy_bytes > 0 && sh.reps > 0,
           "probe_device: empty shape");
  DeviceProbe p;
  p.device = be.name();
  Stream& s = be.default_stream();
  const DType t = be.compute_dtype();
  const size_t es = dtype_size(t);
  {
    auto a = be.alloc(size_t(sh.m * sh.k) * es, "probe a");
    auto b = be.alloc(size_t(sh.n * sh.k) * es, "probe b");
    auto c = be.alloc(size_t(sh.m * sh.n) * es, "probe c");
    upload_random(be, s, a->data(), t, size_t(sh.m * sh.k));
    upload_random(be, s, b->data(), t, size_t(sh.n * sh.k));
    Mat ma(a->data(), t, sh.m, sh.k), mb(b->data(), t, sh.n, sh.k), mc(c->data(), t, sh.m, sh.n);
    const double sec = best_seconds(s, sh.reps, [&] {
      be.gemm(s, mc, ma, Trans::no, mb, Trans::yes, 1.f, 0.f);
    });
    p.gemm_flops = 2.0 * double(sh.m) * double(sh.n) * double(sh.k) / sec;
  }
  {
    auto host = be.alloc_host(sh.copy_bytes, "probe pinned buffer");
    auto dev = be.alloc(sh.copy_bytes, "probe copy target");
    std::fill_n(static_cast<unsigned char*>(host->data()), sh.copy_bytes, uint8_t(1));
    const double up = best_seconds(s, sh.reps, [&] {
      be.copy_to_device(s, dev->data(), host->data(), sh.copy_bytes);
    });
    const double down = best_seconds(s, sh.reps, [&] {
      be.copy_to_host(s, host->data(), dev->data(), sh.copy_bytes);
    });
    p.h2d_bytes_per_s = double(sh.copy_bytes) / up;
    p.d2h_bytes_per_s = double(sh.copy_bytes) / down;
  }
  return p;
}

DiskRates probe_disk_rates(const std::string& dir, size_t bytes) {
  constexpr size_t kUnit = size_t(32) << 20;  // measure_disk_rates' granule
  return measure_disk_rates(dir, std::max(kUnit, (bytes + kUnit - 1) / kUnit * kUnit));
}

double probe_disk(const std::string& dir, size_t bytes) {
  const DiskRates r = probe_disk_rates(dir, bytes);
  constexpr size_t kStep = size_t(1) << 30;  // any size: the rate is per byte
  return 2.0 * double(kStep) / disk_tier_seconds(kStep, r);
}

HardwareModel scale_to_device(HardwareModel hw, const DeviceProbe& probe) {
  SF_CHECK(probe.gemm_flops > 0 && probe.h2d_bytes_per_s > 0 && probe.d2h_bytes_per_s > 0,
           "scale_to_device: the probe measured nothing");
  const double f = probe.gemm_flops / kH200ProbeGemmFlops;
  hw.device_flops *= f;
  hw.attention_flops *= f;
  hw.attention_flops_no_workspace *= f;
  // The defaults are what the engine gets with both directions busy (50 of 55 GB/s alone).
  hw.h2d_bytes_per_s *= probe.h2d_bytes_per_s / kH200ProbeCopyBytesPerS;
  hw.d2h_bytes_per_s *= probe.d2h_bytes_per_s / kH200ProbeCopyBytesPerS;
  std::ostringstream os;
  os << std::fixed << std::setprecision(0) << "measured on " << probe.device << ": GEMM "
     << probe.gemm_flops / 1e12 << " TFLOP/s, copies " << probe.h2d_bytes_per_s / 1e9
     << " GB/s up, " << probe.d2h_bytes_per_s / 1e9 << " GB/s down";
  hw.source = os.str();
  return hw;
}

}  // namespace sf
