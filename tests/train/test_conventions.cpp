// The conventions people bring from TRL / Axolotl / torchtune, end to end on the host backend:
// --epochs and --warmup-ratio, YAML config files, the full fine-tuning default learning rate
// and its warnings, a diverged run stopping with the last good checkpoint intact, a resume
// with a changed learning rate, and the TensorBoard / CSV logs.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>

#include "train/checkpoint.h"
#include "train_test_util.h"
#include "tfevents_reader.h"

namespace sf::test {
namespace {

bool contains(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }

std::vector<nlohmann::json> read_jsonl(const fs::path& p) {
  std::vector<nlohmann::json> v;
  std::ifstream f(p);
  for (std::string l; std::getline(f, l);) v.push_back(nlohmann::json::parse(l));
  return v;
}

std::vector<fs::path> event_files(const fs::path& out) {
  std::vector<fs::path> v;
  if (!fs::exists(out / "tensorboard")) return v;
  for (auto& e : fs::directory_iterator(out / "tensorboard"))
    if (contains(e.path().filename().string(), "tfevents")) v.push_back(e.path());
  return v;
}

struct Fixture {
  TempDir tmp{"sf-conventions"};
  fs::path model = make_tiny_model(tmp.path / "model");
  // 400 tokens: 40 held out, 360 for training = 22 rows of 16 + 1 tokens (stride 16).
  fs::path tokens = make_tokens(tmp.path / "tokens.bin", 400);
  static constexpr int64_t kRows = 22;
};

TEST(Conventions, EpochsDeriveTheStepsFromTheData) {
  Fixture fx;
  std::ostringstream log;
  for (double epochs : {0.5, 1.0, 2.0}) {
    TrainOptions o = tiny_run(fx.model, fx.tokens, fx.tmp.path / ("e" + std::to_string(epochs)));
    o.epochs = epochs;
    o.eval_every = 0;
    // 4 rows per step (2 x 2): ceil(epochs x 22 / 4).
    const int64_t want = int64_t(std::ceil(epochs * double(Fixture::kRows) / 4.0));
    TrainResult r = run_training(o, log);
    EXPECT_EQ(r.total_steps, want) << epochs;
    EXPECT_EQ(r.end_step, want) << epochs;
    EXPECT_EQ(int64_t(r.losses.size()), want);
    EXPECT_EQ(read_trainer_state(r.checkpoint).at("schedule").at("total_steps"), want);
  }
  EXPECT_EQ(epoch_steps(1, 22, 2, 2), 6);
  EXPECT_EQ(epoch_steps(3, 8, 8, 1), 3);
  EXPECT_EQ(epoch_steps(0.01, 8, 8, 1), 1);  // at least one step
}

TEST(Conventions, WarmupRatioIsCeilOfTheShareOfSteps) {
  Fixture fx;
  std::ostringstream log;
  TrainOptions o = tiny_run(fx.model, fx.tokens, fx.tmp.path / "run");
  o.schedule.warmup_steps = 0;
  o.warmup_ratio = 0.25;  // ceil(0.25 x 6) = 2 warmup steps, as transformers computes it
  o.schedule.kind = LrSchedule::Kind::constant;
  run_training(o, log);
  auto m = read_jsonl(o.out_dir / "metrics.jsonl");
  std::vector<double> lr;
  for (auto& r : m)
    if (r.contains("lr")) lr.push_back(r.at("lr").get<double>());
  ASSERT_EQ(lr.size(), 6u);
  EXPECT_EQ(lr[0], 0.0);
  EXPECT_EQ(lr[1], 0.5e-2);
  EXPECT_EQ(lr[2], 1e-2);
  EXPECT_EQ(read_trainer_state(o.out_dir / "checkpoint-6").at("schedule").at("warmup_steps"), 2);
}

TEST(Conventions, LengthAndWarmupFlagsAreCheckedAndExclusive) {
  auto refused = [](const std::vector<std::string>& args, const std::string& words) {
    auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, words)) << words << "\n" << r.output;
  };
  refused({"train", "--steps", "3", "--epochs", "1", "--print-config"},
          "both set the run's length; pass one of them");
  refused({"train", "--steps", "3", "--num-train-epochs", "1", "--print-config"},
          "--epochs 1");
  refused({"train", "--warmup-steps", "2", "--warmup-ratio", "0.1", "--print-config"},
          "both set the warmup");
  refused({"train", "--warmup-ratio", "1", "--print-config"}, "--warmup-ratio 1 must be in [0, 1)");
  refused({"train", "--epochs", "-1", "--print-config"}, "--epochs -1 must be a positive number");
  auto ok = run_cli({"train", "--num-train-epochs", "2", "--warmup-ratio", "0.1", "--print-config"});
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_TRUE(contains(ok.output, "epochs = 2.0\n") && contains(ok.output, "warmup-ratio = 0.1\n"))
      << ok.output;
  // One of each exclusive pair is printed, so the printed form reads back.
  EXPECT_FALSE(contains(ok.output, "\nsteps = ") || contains(ok.output, "warmup-steps = "))
      << ok.output;
}

TEST(Conventions, BundledExampleTrainsForEpochsAndShowsTheStepCount) {
  TempDir tmp("sf-cli-epochs");
  const fs::path out = tmp.path / "out";
  // The bundled token file (175K uint32 tokens, 5% held out: 649 rows of 256): 0.01 of a pass
  // is ceil(6.49 / 2) = 4 steps of 2 rows.
  auto r = run_cli({"train", "--epochs", "0.01", "--batch-size", "2", "--seq-len", "256",
                    "--backend", "host", "--progress", "lines", "--log-every", "1",
                    "--eval-every", "0", "--out", out.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::smatch rows;
  ASSERT_TRUE(std::regex_search(r.output, rows,
                                std::regex(R"(\(--epochs 0\.01: (\d+) training rows per pass, 2 per step\))")))
      << r.output;
  const int64_t want = int64_t(std::ceil(0.01 * std::stod(rows[1]) / 2.0));
  EXPECT_EQ(want, 4);
  const auto m = read_jsonl(out / "metrics.jsonl");
  ASSERT_FALSE(m.empty());
  EXPECT_EQ(m.back().at("step").get<int64_t>(), want);
  EXPECT_TRUE(contains(r.output, "step 4/4")) << r.output;  // the progress line's count
  EXPECT_TRUE(contains(r.output, "; 4 steps of 1 x 2 x 256 tokens")) << r.output;
}

TEST(Conventions, EpochsOfAJsonlDatasetCountItsPackedRows) {
  TempDir tmp("sf-cli-epochs-jsonl");
  const fs::path data = fs::path(SF_SOURCE_DIR) / "examples" / "sotu" / "sotu.jsonl";
  auto r = run_cli({"train", "--data", data.string(), "--epochs", "0.005", "--batch-size", "2",
                    "--seq-len", "128", "--backend", "host", "--eval-every", "0", "--out",
                    (tmp.path / "out").string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The rows the data loader packs per epoch (its own log line) are the rows the steps count.
  std::smatch packed, counted;
  ASSERT_TRUE(std::regex_search(r.output, packed, std::regex(R"(in (\d+) rows of up to 128 tokens per epoch)")))
      << r.output;
  ASSERT_TRUE(std::regex_search(r.output, counted, std::regex(R"(\(--epochs 0\.005: (\d+) training rows per pass)")))
      << r.output;
  EXPECT_EQ(packed[1], counted[1]);
  const int64_t want = int64_t(std::ceil(0.005 * std::stod(packed[1]) / 2.0));
  EXPECT_TRUE(contains(r.output, "; " + std::to_string(want) + " steps of 1 x 2 x 128 tokens"))
      << want << "\n" << r.output;
}

TEST(Conventions, FullFineTuningDefaultsAndTheHighLrWarning) {
  Fixture fx;
  auto r = run_cli({"train", "--model", fx.model.string(), "--data", fx.tokens.string(),
                    "--print-config"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "lr = 2e-05\n") && contains(r.output, "warmup-ratio = 0.03\n"))
      << r.output;
  const fs::path out = fx.tmp.path / "out";
  auto run = run_cli({"train", "--model", fx.model.string(), "--data", fx.tokens.string(),
                      "--steps", "2", "--batch-size", "2", "--seq-len", "16", "--backend",
                      "host", "--out", out.string()});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(contains(run.output, "lr         2e-05 peak, cosine, warmup 1 step "
                                   "(--warmup-ratio 0.03); 2 steps (the default --lr for full "
                                   "fine-tuning)"))
      << run.output;
  EXPECT_FALSE(contains(run.output, "warning: --lr")) << run.output;
  auto high = run_cli({"train", "--model", fx.model.string(), "--data", fx.tokens.string(),
                       "--steps", "2", "--batch-size", "2", "--seq-len", "16", "--backend",
                       "host", "--lr", "0.01", "--out", (fx.tmp.path / "high").string()});
  ASSERT_EQ(high.exit_code, 0) << high.output;
  EXPECT_TRUE(contains(high.output, "warning: --lr 0.01 is high for full fine-tuning"))
      << high.output;
}

TEST(Conventions, ADivergedRunStopsWithAnErrorAndKeepsTheLastCheckpoint) {
  TempDir tmp("sf-cli-diverge");
  const fs::path out = tmp.path / "out";
  auto r = run_cli({"train", "--lr", "1e9", "--steps", "30", "--warmup-steps", "1",
                    "--batch-size", "2", "--seq-len", "32", "--save-every", "1",
                    "--eval-every", "0", "--backend", "host", "--out", out.string()});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  ASSERT_TRUE(contains(r.output, "the model has diverged")) << r.output;
  EXPECT_TRUE(contains(r.output, "stopped without saving")) << r.output;
  const auto m = read_jsonl(out / "metrics.jsonl");
  ASSERT_FALSE(m.empty());
  const int64_t failed = m.back().at("step").get<int64_t>();
  EXPECT_LT(failed, 30);
  const auto& last = m.back();
  EXPECT_TRUE(!std::isfinite(last.value("loss", 0.0)) || last.at("loss").is_null() ||
              last.at("grad_norm").get<double>() == 0.0)
      << last.dump();
  // The step that failed was not saved; the one before it is the run's latest and intact.
  EXPECT_FALSE(fs::exists(checkpoint_path(out, failed)));
  const fs::path prev = checkpoint_path(out, failed - 1);
  EXPECT_EQ(read_file(out / "latest"), prev.filename().string() + "\n");
  EXPECT_EQ(read_trainer_state(prev).at("step"), failed - 1);
  EXPECT_TRUE(contains(r.output, prev.string() + " is intact")) << r.output;
}

TEST(Conventions, ResumeWithAChangedLrWarnsAndRecordsTheChange) {
  Fixture fx;
  TrainOptions o = tiny_run(fx.model, fx.tokens, fx.tmp.path / "run");
  ASSERT_TRUE(run_stopping(o, 3).stopped);
  TrainOptions r = o;
  r.resume = "auto";
  r.schedule.lr = 4e-3;
  r.schedule.kind = LrSchedule::Kind::linear;
  r.explicit_options = {"lr", "lr-schedule"};
  std::ostringstream log;
  r.progress = TrainOptions::Progress::lines;
  TrainResult res = run_training(r, log);
  EXPECT_EQ(res.start_step, 3);
  EXPECT_TRUE(contains(log.str(), "warning: --lr 0.004 replaces the checkpoint's 0.01"))
      << log.str();
  EXPECT_TRUE(contains(log.str(), "warning: --lr-schedule \"linear\" replaces the checkpoint's "
                                  "\"cosine\"")) << log.str();
  const auto state = read_trainer_state(res.checkpoint);
  const auto& changes = state.at("schedule_changes");
  ASSERT_EQ(changes.size(), 1u) << changes.dump();
  EXPECT_EQ(changes[0].at("step"), 3);
  EXPECT_EQ(changes[0].at("changes").at("lr"), (nlohmann::json{{"from", 1e-2}, {"to", 4e-3}}));
  EXPECT_EQ(changes[0].at("changes").at("lr-schedule").at("from"), "cosine");
  EXPECT_EQ(state.at("settings").at("lr"), 4e-3);
  // Steps 4..6 ran on the new schedule: linear from 4e-3 with 2 warmup steps over 6, with
  // min_lr_ratio 0.1 (from the checkpoint).
  LrSchedule want{LrSchedule::Kind::linear, 4e-3, 2, 6, 0.1};
  auto m = read_jsonl(r.out_dir / "metrics.jsonl");
  for (auto& rec : m) {
    const int64_t step = rec.at("step").get<int64_t>();
    if (rec.contains("lr") && step > 3) {
      EXPECT_EQ(rec.at("lr").get<double>(), want.at(step)) << step;
    }
  }

  // A second resume keeps the history and adds its own change.
  TrainOptions again = r;
  again.steps = 8;
  again.schedule.lr = 2e-3;
  again.explicit_options = {"lr", "steps"};
  TrainResult res2 = run_training(again, log);
  const auto changes2 = read_trainer_state(res2.checkpoint).at("schedule_changes");
  ASSERT_EQ(changes2.size(), 2u) << changes2.dump();
  EXPECT_EQ(changes2[1].at("step"), 6);
  EXPECT_EQ(changes2[1].at("changes").at("steps"), (nlohmann::json{{"from", 6}, {"to", 8}}));
}

TEST(Conventions, MetricsGoToTensorBoardAndCsvAndSurviveAResume) {
  Fixture fx;
  TrainOptions o = tiny_run(fx.model, fx.tokens, fx.tmp.path / "run");
  ASSERT_TRUE(run_stopping(o, 3).stopped);
  o.resume = "auto";
  std::ostringstream log;
  run_training(o, log);
  const auto m = read_jsonl(o.out_dir / "metrics.jsonl");
  ASSERT_EQ(m.size(), 7u);  // eval at 0, steps 1..6

  // One event file (the resumed session rewrote the history): each step once, in order.
  const auto files = event_files(o.out_dir);
  ASSERT_EQ(files.size(), 1u);
  const auto events = read_tfevents(read_file(files[0]));
  ASSERT_EQ(events.size(), 1 + m.size());
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  for (size_t i = 0; i < m.size(); ++i) {
    const auto& e = events[i + 1];
    EXPECT_EQ(e.step, m[i].at("step").get<int64_t>());
    EXPECT_EQ(e.wall_time, m[i].at("wall_time").get<double>());
    auto expect_tag = [&](const char* key, const char* tag) {
      if (!m[i].contains(key)) {
        EXPECT_EQ(e.scalars.count(tag), 0u) << tag;
        return;
      }
      ASSERT_EQ(e.scalars.count(tag), 1u) << tag << " step " << e.step;
      EXPECT_EQ(e.scalars.at(tag), float(m[i].at(key).get<double>())) << tag;
    };
    expect_tag("loss", "train/loss");
    expect_tag("eval_loss", "eval/loss");
    expect_tag("lr", "train/learning_rate");
    expect_tag("grad_norm", "train/grad_norm");
    expect_tag("tokens_per_second", "train/tokens_per_second");
    if (i > 0) {
      EXPECT_EQ(e.scalars.count("memory/peak_device_gib"), 1u);
      EXPECT_GT(e.scalars.at("memory/host_rss_gib"), 0.0f);
    }
  }

  // metrics.csv: the header and one row per record, the same numbers.
  std::ifstream csv(o.out_dir / "metrics.csv");
  std::string header, row;
  std::getline(csv, header);
  EXPECT_EQ(header.rfind("step,loss,eval_loss,lr,grad_norm,", 0), 0u) << header;
  std::vector<std::string> rows;
  while (std::getline(csv, row)) rows.push_back(row);
  ASSERT_EQ(rows.size(), m.size());
  EXPECT_EQ(rows[0].rfind("0,,", 0), 0u) << rows[0];
  EXPECT_EQ(rows[4].rfind("4," + m[4].at("loss").dump() + ",", 0), 0u) << rows[4];

  // --no-tensorboard: no event files.
  TrainOptions off = tiny_run(fx.model, fx.tokens, fx.tmp.path / "off");
  off.steps = 2;
  off.tensorboard = TensorBoardLog::off;
  run_training(off, log);
  EXPECT_TRUE(event_files(off.out_dir).empty());
  EXPECT_TRUE(fs::exists(off.out_dir / "metrics.csv"));
}

TEST(Conventions, YamlConfigSetsOptionsWithHfKeysAndRefusesMistakes) {
  TempDir tmp("sf-cli-yaml");
  const fs::path cfg = tmp.path / "run.yaml";
  write_file_atomic(cfg,
                    "# a training run\n"
                    "learning_rate: 0.002\n"
                    "num_train_epochs: 2\n"
                    "per_device_train_batch_size: 4\n"
                    "lr-schedule: linear\n"
                    "shuffle: false\n"
                    "train:\n"
                    "  keep-checkpoints: 3\n"
                    "  chat-date: \"26 Jul 2024\"\n");
  auto r = run_cli({"train", "--config", cfg.string(), "--batch-size", "5", "--print-config"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"lr = 0.002\n", "epochs = 2.0\n", "batch-size = 5\n",
                           "lr-schedule = \"linear\"\n", "shuffle = false\n",
                           "keep-checkpoints = 3\n", "chat-date = \"26 Jul 2024\"\n"})
    EXPECT_TRUE(contains(r.output, line)) << line << " in:\n" << r.output;

  auto refused = [&](const std::string& text, const std::vector<std::string>& words) {
    write_file_atomic(cfg, text);
    auto bad = run_cli({"train", "--config", cfg.string(), "--print-config"});
    EXPECT_EQ(bad.exit_code, 2) << bad.output;
    for (auto& w : words) EXPECT_TRUE(contains(bad.output, w)) << w << "\n" << bad.output;
  };
  refused("steps: 3\nlearning_rat: 1e-5\n",
          {"run.yaml:2: unknown option \"learning_rat\"; did you mean \"learning-rate\"?"});
  refused("steps: many\n", {"run.yaml:1: steps: many: not a whole number; e.g. steps: "});
  refused("lr: [1, 2]\n", {"run.yaml:1: \"lr\" is a list; it takes one value"});
  refused("eval:\n  steps: 3\n", {"run.yaml:1: \"eval\" holds a mapping"});
  refused("lr:\n", {"run.yaml:1: \"lr\" has no value"});
  refused("lr: 1e-5\nlearning_rate: 2e-5\n", {"run.yaml:2: \"learning_rate\" is set twice"});
  refused("- lr\n", {"run.yaml: expected a mapping of options"});
  refused("lr: [1, 2\n", {"run.yaml:", "not valid YAML"});
}

TEST(Conventions, TomlConfigSuggestsTheNearestKey) {
  TempDir tmp("sf-cli-toml");
  const fs::path cfg = tmp.path / "run.toml";
  write_file_atomic(cfg, "warmup_ratoi = 0.1\n");
  auto bad = run_cli({"train", "--config", cfg.string(), "--print-config"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(contains(bad.output, "run.toml: unknown option \"warmup_ratoi\"; did you mean "
                                   "\"warmup-ratio\"?")) << bad.output;
}

}  // namespace
}  // namespace sf::test
