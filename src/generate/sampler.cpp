#include "generate/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace sf {

Sampler::Sampler(const SamplingOptions& opt) : opt_(opt), rng_(opt.seed) {
  SF_REQUIRE(std::isfinite(opt.temperature) && opt.temperature >= 0, "temperature ",
             opt.temperature, " must be 0 (greedy) or positive");
  SF_REQUIRE(opt.top_k >= 0, "top-k ", opt.top_k, " must be 0 (off) or positive");
  SF_REQUIRE(opt.top_p > 0 && opt.top_p <= 1, "top-p ", opt.top_p,
             " must be in (0, 1] (1: off)");
  SF_REQUIRE(std::isfinite(opt.repetition_penalty) && opt.repetition_penalty > 0,
             "repetition penalty ", opt.repetition_penalty, " must be positive (1: off)");
}

double Sampler::uniform() {
  return double(rng_() >> 11) * 0x1.0p-53;  // 53 random bits: exact, and the same everywhere
}

std::vector<int32_t> Sampler::kept_tokens(const std::vector<float>& scores) const {
  std::vector<int32_t> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return scores[size_t(a)] > scores[size_t(b)]; });
  if (opt_.top_k > 0 && size_t(opt_.top_k) < order.size()) {
    const float kth = scores[size_t(order[size_t(opt_.top_k) - 1])];
    size_t n = size_t(opt_.top_k);
    while (n < order.size() && scores[size_t(order[n])] >= kth) ++n;  // ties with the k-th stay
    order.resize(n);
  }
  if (opt_.top_p < 1) {
    const double top = scores[size_t(order.front())];
    std::vector<double> p(order.size());
    double sum = 0;
    for (size_t i = 0; i < order.size(); ++i) sum += p[i] = std::exp(double(scores[size_t(order[i])]) - top);
    // Drop from the least likely end while the dropped mass stays <= 1 - top_p.
    double dropped = 0;
    size_t n = order.size();
    while (n > 1 && dropped + p[n - 1] / sum <= 1 - opt_.top_p) dropped += p[--n] / sum;
    order.resize(n);
  }
  return order;
}

int32_t Sampler::next(std::span<const float> logits, std::span<const int32_t> context) {
  SF_CHECK(!logits.empty(), "Sampler::next: no logits");
  scores_.assign(logits.begin(), logits.end());
  if (opt_.repetition_penalty != 1) {
    std::vector<int32_t> seen(context.begin(), context.end());
    std::sort(seen.begin(), seen.end());
    seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
    const float r = float(opt_.repetition_penalty);
    for (int32_t t : seen) {
      if (t < 0 || size_t(t) >= scores_.size()) continue;
      float& s = scores_[size_t(t)];
      s = s < 0 ? s * r : s / r;
    }
  }
  if (greedy())
    return int32_t(std::max_element(scores_.begin(), scores_.end()) - scores_.begin());
  for (float& s : scores_) s = float(double(s) / opt_.temperature);
  const std::vector<int32_t> kept = kept_tokens(scores_);
  const double top = scores_[size_t(kept.front())];
  std::vector<double> p(kept.size());
  double sum = 0;
  for (size_t i = 0; i < kept.size(); ++i) sum += p[i] = std::exp(double(scores_[size_t(kept[i])]) - top);
  double u = uniform() * sum;
  for (size_t i = 0; i < kept.size(); ++i) {
    if (u < p[i]) return kept[i];
    u -= p[i];
  }
  return kept.back();  // u landed in the rounding of the last subtraction
}

}  // namespace sf
