// What the step prediction needs from the GPU this run will use, measured before planning:
// the bf16 GEMM rate at a layer's shape and the pinned copy bandwidth each way (~0.5 s with
// the CUDA context). The planner's GPU figures (HardwareModel's defaults) are the H200 test
// machine's; scale_to_device() rescales them to the measured device, so that a 24 GB card
// on PCIe 4 gets its own predicted tokens/s and chunk sizes that hide its slower transfers.
#pragma once
#include <string>

#include "backend/backend.h"
#include "engine/planner.h"
#include "io/direct_file.h"

namespace sf {

struct DeviceProbe {
  double gemm_flops = 0;   // bf16 GEMM, M x N x K below, random data in [-1, 1)
  double h2d_bytes_per_s = 0, d2h_bytes_per_s = 0;  // pinned host memory, one way at a time
  std::string device;      // the backend's name
};

// The probe's GEMM: the attention output projection of Llama-3.1-8B at 32K tokens (M x N x K
// = 32768 x 4096 x 4096; the H200 ran it in 1.355-1.416 ms forward, 776-811 TFLOP/s:
// docs/BENCHMARKS.md, GEMM table, row "o 32768x4096x4096"). Smaller shapes for tests on the
// host backend.
struct ProbeShape {
  int64_t m = 32768, n = 4096, k = 4096;
  size_t copy_bytes = size_t(256) << 20;
  int reps = 5;
};
DeviceProbe probe_device(Backend& be, const ProbeShape& shape = {});

// The probe on the H200 test machine, which HardwareModel's GPU figures were calibrated on.
inline constexpr double kH200ProbeGemmFlops = 785e12;
inline constexpr double kH200ProbeCopyBytesPerS = 55e9;

// The disk under `dir` as the optimizer's disk tier uses it (optim/state_disk.h: O_DIRECT and
// io_uring, 1 MiB requests, 16 in flight): sequential write, read, and both at once, of a
// scratch file of `bytes` (rounded up to 32 MiB; io/direct_file.h: measure_disk_rates, ~4 passes,
// ~0.7 s for 256 MiB on a 1.5 GB/s disk). Throws Error(io) naming --optimizer-dir when it cannot.
DiskRates probe_disk_rates(const std::string& dir, size_t bytes = size_t(256) << 20);
// The same as HardwareModel::disk_bytes_per_s: bytes read plus written per second as the tier
// moves them (2 x bytes / disk_tier_seconds(bytes, rates)).
double probe_disk(const std::string& dir, size_t bytes = size_t(256) << 20);

// HardwareModel's GPU figures (device and attention FLOP/s, both copy directions) scaled by
// the probe against the H200's; the CPU figures stay; `source` says where they came from.
HardwareModel scale_to_device(HardwareModel hw, const DeviceProbe& probe);

}  // namespace sf
