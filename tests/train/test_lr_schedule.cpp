// LR schedules against transformers' Trainer / TRL, step for step: the values of
// tests/data/lr_schedule/vectors.json (scripts/gen_lr_schedule_vectors.py), the warmup
// convention (step 1 at lr 0, the peak at step W + 1), the decay end (the minimum one step past
// the last), linear decay to a minimum, and a trainer run whose first step is at lr 0 (the
// weights stay, the AdamW moments and step count advance, as torch.optim.AdamW does).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "train/checkpoint.h"
#include "train/lr_schedule.h"
#include "train_test_util.h"

namespace sf::test {
namespace {

using Kind = LrSchedule::Kind;

LrSchedule sched(Kind k, double lr, int64_t warmup, int64_t total, double min_ratio) {
  LrSchedule s;
  s.kind = k;
  s.lr = lr;
  s.warmup_steps = warmup;
  s.total_steps = total;
  s.min_lr_ratio = min_ratio;
  return s;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  SF_REQUIRE(f, "cannot open ", p.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// Tolerance: relative 1e-12. Each value is a handful of double operations in the same order
// as transformers' Python (so in practice equal to the last bit; std::cos and Python's
// math.cos are the same libm call); 1e-12 leaves room for a libm that rounds cos differently
// by an ulp, while any convention change (a shifted step is off by >= 1e-3 relative) fails.
constexpr double kRel = 1e-12;

void expect_lr(double got, double want, const std::string& what) {
  if (want == 0.0)
    EXPECT_EQ(got, 0.0) << what;  // an exact zero (warmup's first step) must stay exact
  else
    EXPECT_LE(std::abs(got - want), kRel * std::abs(want)) << what << ": " << got << " vs " << want;
}

TEST(LrSchedule, MatchesTransformersTrainerStepForStep) {
  const nlohmann::json v = read_json(source_dir() / "tests/data/lr_schedule/vectors.json");
  const auto& cases = v.at("cases");
  ASSERT_GE(cases.size(), 10u);
  int kinds_seen[3] = {0, 0, 0};
  int with_min = 0, bit_equal = 0, compared = 0;
  for (const auto& c : cases) {
    LrSchedule s = sched(LrSchedule::parse_kind(c.at("kind").get<std::string>()),
                         c.at("lr").get<double>(), c.at("warmup_steps").get<int64_t>(),
                         c.at("total_steps").get<int64_t>(), c.at("min_lr_ratio").get<double>());
    kinds_seen[int(s.kind)]++;
    with_min += s.min_lr_ratio > 0;
    const auto& lrs = c.at("lr_per_step");
    ASSERT_EQ(int64_t(lrs.size()), s.total_steps);
    for (int64_t step = 1; step <= s.total_steps; ++step) {
      const double want = lrs.at(size_t(step - 1)).get<double>();
      const double got = s.at(step);
      expect_lr(got, want,
                cat(c.at("transformers_scheduler").get<std::string>(), " warmup ", s.warmup_steps,
                    " total ", s.total_steps, " min ", s.min_lr_ratio, " step ", step));
      bit_equal += got == want;
      ++compared;
    }
  }
  EXPECT_GT(kinds_seen[int(Kind::constant)], 0);
  EXPECT_GT(kinds_seen[int(Kind::cosine)], 0);
  EXPECT_GT(kinds_seen[int(Kind::linear)], 0);
  EXPECT_GT(with_min, 0);
  // Informational: how many agree to the bit (all of them with glibc).
  RecordProperty("bit_equal", cat(bit_equal, "/", compared));
}

TEST(LrSchedule, WarmupStartsAtZeroAndReachesThePeakAtStepWPlusOne) {
  for (Kind k : {Kind::constant, Kind::cosine, Kind::linear}) {
    auto s = sched(k, 1e-3, 4, 20, 0.1);
    const char* name = LrSchedule::kind_name(k);
    EXPECT_EQ(s.at(1), 0.0) << name;  // transformers: lambda(0) = 0 / W
    EXPECT_EQ(s.at(2), 1e-3 * (1.0 / 4.0)) << name;
    EXPECT_EQ(s.at(3), 1e-3 * (2.0 / 4.0)) << name;
    EXPECT_EQ(s.at(4), 1e-3 * (3.0 / 4.0)) << name;  // the last warmup step is below the peak
    EXPECT_EQ(s.at(5), 1e-3) << name;                 // step W + 1: exactly the peak
    if (k == Kind::constant)
      EXPECT_EQ(s.at(6), 1e-3);
    else
      EXPECT_LT(s.at(6), 1e-3) << name;  // the decay starts right after the peak step
  }
  // No warmup: the first step is at the peak.
  for (Kind k : {Kind::constant, Kind::cosine, Kind::linear})
    EXPECT_EQ(sched(k, 2e-4, 0, 10, 0.1).at(1), 2e-4) << LrSchedule::kind_name(k);
}

TEST(LrSchedule, DecayReachesItsMinimumOneStepPastTheLast) {
  const double pi = std::acos(-1.0);
  auto cos_s = sched(Kind::cosine, 1e-3, 2, 12, 0.1);
  // k = step - 1; decay over k = 2..12 with progress (k - 2) / 10: the last step (k = 11) is at
  // progress 0.9, the minimum comes at k = 12.
  for (int64_t step = 3; step <= 12; ++step) {
    const double p = double(step - 3) / 10.0;
    expect_lr(cos_s.at(step), 1e-3 * ((0.5 * (1 + std::cos(pi * p))) * 0.9 + 0.1), cat(step));
  }
  expect_lr(cos_s.at(8), 1e-3 * 0.55, "half way");
  EXPECT_GT(cos_s.at(12), 1e-4 * 1.01);  // the last step still learns
  expect_lr(cos_s.at(13), 1e-4, "one past the end");
  expect_lr(cos_s.at(1000), 1e-4, "far past the end: held at the minimum");
  for (int64_t step = 3; step < 13; ++step) EXPECT_GT(cos_s.at(step), cos_s.at(step + 1)) << step;

  auto lin = sched(Kind::linear, 2e-3, 0, 4, 0.0);  // transformers: (N - k) / (N - W)
  EXPECT_EQ(lin.at(1), 2e-3);
  expect_lr(lin.at(2), 1.5e-3, "linear 2");
  expect_lr(lin.at(3), 1e-3, "linear 3");
  expect_lr(lin.at(4), 0.5e-3, "linear 4");
  EXPECT_EQ(lin.at(5), 0.0);
  EXPECT_EQ(lin.at(50), 0.0);
}

// transformers has no linear decay to a minimum; ours uses cosine_with_min_lr's rescaling,
// lambda = f * (1 - r) + r, so r = 0 is transformers' linear schedule exactly.
TEST(LrSchedule, LinearDecaysToTheMinimumLikeCosineWithMinLr) {
  auto s = sched(Kind::linear, 1e-3, 3, 10, 0.2);
  for (int64_t step = 4; step <= 10; ++step) {
    const int64_t k = step - 1;
    expect_lr(s.at(step), 1e-3 * (double(10 - k) / 7.0 * 0.8 + 0.2), cat(step));
  }
  EXPECT_EQ(s.at(4), 1e-3);
  expect_lr(s.at(11), 2e-4, "one past the end");
  expect_lr(s.at(99), 2e-4, "far past the end");
  // The constant schedule ignores min_lr_ratio.
  auto c = sched(Kind::constant, 3e-4, 3, 100, 0.1);
  EXPECT_EQ(c.at(4), 3e-4);
  EXPECT_EQ(c.at(100), 3e-4);
  EXPECT_EQ(c.at(5000), 3e-4);
}

TEST(LrSchedule, KindNamesAndStepZero) {
  for (Kind k : {Kind::constant, Kind::cosine, Kind::linear})
    EXPECT_EQ(LrSchedule::parse_kind(LrSchedule::kind_name(k)), k);
  EXPECT_THROW(LrSchedule::parse_kind("exp"), Error);
  EXPECT_THROW(sched(Kind::cosine, 1e-3, 2, 10, 0.0).at(0), Error);  // steps are 1-based
}

std::vector<nlohmann::json> metrics_lines(const fs::path& p) {
  std::vector<nlohmann::json> v;
  std::ifstream f(p);
  std::string l;
  while (std::getline(f, l)) v.push_back(nlohmann::json::parse(l));
  return v;
}

// A trainer run with warmup: step 1 runs at lr 0, so (as torch.optim.AdamW at lr 0) the
// weights are bit for bit the initial ones while the moments and the step count advance; the
// metrics log the lr each step ran at, and a resumed run continues the same sequence.
class LrZeroFirstStep : public ::testing::TestWithParam<const char*> {};

TEST_P(LrZeroFirstStep, KeepsTheWeightsAndAdvancesTheMoments) {
  TempDir tmp("sf-lr0");
  const fs::path model = make_tiny_model(tmp.path / "model");
  const fs::path tokens = make_tokens(tmp.path / "tokens.bin", 400);
  TrainOptions o = tiny_run(model, tokens, tmp.path / "run");  // warmup 2, 6 steps, cosine
  o.engine = GetParam();
  o.eval_every = 0;
  TrainResult a = run_stopping(o, 1);
  ASSERT_EQ(a.end_step, 1);
  ASSERT_EQ(a.checkpoint.filename(), "checkpoint-1");

  expect_same_tensors(model / "model.safetensors", a.checkpoint / "model.safetensors");
  const nlohmann::json st = read_trainer_state(a.checkpoint);
  EXPECT_EQ(st.at("optimizer_step"), 1);
  for (const char* f : {"resume/adam_m.safetensors", "resume/adam_v.safetensors"}) {
    SafetensorsFile moments(a.checkpoint / f);
    int64_t nonzero = 0, total = 0;
    for (auto& t : moments.tensors())
      for (float x : moments.read_f32(t.name)) nonzero += x != 0.0f, ++total;
    // Every parameter of the tiny model gets a gradient (embedding rows of unseen tokens aside).
    EXPECT_GT(nonzero, total / 2) << f;
  }

  o.resume = "auto";
  std::ostringstream log;
  TrainResult b = run_training(o, log);
  ASSERT_EQ(b.end_step, 6);
  auto m = metrics_lines(o.out_dir / "metrics.jsonl");
  ASSERT_EQ(m.size(), 6u);
  // transformers' lrs for this run (cosine_with_min_lr, lr 1e-2, warmup 2, 6 steps, 0.1).
  const nlohmann::json v = read_json(source_dir() / "tests/data/lr_schedule/vectors.json");
  const nlohmann::json* want = nullptr;
  for (const auto& c : v.at("cases"))
    if (c.at("kind") == "cosine" && c.at("lr") == o.schedule.lr &&
        c.at("warmup_steps") == o.schedule.warmup_steps && c.at("total_steps") == o.steps &&
        c.at("min_lr_ratio") == o.schedule.min_lr_ratio)
      want = &c.at("lr_per_step");
  ASSERT_NE(want, nullptr) << "vectors.json lacks tiny_run's schedule";
  for (int64_t step = 1; step <= 6; ++step) {
    EXPECT_EQ(m[size_t(step - 1)].at("step"), step);
    // The metrics hold h.lr, the double the step ran at (AdamW takes it as float).
    expect_lr(m[size_t(step - 1)].at("lr").get<double>(), want->at(size_t(step - 1)).get<double>(),
              cat("metrics step ", step));
  }
  EXPECT_EQ(m[0].at("lr").get<double>(), 0.0);
  EXPECT_EQ(m[2].at("lr").get<double>(), 1e-2);  // step W + 1 = 3: the peak
}

INSTANTIATE_TEST_SUITE_P(Engines, LrZeroFirstStep, ::testing::Values("auto", "sliding"),
                         [](const auto& i) {
                           return std::string(i.param) == "sliding" ? "Sliding" : "Resident";
                         });

}  // namespace
}  // namespace sf::test
