// bench_state_adamw: throughput of the compact-state AdamW step (src/optim/state_adamw.h)
// for every state format, CPU ISA and thread count, with bf16 gradients and the bf16 weight
// copy written (the training case); not a test.
//
//   build-x/bin/bench_state_adamw [--mparams 64] [--threads 1,2] [--isa scalar,avx2,avx512]
//                                 [--iters 5] [--grad f32|bf16]
//
// Prints, per configuration, the median over iters of G params/s (wall and per core-second
// of process CPU time, robust to a shared machine) and the state bytes per parameter the
// format reads and writes, next to the fp32 format (adamw_update_ranges) as the baseline.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/state_adamw.h"
#include "optim/state_format.h"

using namespace sf;

namespace {

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

struct Timing {
  double wall, cpu;
};
// Median wall and process CPU time of iters runs after one warm-up run.
template <class F>
Timing median_seconds(int iters, F&& f) {
  f();
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

// One unit of n parameters in one decayed range, its state allocated and encoded from
// non-trivial fp32 values.
struct BenchState {
  StateUnit unit;
  UnitStateLayout layout;
  std::vector<uint8_t> master, m, v;
  std::vector<float> ms, vs;
  UnitStateView view;
  BenchState(int64_t n, StateFormat f) {
    unit.numel = n;
    unit.ranges = {{0, n, true}};
    layout = unit_state_layout(unit, f);
    master.resize(layout.master_bytes);
    m.resize(layout.moment_bytes);
    v.resize(layout.moment_bytes);
    ms.resize(size_t(layout.scale_count));
    vs.resize(size_t(layout.scale_count));
    view = {f, &layout, master.data(), m.data(), v.data(), ms.empty() ? nullptr : ms.data(),
            vs.empty() ? nullptr : vs.data(), 1234, 0};
    const size_t len = static_cast<size_t>(n);
    std::vector<float> p(len), mm(len), vv(len);
    uint32_t x = 1;
    for (size_t i = 0; i < size_t(n); ++i) {
      x = x * 1664525u + 1013904223u;
      const float r = float(x >> 8) * (1.0f / 16777216.0f) - 0.5f;  // [-0.5, 0.5)
      p[i] = r;
      mm[i] = r * 0.01f;
      vv[i] = r * r * 1e-4f;
    }
    state_from_f32(view, 0, n, p.data(), mm.data(), vv.data(), unit.ranges);
  }
  double bytes_per_param() const {
    return double(layout.master_bytes + 2 * layout.moment_bytes +
                  2 * size_t(layout.scale_count) * 4) /
           double(unit.numel);
  }
};

}  // namespace

int main(int argc, char** argv) try {
  double mparams = 64;
  std::vector<int> threads;
  std::vector<std::string> isas;
  int iters = 5;
  bool bf16_grad = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      SF_REQUIRE(i + 1 < argc, a, " needs a value");
      return argv[++i];
    };
    if (a == "--mparams") mparams = std::atof(next().c_str());
    else if (a == "--threads")
      for (const std::string& t : split(next())) threads.push_back(std::max(1, std::atoi(t.c_str())));
    else if (a == "--isa") isas = split(next());
    else if (a == "--iters") iters = std::max(1, std::atoi(next().c_str()));
    else if (a == "--grad") {
      const std::string g = next();
      SF_REQUIRE(g == "f32" || g == "bf16", "--grad must be f32 or bf16, got ", g);
      bf16_grad = g == "bf16";
    } else
      SF_REQUIRE(false, "unknown flag ", a, " (flags: --mparams M --threads 1,2 ",
                 "--isa scalar,avx2,avx512 --iters N --grad f32|bf16)");
  }
  SF_REQUIRE(mparams > 0, "--mparams must be > 0, got ", mparams);
  const int hw = int(std::max(1u, std::thread::hardware_concurrency()));
  if (threads.empty()) threads = {1, hw};
  if (isas.empty())
    for (CpuIsa isa : {CpuIsa::scalar, CpuIsa::avx2, CpuIsa::avx512})
      if (cpu_isa_supported(isa)) isas.push_back(std::string(cpu_isa_name(isa)));

  const int64_t n = int64_t(mparams * 1e6) / kStateBlock * kStateBlock;
  std::printf("bench_state_adamw: %.1fM params, %s gradient, bf16 out, median of %d\n",
              double(n) / 1e6, bf16_grad ? "bf16" : "f32", iters);
  const size_t len = static_cast<size_t>(n);
  std::vector<float> g(len);
  std::vector<uint16_t> gh(len), out(len);
  for (size_t i = 0; i < g.size(); ++i) {
    g[i] = float(int(i % 1999) - 999) * 1e-4f;
    gh[i] = f32_to_bf16(g[i]);
  }
  const StateFormat formats[] = {
      {MomentFormat::f32, MasterFormat::f32},  {MomentFormat::bf16, MasterFormat::f32},
      {MomentFormat::int8, MasterFormat::f32}, {MomentFormat::f32, MasterFormat::bf16},
      {MomentFormat::bf16, MasterFormat::bf16}, {MomentFormat::int8, MasterFormat::bf16}};
  AdamWStep s;
  s.lr = 1e-5f;
  s.weight_decay = 0.01f;
  for (const StateFormat f : formats) {
    BenchState st(n, f);
    for (int t : threads) {
      ThreadPool pool(t);
      for (const std::string& name : isas) {
        const CpuIsa isa = parse_cpu_isa(name);
        if (!cpu_isa_supported(isa)) {
          std::printf("%s: not supported by this CPU, skipped\n", name.c_str());
          continue;
        }
        s.step = 1;
        const Timing tm = median_seconds(iters, [&] {
          if (bf16_grad)
            adamw_update_state(st.view, 0, n, gh.data(), out.data(), st.unit.ranges, s, &pool, isa);
          else
            adamw_update_state(st.view, 0, n, g.data(), out.data(), st.unit.ranges, s, &pool, isa);
          ++s.step;
        });
        std::printf("moments %-4s master %-4s %-7s %d threads  %7.3f G params/s  per core-s "
                    "%6.3f G  (%5.2f state B/param, %6.1f ms)\n",
                    moment_format_name(f.moments), master_format_name(f.master), name.c_str(), t,
                    double(n) / tm.wall * 1e-9, double(n) / tm.cpu * 1e-9, st.bytes_per_param(),
                    tm.wall * 1e3);
        std::fflush(stdout);
      }
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_state_adamw: %s\n", e.what());
  return 1;
}
