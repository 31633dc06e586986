// bench_master_rounding: how far a bf16 master copy drifts from an fp32 one over a long
// AdamW run, for the ways of rounding the updated weight back to bf16; the measurement
// behind state_format.h's choice of stochastic rounding. Not a test.
//
//   build-x/bin/bench_master_rounding [--steps 10000] [--n 100000] [--lr 2e-5] [--threads 2]
//
// Problems (n weights each, initialised like LLM weights ~ N(0, 0.02^2) and rounded to bf16,
// as if loaded from a bf16 checkpoint, so every variant starts from the same exact point;
// the gradient is taken at the bf16 copy of the weights, as a bf16 forward pass would):
//   quadratic  0.5 * mean_i h_i (w_i - t_i)^2, h_i log-uniform in [0.1, 10], targets
//              t = w0 + N(0, 0.01^2), gradient noise N(0, 1) per element and step
//   logistic   sparse logistic regression: each sample has 1000 random features with
//              values ~ N(0, 1), its label drawn from a teacher w0 + N(0, 0.02^2); batches of
//              64 (a sparse gradient, as an embedding table's), loss on 1024 held-out samples
// Variants (all with fp32 m and v, the same AdamW arithmetic; state bytes per parameter):
//   fp32        fp32 master (12 B): the reference
//   bf16-rne    bf16 master rounded to nearest even (10 B)
//   bf16-sr     bf16 master, stochastic rounding (10 B): optim's adamw_update_state
//   bf16-kahan  bf16 master + a bf16 Kahan compensation buffer (12 B: the master costs 4 B,
//               as much as fp32's, so it saves nothing over an fp32 master)
// Prints, every --report steps and at the end, per variant: the weights' RMS distance to the
// fp32 run relative to the fp32 run's own displacement |w_fp32 - w0| and to |w_fp32|, and
// the loss; "(bf16 floor)" is that distance for the fp32 weights rounded to bf16, the best
// any bf16 weight copy can do.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "optim/adamw.h"
#include "optim/state_adamw.h"
#include "optim/state_format.h"

using namespace sf;

namespace {

// Counter-based uniform in [0, 1) from (a, b, c): the same noise for every variant.
inline float uniform(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t x = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull) * 0xbf58476d1ce4e5b9ull ^
               c * 0x94d049bb133111ebull;
  x ^= x >> 31;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  return float(x >> 40) * (1.0f / 16777216.0f);
}
// Approximately standard normal: the sum of 4 uniforms, centred, scaled to unit variance.
inline float normal(uint64_t a, uint64_t b, uint64_t c) {
  const float s = uniform(a, b, 4 * c) + uniform(a, b, 4 * c + 1) + uniform(a, b, 4 * c + 2) +
                  uniform(a, b, 4 * c + 3);
  return (s - 2.0f) * 1.7320508f;
}

class Problem {
 public:
  virtual ~Problem() = default;
  virtual const char* name() const = 0;
  // g (overwrite) = the gradient at w (n weights) for step `step`.
  virtual void begin_step(int64_t step) { (void)step; }  // shared by every variant's grad
  virtual void grad(const float* w, float* g, int64_t step, ThreadPool& pool) = 0;
  virtual double loss(const float* w) = 0;
  std::vector<float> w0;
};

class Quadratic final : public Problem {
 public:
  explicit Quadratic(int64_t n) : h_(size_t(n)), t_(size_t(n)) {
    w0.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) {
      w0[size_t(i)] = round_bf16(0.02f * normal(1, uint64_t(i), 0));
      t_[size_t(i)] = w0[size_t(i)] + 0.01f * normal(2, uint64_t(i), 0);
      h_[size_t(i)] = std::pow(10.0f, 2.0f * uniform(3, uint64_t(i), 0) - 1.0f);
    }
  }
  const char* name() const override { return "quadratic"; }
  void grad(const float* w, float* g, int64_t step, ThreadPool& pool) override {
    pool.parallel_for(int64_t(h_.size()), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        g[i] = h_[size_t(i)] * (w[i] - t_[size_t(i)]) + normal(4, uint64_t(i), uint64_t(step));
    }, 4096);
  }
  double loss(const float* w) override {
    double s = 0;
    for (size_t i = 0; i < h_.size(); ++i) s += 0.5 * h_[i] * double(w[i] - t_[i]) * (w[i] - t_[i]);
    return s / double(h_.size());
  }

 private:
  std::vector<float> h_, t_;
};

class Logistic final : public Problem {
 public:
  static constexpr int kBatch = 64, kActive = 1000, kEval = 1024;
  explicit Logistic(int64_t n) : n_(n), teacher_(size_t(n)) {
    w0.resize(size_t(n));
    for (int64_t i = 0; i < n; ++i) {
      w0[size_t(i)] = round_bf16(0.02f * normal(5, uint64_t(i), 0));
      teacher_[size_t(i)] = w0[size_t(i)] + 0.02f * normal(6, uint64_t(i), 0);
    }
    eval_ = make_batch(uint64_t(1) << 40, kEval);  // held out: ids no training batch uses
  }
  const char* name() const override { return "logistic"; }
  void begin_step(int64_t step) override {
    batch_ = make_batch(uint64_t(step) * kBatch, kBatch);
  }
  void grad(const float* w, float* g, int64_t, ThreadPool&) override {
    std::fill(g, g + n_, 0.0f);
    for (int b = 0; b < kBatch; ++b) {
      const float err = float(sigmoid(margin(batch_, b, w)) - batch_.y[size_t(b)]) / kBatch;
      for (int a = 0; a < kActive; ++a) {
        const size_t k = size_t(b) * kActive + size_t(a);
        g[batch_.idx[k]] += err * batch_.val[k];
      }
    }
  }
  double loss(const float* w) override {
    double s = 0;
    for (int b = 0; b < kEval; ++b) {
      const double p = sigmoid(margin(eval_, b, w)), y = eval_.y[size_t(b)];
      s -= y * std::log(std::max(p, 1e-12)) + (1 - y) * std::log(std::max(1 - p, 1e-12));
    }
    return s / kEval;
  }

 private:
  // Samples with kActive random features each (values ~ N(0, 1)) and teacher-drawn labels.
  struct Batch {
    std::vector<int64_t> idx;
    std::vector<float> val, y;
  };
  Batch make_batch(uint64_t first_id, int count) const {
    Batch bt;
    bt.idx.resize(size_t(count) * kActive);
    bt.val.resize(bt.idx.size());
    bt.y.resize(size_t(count));
    for (int b = 0; b < count; ++b) {
      const uint64_t id = first_id + uint64_t(b);
      for (int a = 0; a < kActive; ++a) {
        const size_t k = size_t(b) * kActive + size_t(a);
        bt.idx[k] = std::min(n_ - 1, int64_t(uniform(10, id, uint64_t(a)) * float(n_)));
        bt.val[k] = normal(11, id, uint64_t(a));
      }
      const double pt = sigmoid(margin(bt, b, teacher_.data()));
      bt.y[size_t(b)] = uniform(9, id, 0) < pt ? 1.0f : 0.0f;
    }
    return bt;
  }
  static double margin(const Batch& bt, int b, const float* w) {
    double s = 0;
    for (int a = 0; a < kActive; ++a) {
      const size_t k = size_t(b) * kActive + size_t(a);
      s += double(w[bt.idx[k]]) * bt.val[k];
    }
    return s;
  }
  static double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

  int64_t n_;
  std::vector<float> teacher_;
  Batch batch_, eval_;
};

enum class Master : uint8_t { fp32, bf16_rne, bf16_sr, bf16_kahan };
const char* master_name(Master k) {
  switch (k) {
    case Master::fp32: return "fp32";
    case Master::bf16_rne: return "bf16-rne";
    case Master::bf16_sr: return "bf16-sr";
    case Master::bf16_kahan: return "bf16-kahan";
  }
  return "?";
}

// One variant's state: master (fp32, or bf16 bits + compensation), fp32 m and v.
struct Run {
  Master kind;
  int64_t n;
  std::vector<float> w32, m, v, tmp;
  std::vector<uint16_t> wb, comp;
  StateUnit unit;
  UnitStateLayout layout;
  Run(Master k, const std::vector<float>& w0) : kind(k), n(int64_t(w0.size())) {
    w32 = w0;
    m.assign(w0.size(), 0.f);
    v.assign(w0.size(), 0.f);
    tmp.resize(w0.size());
    wb.resize(w0.size());
    comp.assign(w0.size(), 0);
    for (size_t i = 0; i < w0.size(); ++i) wb[i] = f32_to_bf16(w0[i]);
    if (k != Master::fp32)
      for (size_t i = 0; i < w0.size(); ++i) w32[i] = bf16_to_f32(wb[i]);
    unit.numel = n;
    unit.ranges = {{0, n, true}};
    layout = unit_state_layout(unit, {MomentFormat::f32, MasterFormat::bf16});
  }
  // The weights a bf16 forward pass sees.
  void compute_weights(float* out) const {
    for (int64_t i = 0; i < n; ++i) out[i] = round_bf16(w32[size_t(i)]);
  }
  void step(const float* g, const AdamWStep& s, ThreadPool& pool) {
    switch (kind) {
      case Master::fp32:
        adamw_update(w32.data(), m.data(), v.data(), g, nullptr, n, s, &pool);
        return;
      case Master::bf16_sr: {
        const UnitStateView view{{MomentFormat::f32, MasterFormat::bf16}, &layout, wb.data(),
                                 m.data(), v.data(), nullptr, nullptr, 77, 0};
        adamw_update_state(view, 0, n, g, nullptr, unit.ranges, s, &pool);
        break;
      }
      case Master::bf16_rne:
        adamw_update(w32.data(), m.data(), v.data(), g, wb.data(), n, s, &pool);  // wb = RNE
        break;
      case Master::bf16_kahan:
        // The update the fp32 arithmetic makes from the bf16 weight, plus what earlier
        // roundings dropped, is added and the new remainder kept (in bf16).
        tmp = w32;
        adamw_update(tmp.data(), m.data(), v.data(), g, nullptr, n, s, &pool);
        for (int64_t i = 0; i < n; ++i) {
          const size_t k = size_t(i);
          const float y = (tmp[k] - w32[k]) + bf16_to_f32(comp[k]);
          const uint16_t t = f32_to_bf16(w32[k] + y);
          comp[k] = f32_to_bf16(y - (bf16_to_f32(t) - w32[k]));
          wb[k] = t;
        }
        break;
    }
    for (int64_t i = 0; i < n; ++i) w32[size_t(i)] = bf16_to_f32(wb[size_t(i)]);
  }
};

void report(Problem& prob, const std::vector<std::unique_ptr<Run>>& runs, int64_t step) {
  const Run& ref = *runs[0];
  double disp = 0, norm = 0;
  for (int64_t i = 0; i < ref.n; ++i) {
    const double d = double(ref.w32[size_t(i)]) - prob.w0[size_t(i)];
    disp += d * d;
    norm += double(ref.w32[size_t(i)]) * ref.w32[size_t(i)];
  }
  // The floor for any bf16 weight: the fp32 run's weights rounded to bf16.
  double f2 = 0;
  for (int64_t i = 0; i < ref.n; ++i) {
    const double d = double(round_bf16(ref.w32[size_t(i)])) - ref.w32[size_t(i)];
    f2 += d * d;
  }
  std::printf("%-9s step %6lld  %-10s  |w - w_fp32| / |w_fp32 - w0| %9.3e   / |w_fp32| %9.3e\n",
              prob.name(), (long long)step, "(bf16 floor)", std::sqrt(f2 / disp),
              std::sqrt(f2 / norm));
  for (const auto& r : runs) {
    double d2 = 0;
    for (int64_t i = 0; i < ref.n; ++i) {
      const double d = double(r->w32[size_t(i)]) - ref.w32[size_t(i)];
      d2 += d * d;
    }
    std::printf("%-9s step %6lld  %-10s  |w - w_fp32| / |w_fp32 - w0| %9.3e   / |w_fp32| %9.3e"
                "   loss %.6f\n",
                prob.name(), (long long)step, master_name(r->kind), std::sqrt(d2 / disp),
                std::sqrt(d2 / norm), prob.loss(r->w32.data()));
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) try {
  int64_t steps = 10000, n = 100000, every = 2500;
  float lr = 2e-5f;
  int threads = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      SF_REQUIRE(i + 1 < argc, a, " needs a value");
      return argv[++i];
    };
    if (a == "--steps") steps = std::atoll(next().c_str());
    else if (a == "--n") n = std::atoll(next().c_str());
    else if (a == "--lr") lr = float(std::atof(next().c_str()));
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--report") every = std::atoll(next().c_str());
    else SF_REQUIRE(false, "unknown flag ", a,
                    " (flags: --steps N --n N --lr X --threads N --report N)");
  }
  SF_REQUIRE(steps >= 1 && n >= 1 && every >= 1 && lr > 0,
             "--steps, --n, --report must be >= 1 and --lr > 0");
  ThreadPool pool(threads);
  std::printf("bench_master_rounding: %lld weights, %lld steps, lr %g, AdamW betas 0.9/0.999, "
              "weight decay 0.01\n", (long long)n, (long long)steps, double(lr));
  std::vector<std::unique_ptr<Problem>> problems;
  problems.push_back(std::make_unique<Quadratic>(n));
  problems.push_back(std::make_unique<Logistic>(n));
  for (auto& prob : problems) {
    std::vector<std::unique_ptr<Run>> runs;
    for (Master k : {Master::fp32, Master::bf16_rne, Master::bf16_sr, Master::bf16_kahan})
      runs.push_back(std::make_unique<Run>(k, prob->w0));
    std::vector<float> w(static_cast<size_t>(n)), g(static_cast<size_t>(n));
    for (int64_t t = 1; t <= steps; ++t) {
      AdamWStep s;
      s.lr = lr;
      s.weight_decay = 0.01f;
      s.step = t;
      prob->begin_step(t);
      for (auto& r : runs) {
        r->compute_weights(w.data());
        prob->grad(w.data(), g.data(), t, pool);
        r->step(g.data(), s, pool);
      }
      if (t % every == 0 || t == steps) report(*prob, runs, t);
    }
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_master_rounding: %s\n", e.what());
  return 1;
}
