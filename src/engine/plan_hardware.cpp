// The hardware figures the planner's prediction starts from: HardwareModel::host_default
// (the host backend: this machine's fp32 GEMM rate, measured briefly) and
// HardwareModel::device_default (the H200's GPU figures with this machine's CPU AdamW rate,
// measured briefly). Each returns a fresh model; nothing here is cached.
#include <algorithm>
#include <chrono>
#include <vector>

#include "backend/host/host_backend.h"
#include "core/error.h"
#include "core/stopwatch.h"
#include "core/thread_pool.h"
#include "engine/planner.h"
#include "optim/adamw.h"
#include "optim/param_store.h"
#include "optim/state_adamw.h"

namespace sf {

// A host-backend step's FLOPs (as predict() counts them) run at this share of the probe's
// fp32 GEMM rate. On the 2-core dev box: tiny preset 4 x 256 2,264 tokens/s measured vs 1,972
// predicted, small preset 2 x 512 387 vs 436 (the 0.5 used before predicted 2-3x too slow).
constexpr double kHostStepShareOfGemm = 1.0;

HardwareModel HardwareModel::host_default() {
  HardwareModel hw;
  HostBackend be;
  const int64_t n = 512;
  std::vector<float> a(size_t(n * n), 0.5f), b(size_t(n * n), 0.25f), c(size_t(n * n));
  Mat A(a.data(), DType::f32, n, n), B(b.data(), DType::f32, n, n), Cm(c.data(), DType::f32, n, n);
  be.gemm(be.default_stream(), Cm, A, Trans::no, B, Trans::yes, 1.f, 0.f);  // warm up
  auto t0 = std::chrono::steady_clock::now();
  const int reps = 4;
  for (int i = 0; i < reps; ++i) be.gemm(be.default_stream(), Cm, A, Trans::no, B, Trans::yes, 1.f, 0.f);
  double s = seconds_since(t0);
  const double gemm = reps * 2.0 * double(n * n * n) / std::max(s, 1e-9);
  hw.device_flops = kHostStepShareOfGemm * gemm;
  hw.attention_flops = hw.device_flops;
  hw.h2d_bytes_per_s = hw.d2h_bytes_per_s = 10e9;  // memcpy on the host
  hw.adamw_params_per_s = 0.4e9 * double(host_pool().size());
  hw.source = cat("measured on this host: fp32 GEMM ", int(gemm / 1e9), " GFLOP/s");
  return hw;
}

namespace {

// Sweeps of the optimizer in format f over a 32M-element range (int8 blocks, no small
// ranges) as training runs them: state in huge-page host arrays (ParamStore's HostArray),
// the bf16 weights written over the bf16 gradient. The median of five after a warm-up, in
// parameters per second (the best of them read up to 6.5 where the engine's sweeps ran
// 4.6-5.4). (fp32 runs adamw_update_ranges itself.) With 4 KiB pages and a separate output
// the H200 machine's probe read 3.9-4.3 G params/s in a lease where this one read 4.7-5.3.
double adamw_rate(StateFormat f, ThreadPool& pool) {
  const int64_t n = int64_t(1) << 25;
  const StateUnit unit{n, {ParamRange{0, n, true}}};
  const UnitStateLayout l = unit_state_layout(unit, f);
  const HostArray master(l.master_bytes, "the AdamW probe"), m(l.moment_bytes, "the AdamW probe"),
      v(l.moment_bytes, "the AdamW probe"), g(size_t(n) * 2, "the AdamW probe");
  std::vector<float> ms(size_t(l.scale_count)), vs(size_t(l.scale_count));
  uint16_t* grad = g.as<uint16_t>();
  std::fill(grad, grad + n, f32_to_bf16(1e-3f));
  const UnitStateView view{f, &l, master.as<char>(), m.as<char>(), v.as<char>(),
                           ms.empty() ? nullptr : ms.data(), vs.empty() ? nullptr : vs.data(), 1, 0};
  AdamWStep st;
  st.lr = 1e-5f;
  std::vector<double> secs;
  for (int rep = 0; rep < 6; ++rep) {
    st.step = rep + 1;
    const auto t0 = std::chrono::steady_clock::now();
    adamw_update_state(view, 0, n, grad, grad, unit.ranges, st, &pool);  // weights over the gradient
    if (rep > 0) secs.push_back(seconds_since(t0));
  }
  std::nth_element(secs.begin(), secs.begin() + 2, secs.end());
  return double(n) / std::max(secs[2], 1e-6);
}

}  // namespace

HardwareModel HardwareModel::device_default(StateFormat f) {
  HardwareModel hw;
  // The engine's optimizer pool: every core but one.
  ThreadPool pool(std::max(1, host_pool().size() - 1));
  hw.adamw_params_per_s = adamw_rate(f, pool);
  return hw;
}

}  // namespace sf
