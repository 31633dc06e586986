// bench_adamw: throughput of the host AdamW step (src/optim/adamw.h) for each CPU ISA and
// thread count, with f32 and bf16 gradients, of the fused redo and the undo of a step
// (src/optim/adamw_undo.h), plus the gradient sum of squares; not a test.
//
//   build-x/bin/bench_adamw [--mparams 256] [--threads 1,2,4] [--isa scalar,avx2,avx512]
//                           [--iters 5] [--no-out]
//
// Prints, per configuration, the median over iters of: G params/s and the DRAM traffic it
// implies in GB/s, counting per parameter p, m, v read and written (24 bytes), the gradient
// read (4 f32 / 2 bf16) and the bf16 weight copy written (2, unless --no-out). A "stream"
// row moves the same bytes with trivial arithmetic: the memory roofline the optimizer
// should approach (it is DRAM-bound when the two are close). "per core-s" divides by the
// process CPU time instead of the wall time: the cost per core, robust to a shared machine.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/adamw.h"
#include "optim/adamw_undo.h"
#include "optim/grad_norm.h"

using namespace sf;

namespace {

struct Free {
  void operator()(void* p) const { std::free(p); }
};
template <class T>
std::unique_ptr<T[], Free> alloc(int64_t n) {
  const size_t bytes = (size_t(n) * sizeof(T) + 4095) / 4096 * 4096;
  T* p = static_cast<T*>(std::aligned_alloc(4096, bytes));
  SF_REQUIRE(p, "cannot allocate ", bytes >> 20, " MiB; lower --mparams");
  return std::unique_ptr<T[], Free>(p);
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t e = s.find(',', pos);
    if (e == std::string::npos) e = s.size();
    out.push_back(s.substr(pos, e - pos));
    pos = e + 1;
  }
  return out;
}

double cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// Median wall time and median process CPU time (all threads) of iters runs, after a
// warm-up. CPU time shows the per-core cost even when other jobs share the machine.
struct Timing {
  double wall, cpu;
};
template <class F>
Timing median_seconds(int iters, F&& f) {
  f();  // warm-up (page faults, caches, thread start)
  std::vector<double> w, c;
  for (int i = 0; i < iters; ++i) {
    const double c0 = cpu_seconds();
    const auto a = std::chrono::steady_clock::now();
    f();
    w.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
    c.push_back(cpu_seconds() - c0);
  }
  std::sort(w.begin(), w.end());
  std::sort(c.begin(), c.end());
  return {w[w.size() / 2], c[c.size() / 2]};
}

void row(const char* what, const char* isa, int threads, int64_t n, double bytes_per, Timing t) {
  std::printf("%-16s %-7s %3d threads  %7.3f G params/s  %7.2f GB/s  (%6.1f ms)  per core-s: "
              "%6.3f G params\n",
              what, isa, threads, double(n) / t.wall * 1e-9, double(n) * bytes_per / t.wall * 1e-9,
              t.wall * 1e3, double(n) / t.cpu * 1e-9);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) try {
  double mparams = 256;
  std::vector<int> threads;
  std::vector<std::string> isas;
  int iters = 5;
  bool with_out = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      SF_REQUIRE(i + 1 < argc, a, " needs a value");
      return argv[++i];
    };
    if (a == "--mparams") mparams = std::atof(next().c_str());
    else if (a == "--threads")
      for (const std::string& t : split(next()))
        threads.push_back(std::max(1, std::atoi(t.c_str())));
    else if (a == "--isa") isas = split(next());
    else if (a == "--iters") iters = std::max(1, std::atoi(next().c_str()));
    else if (a == "--no-out") with_out = false;
    else SF_REQUIRE(false, "unknown flag ", a, " (flags: --mparams M --threads 1,2 ",
                    "--isa scalar,avx2,avx512 --iters N --no-out)");
  }
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  if (threads.empty()) {  // 1, 2, 4, ... and the core count
    for (int t = 1; t < hw; t *= 2) threads.push_back(t);
    threads.push_back(hw);
  }
  if (isas.empty())
    for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512})
      if (cpu_isa_supported(isa)) isas.push_back(std::string(cpu_isa_name(isa)));

  const int64_t n = int64_t(mparams * 1e6) / 64 * 64;
  std::printf("bench_adamw: %.0fM params, %d hardware threads, bf16 out %s, median of %d\n",
              double(n) / 1e6, hw, with_out ? "on" : "off", iters);
  auto p = alloc<float>(n), m = alloc<float>(n), v = alloc<float>(n), g = alloc<float>(n);
  auto gh = alloc<uint16_t>(n), out = alloc<uint16_t>(n);
  {
    // First touch in parallel (NUMA placement follows the workers), non-trivial values.
    ThreadPool init(hw);
    init.parallel_for(n, [&](int64_t b, int64_t e) {
      uint32_t x = uint32_t(b) * 2654435761u + 1;
      for (int64_t i = b; i < e; ++i) {
        x = x * 1664525u + 1013904223u;
        const float r = float(x >> 8) * (1.0f / 16777216.0f) - 0.5f;  // [-0.5, 0.5)
        p[i] = r;
        m[i] = r * 0.01f;
        v[i] = r * r * 1e-4f;
        g[i] = r * 0.1f;
        gh[i] = f32_to_bf16(g[i]);
        out[i] = 0;
      }
    }, 4096);
  }
  uint16_t* outp = with_out ? out.get() : nullptr;
  const double out_bytes = with_out ? 2 : 0;
  AdamWStep s;
  s.lr = 1e-5f;
  s.weight_decay = 0.01f;

  for (int t : threads) {
    ThreadPool pool(t);
    // Roofline: the same bytes as the f32-gradient step, trivial arithmetic.
    const Timing st = median_seconds(iters, [&] {
      pool.run_tasks((n + kAdamWChunk - 1) / kAdamWChunk, [&](int64_t k) {
        const int64_t b = k * kAdamWChunk, e = std::min(n, b + kAdamWChunk);
        float* __restrict pp = p.get();
        float* __restrict mm = m.get();
        float* __restrict vv = v.get();
        const float* __restrict gg = g.get();
        for (int64_t i = b; i < e; ++i) {
          const float x = gg[i] * 1e-30f;
          pp[i] += x;
          mm[i] += x;
          vv[i] += x;
        }
        if (outp) std::memset(outp + b, 0, size_t(e - b) * 2);
      });
    });
    row("stream", "-", t, n, 28 + out_bytes, st);
    for (const std::string& name : isas) {
      const CpuIsa isa = parse_cpu_isa(name);
      if (!cpu_isa_supported(isa)) {
        std::printf("%s: not supported by this CPU, skipped\n", name.c_str());
        continue;
      }
      s.step = 1;
      const Timing f = median_seconds(iters, [&] {
        adamw_update(p.get(), m.get(), v.get(), g.get(), outp, n, s, &pool, isa);
        ++s.step;
      });
      row("adamw f32 grad", name.c_str(), t, n, 28 + out_bytes, f);
      const Timing b = median_seconds(iters, [&] {
        adamw_update(p.get(), m.get(), v.get(), gh.get(), outp, n, s, &pool, isa);
        ++s.step;
      });
      row("adamw bf16 grad", name.c_str(), t, n, 26 + out_bytes, b);
      // Replacing a speculated step by the clipped one (adamw_undo.h): the fused redo moves
      // the bytes of one update; "undo+update" is the two passes it replaces (p, m, v and the
      // gradient read twice). Steps a and c alternate so the state stays where it was.
      AdamWStep a = s, c = s;
      c.grad_scale = 0.37f;
      const ParamRange all{0, n, true};
      const Timing r = median_seconds(iters, [&] {
        adamw_redo_ranges(p.get(), m.get(), v.get(), gh.get(), outp, n, {&all, 1}, a, c, &pool,
                          isa);
        std::swap(a, c);
      });
      row("redo bf16 grad", name.c_str(), t, n, 26 + out_bytes, r);
      const Timing u = median_seconds(iters, [&] {
        adamw_undo_ranges(p.get(), m.get(), v.get(), gh.get(), n, {&all, 1}, a, &pool, isa);
        adamw_update_ranges(p.get(), m.get(), v.get(), gh.get(), outp, n, {&all, 1}, c, &pool,
                            isa);
        std::swap(a, c);
      });
      row("undo+update bf16", name.c_str(), t, n, 26 + 26 + out_bytes, u);
      // A clipped step's unit that was not speculated: update + redo in one pass.
      const Timing ur = median_seconds(iters, [&] {
        adamw_update_redo_ranges(p.get(), m.get(), v.get(), gh.get(), outp, n, {&all, 1}, a, c,
                                 &pool, isa);
      });
      row("update+redo bf16", name.c_str(), t, n, 26 + out_bytes, ur);
      double sink = 0;
      const Timing q = median_seconds(iters, [&] { sink += sum_squares(g.get(), n, &pool, isa); });
      row("sumsq f32", name.c_str(), t, n, 4, q);
      if (sink < 0) std::printf("impossible\n");
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_adamw: %s\n", e.what());
  return 1;
}
