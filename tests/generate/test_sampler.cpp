// Sampler: greedy is torch.argmax (first index of the maximum), top-k 1 is greedy at any
// temperature, one seed gives one sequence, top-k and top-p keep exactly the tokens
// transformers' warpers keep, draws follow the softmax, and the repetition penalty follows
// transformers' rule (divide positive logits, multiply negative ones).
// Every draw here comes from a fixed seed, so the counts below are fixed numbers: the bounds
// only say how far from the probabilities such counts may lie (5 standard deviations).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "core/error.h"
#include "generate/sampler.h"
#include "test_util.h"

namespace sf {
namespace {

std::vector<float> log_probs(const std::vector<double>& p) {
  std::vector<float> l;
  for (double x : p) l.push_back(float(std::log(x)));
  return l;
}

std::map<int32_t, int> draw(Sampler& s, const std::vector<float>& logits, int n) {
  std::map<int32_t, int> count;
  for (int i = 0; i < n; ++i) ++count[s.next(logits, {})];
  return count;
}

TEST(Sampler, GreedyIsTheFirstLargestLogit) {
  Sampler s({});
  EXPECT_TRUE(s.greedy());
  EXPECT_EQ(s.next(std::vector<float>{0.f, 3.f, -1.f, 3.f, 2.f}, {}), 1);
  EXPECT_EQ(s.next(std::vector<float>{-5.f, -4.f}, {}), 1);
}

TEST(Sampler, TopK1IsGreedyAtAnyTemperatureAndSeed) {
  Sampler greedy({});
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const std::vector<float> l = test::random_vec(97, seed, -3.f, 3.f);
    Sampler s({1.5, 1, 1.0, 1.0, seed});
    EXPECT_EQ(s.next(l, {}), greedy.next(l, {})) << "seed " << seed;
  }
}

TEST(Sampler, OneSeedOneSequence) {
  const std::vector<float> l = test::random_vec(50, 4, -2.f, 2.f);
  auto run = [&](uint64_t seed) {
    Sampler s({1.0, 0, 0.95, 1.0, seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.next(l, out));
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
}

TEST(Sampler, TopKKeepsTheKLargestAndTiesWithTheKth) {
  const std::vector<float> l = {1.f, 4.f, 3.f, 2.f, 3.f, 0.f};
  Sampler s({1.0, 2, 1.0, 1.0, 7});
  const auto c = draw(s, l, 3000);
  // k = 2: logits 4 and 3; the other 3 ties with the 2nd largest and stays (as transformers).
  EXPECT_EQ(c.size(), 3u);
  for (int32_t t : {1, 2, 4}) EXPECT_GT(c.count(t) ? c.at(t) : 0, 0) << "token " << t;
}

TEST(Sampler, TopPDropsTheTailWhoseMassIsAtMostOneMinusP) {
  // Probabilities 0.5, 0.3, 0.15, 0.05; p = 0.75: the tail 0.05 + 0.15 = 0.2 <= 0.25 goes,
  // 0.3 more would pass 0.25, so tokens 0 and 1 stay, renormalised to 0.625 / 0.375.
  const std::vector<float> l = log_probs({0.5, 0.3, 0.15, 0.05});
  Sampler s({1.0, 0, 0.75, 1.0, 3});
  const int n = 8000;
  const auto c = draw(s, l, n);
  ASSERT_EQ(c.size(), 2u);
  const double sd = std::sqrt(n * 0.625 * 0.375);
  EXPECT_NEAR(c.at(0), n * 0.625, 5 * sd);
  // p small: only the most likely token is left.
  Sampler tight({1.0, 0, 0.1, 1.0, 3});
  EXPECT_EQ(draw(tight, l, 200).size(), 1u);
}

TEST(Sampler, DrawsFollowTheSoftmaxOfLogitsOverTemperature) {
  const std::vector<double> p = {0.4, 0.3, 0.2, 0.1};
  // Temperature 2 on logits 2 log p: the softmax is p again.
  std::vector<float> l;
  for (double x : p) l.push_back(float(2 * std::log(x)));
  Sampler s({2.0, 0, 1.0, 1.0, 11});
  const int n = 20000;
  const auto c = draw(s, l, n);
  for (size_t i = 0; i < p.size(); ++i)
    EXPECT_NEAR(c.at(int32_t(i)), n * p[i], 5 * std::sqrt(n * p[i] * (1 - p[i]))) << "token " << i;
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  Sampler s({0.0, 0, 1.0, 2.0, 0});
  // Token 0 (2.0) was seen: 2.0 / 2 = 1.0 < 1.9, so token 1 wins.
  EXPECT_EQ(s.next(std::vector<float>{2.f, 1.9f, -1.f}, std::vector<int32_t>{0}), 1);
  // Negative logits grow more negative: -0.5 * 2 = -1.0 < -0.8.
  EXPECT_EQ(s.next(std::vector<float>{-0.5f, -0.8f, -3.f}, std::vector<int32_t>{0, 0}), 1);
  // Unseen tokens are untouched.
  EXPECT_EQ(s.next(std::vector<float>{2.f, 1.9f, -1.f}, std::vector<int32_t>{2}), 0);
}

TEST(Sampler, RefusesValuesOutsideTheirRanges) {
  EXPECT_THROW(Sampler({-1.0, 0, 1.0, 1.0, 0}), Error);
  EXPECT_THROW(Sampler({1.0, -2, 1.0, 1.0, 0}), Error);
  EXPECT_THROW(Sampler({1.0, 0, 0.0, 1.0, 0}), Error);
  EXPECT_THROW(Sampler({1.0, 0, 1.5, 1.0, 0}), Error);
  EXPECT_THROW(Sampler({1.0, 0, 1.0, 0.0, 0}), Error);
}

}  // namespace
}  // namespace sf
