// The device probe measures a GEMM rate and copy bandwidths through any backend, and the
// planner's GPU figures (calibrated on the H200) rescale by what it measured.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "backend/host/host_backend.h"
#include "core/error.h"
#include "engine/hardware_probe.h"
#include "engine/planner.h"
#include "model/model_presets.h"

using namespace sf;

namespace {

TEST(HardwareProbe, MeasuresThroughTheBackend) {
  HostBackend be;
  ProbeShape small;
  small.m = 96;
  small.n = 64;
  small.k = 80;
  small.copy_bytes = size_t(1) << 20;
  small.reps = 2;
  const DeviceProbe p = probe_device(be, small);
  EXPECT_EQ(p.device, be.name());
  for (double v : {p.gemm_flops, p.h2d_bytes_per_s, p.d2h_bytes_per_s}) {
    EXPECT_TRUE(std::isfinite(v));
    EXPECT_GT(v, 0);
  }
  EXPECT_EQ(be.bytes_in_use(), 0u);  // nothing left behind for the executor's budget
}

TEST(HardwareProbe, MeasuresTheOptimizersDisk) {
  const std::string dir = ::testing::TempDir();
  const size_t bytes = size_t(16) << 20;  // two of the probe's 8 MiB blocks: probed as is
  // The probe times its write and its read inside this interval, so the rate it reports is at
  // least the 2 x bytes it moved over the whole interval, however slow or loaded the machine
  // (a fixed floor such as "1 MB/s" would depend on the disk). A wrong unit (MB/s, bytes/ms)
  // falls far below it.
  const auto t0 = std::chrono::steady_clock::now();
  const double bw = probe_disk(dir, bytes);
  const double outer = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(std::isfinite(bw));
  EXPECT_GE(bw, 2.0 * double(bytes) / outer);
  try {
    probe_disk("/nonexistent/sf-probe");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--optimizer-dir /nonexistent/sf-probe"), std::string::npos)
        << e.what();
  }
}

TEST(HardwareProbe, RescalesTheH200Figures) {
  const HardwareModel h200;
  DeviceProbe same{kH200ProbeGemmFlops, kH200ProbeCopyBytesPerS, kH200ProbeCopyBytesPerS, "H200"};
  HardwareModel a = scale_to_device(h200, same);
  EXPECT_DOUBLE_EQ(a.device_flops, h200.device_flops);
  EXPECT_DOUBLE_EQ(a.attention_flops, h200.attention_flops);
  EXPECT_DOUBLE_EQ(a.h2d_bytes_per_s, h200.h2d_bytes_per_s);
  EXPECT_DOUBLE_EQ(a.adamw_params_per_s, h200.adamw_params_per_s);
  EXPECT_NE(a.source.find("measured on H200: GEMM 785 TFLOP/s, copies 55 GB/s up"),
            std::string::npos)
      << a.source;

  // A card with a fifth of the GEMM rate on PCIe 4 (about half the copy bandwidth).
  DeviceProbe card{kH200ProbeGemmFlops / 5, 26e9, 24e9, "a smaller GPU"};
  HardwareModel b = scale_to_device(h200, card);
  EXPECT_NEAR(b.device_flops, h200.device_flops / 5, 1e3);
  EXPECT_NEAR(b.attention_flops, h200.attention_flops / 5, 1e3);
  EXPECT_NEAR(b.h2d_bytes_per_s, h200.h2d_bytes_per_s * 26 / 55, 1e3);
  EXPECT_NEAR(b.d2h_bytes_per_s, h200.d2h_bytes_per_s * 24 / 55, 1e3);
  EXPECT_EQ(b.adamw_params_per_s, h200.adamw_params_per_s);  // the CPU's, not the GPU's

  // The plan predicts that card slower and says what it assumed.
  ModelConfig cfg = model_preset("llama3-8b");
  const Budget budget{size_t(24) << 30, size_t(112) << 30, false};
  const StepRequest req{32 * 1024, 1, 1024};
  Plan fast = make_plan(cfg, req, budget, DType::bf16, a);
  Plan slow = make_plan(cfg, req, budget, DType::bf16, b);
  ASSERT_TRUE(fast.fits && slow.fits);
  EXPECT_GT(slow.step_seconds, 3 * fast.step_seconds);
  const std::string text = describe_plan(cfg, req, budget, slow);
  EXPECT_NE(text.find("hardware   measured on a smaller GPU: GEMM 157 TFLOP/s"), std::string::npos)
      << text;

  DeviceProbe nothing;
  EXPECT_THROW(scale_to_device(h200, nothing), Error);
}

}  // namespace
