// Gradient checks of the ReferenceModel (and so of every recipe and host op it uses) against
// central finite differences, for every parameter kind of every architecture.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <set>

#include "model/model_test_util.h"

namespace sf::test {
namespace {

struct GradCheckCase {
  const char* name;
  Arch arch;
  bool tied;
};
void PrintTo(const GradCheckCase& c, std::ostream* os) { *os << c.name; }

class GradCheck : public ::testing::TestWithParam<GradCheckCase> {};

// Richardson-extrapolated central difference of the loss along `dir` (slot-sized) in unit
// `unit`: R = (4 D(h/2) - D(h)) / 3 with D(h) = (f(+h) - f(-h)) / 2h, truncation O(h^4).
double fd_derivative(Fixture& f, const Batch& b, int unit, const ParamSlot& slot,
                     const std::vector<double>& dir, double h) {
  auto eval = [&](double t) {
    std::vector<float> p = f.params[size_t(unit)];
    for (size_t i = 0; i < dir.size(); ++i)
      p[size_t(slot.offset) + i] = float(double(p[size_t(slot.offset) + i]) + t * dir[i]);
    f.model->set_unit_weights(unit, p.data());
    return f.model->forward(b);
  };
  const double d1 = (eval(h) - eval(-h)) / (2 * h);
  const double d2 = (eval(h / 2) - eval(-h / 2)) / h;
  f.model->set_unit_weights(unit, f.params[size_t(unit)].data());
  return (4 * d2 - d1) / 3;
}

// Tolerances (fp32 host backend), |fd - an| <= kAtol + kRtol |an|:
//  - kH = 0.02: the step of the Richardson difference along a unit-norm direction (or one
//    element). Measured: at 0.02 the O(h^4) truncation error stays below ~5e-5 relative even
//    along the gradient, while at 0.05 some single-element checks are already off by 5e-2
//    (the norms and softmax are far from polynomial at that scale), and below 0.01 the noise
//    term below dominates.
//  - kAtol = 1.5e-3: rounding noise. The loss (~35 here) comes back as an f32 sum, so every
//    evaluation carries a few ulp(35) ~ 4e-6 of noise; the Richardson weights amplify it by
//    (4/3)/h + (1/3)/(2h) ~ 75, i.e. ~3e-4 per ulp. Observed worst: ~6e-4.
//  - kRtol = 5e-4: truncation plus fp32 rounding of the analytic gradient (observed <= 6e-5).
// A wrong gradient shows up far above this: typical directional derivatives are 0.02-40, and
// a 1% scale error along the gradient direction alone is 0.02-0.4.
constexpr double kH = 0.02, kAtol = 1.5e-3, kRtol = 5e-4;

TEST_P(GradCheck, EveryParameterKind) {
  const GradCheckCase& tc = GetParam();
  ModelConfig cfg = tiny_config(tc.arch, tc.tied);
  Fixture f(cfg, 16, 1234 + uint64_t(tc.arch) * 7 + tc.tied, gradcheck_init());
  std::mt19937_64 g(99 + uint64_t(tc.arch));
  // Two packed sequences of different lengths; besides the last token of each sequence, the
  // labels at tokens 2 and 9 are ignored.
  Batch b = pack({random_tokens(7, cfg.vocab_size, g), random_tokens(5, cfg.vocab_size, g)},
                 {2, 9});
  f.model->zero_grads();
  f.model->forward_backward(b, 1.f);
  auto grads = f.grads();

  // Every parameter kind the architecture has must be checked.
  std::set<ParamKind> expected = {ParamKind::embedding, ParamKind::attn_norm, ParamKind::wqkv,
                                  ParamKind::wo,        ParamKind::mlp_norm,  ParamKind::w_gate_up,
                                  ParamKind::w_down,    ParamKind::final_norm};
  if (!tc.tied) expected.insert(ParamKind::lm_head);
  if (cfg.qkv_bias) expected.insert(ParamKind::bqkv);
  if (cfg.qk_norm) expected.insert({ParamKind::q_norm, ParamKind::k_norm});
  std::set<ParamKind> checked;

  std::normal_distribution<double> nd;
  double worst = 0;
  int n_checks = 0;
  for (int u = 0; u < f.model->n_units(); ++u) {
    const Unit& unit = f.model->layout().units[size_t(u)];
    for (const ParamSlot& slot : unit.params) {
      const std::string kind(param_kind_name(slot.kind));
      const size_t n = size_t(slot.numel());
      const float* gs = grads[size_t(u)].data() + slot.offset;
      double gnorm = 0;
      for (size_t i = 0; i < n; ++i) gnorm += double(gs[i]) * gs[i];
      gnorm = std::sqrt(gnorm);
      ASSERT_GT(gnorm, 1e-3) << "unit " << u << " " << kind << ": (near) zero gradient";
      // Directions: the gradient itself (checks the magnitude), three random unit vectors
      // (check the direction), and single elements (largest |g| and three random ones).
      std::vector<std::pair<std::string, std::vector<double>>> dirs;
      std::vector<double> d(n);
      for (size_t i = 0; i < n; ++i) d[i] = gs[i] / gnorm;
      dirs.push_back({"gradient direction", d});
      for (int r = 0; r < 3; ++r) {
        double nn = 0;
        for (auto& x : d) {
          x = nd(g);
          nn += x * x;
        }
        for (auto& x : d) x /= std::sqrt(nn);
        dirs.push_back({"random direction", d});
      }
      size_t imax = 0;
      for (size_t i = 1; i < n; ++i) imax = std::fabs(gs[i]) > std::fabs(gs[imax]) ? i : imax;
      std::uniform_int_distribution<size_t> ui(0, n - 1);
      for (size_t i : {imax, ui(g), ui(g), ui(g)}) {
        std::fill(d.begin(), d.end(), 0.0);
        d[i] = 1;
        dirs.push_back({"element " + std::to_string(i), d});
      }
      for (auto& [what, dir] : dirs) {
        double an = 0;
        for (size_t i = 0; i < n; ++i) an += dir[i] * gs[i];
        const double fd = fd_derivative(f, b, u, slot, dir, kH);
        const double err = std::fabs(fd - an);
        worst = std::max(worst, err / (kAtol + kRtol * std::fabs(an)));
        ++n_checks;
        EXPECT_LE(err, kAtol + kRtol * std::fabs(an))
            << tc.name << " unit " << u << " " << kind << ", " << what << ": analytic " << an
            << " finite difference " << fd << " (|grad| of the slot " << gnorm << ")";
      }
      checked.insert(slot.kind);
    }
  }
  EXPECT_EQ(checked, expected);
  std::printf("%s: %d checks, worst error / tolerance = %.3f\n", tc.name, n_checks, worst);
}

INSTANTIATE_TEST_SUITE_P(
    Archs, GradCheck,
    ::testing::Values(GradCheckCase{"llama", Arch::llama, false},
                      GradCheckCase{"llama_tied", Arch::llama, true},
                      GradCheckCase{"mistral", Arch::mistral, false},
                      GradCheckCase{"qwen2", Arch::qwen2, false},
                      GradCheckCase{"qwen3", Arch::qwen3, false},
                      GradCheckCase{"qwen3_tied", Arch::qwen3, true}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace sf::test
