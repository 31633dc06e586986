// Checkpoints and exact resume on the host backend: a run stopped and resumed equals the
// uninterrupted run bit for bit; interrupted saves, a latest file naming a missing checkpoint,
// a full disk, and resuming with other data / another model / changed settings.
#include <gtest/gtest.h>
#include <sys/mount.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "train/checkpoint.h"
#include "train_test_util.h"

namespace sf::test {
namespace {

struct Fixture {
  TempDir tmp{"sf-resume"};
  fs::path model = make_tiny_model(tmp.path / "model");
  // 400 tokens: 360 for training (5.6 steps of 64 tokens: the 6th step wraps the epoch).
  fs::path tokens = make_tokens(tmp.path / "tokens.bin", 400);
};

void expect_same_final_state(const fs::path& a, const fs::path& b) {
  for (const char* f : {"resume/master.safetensors", "resume/adam_m.safetensors",
                        "resume/adam_v.safetensors", "model.safetensors"})
    expect_same_tensors(a / f, b / f);
}

// shuffle; engine: the planner's choice on this tiny model (resident) or the sliding window,
// whose speculative update must not make the result depend on thread timing.
struct ResumeCase {
  bool shuffle;
  const char* engine;
};
class ResumeOrder : public ::testing::TestWithParam<ResumeCase> {};

TEST_P(ResumeOrder, StoppedAndResumedRunEqualsUninterruptedBitForBit) {
  Fixture fx;
  std::ostringstream log;
  TrainOptions straight = tiny_run(fx.model, fx.tokens, fx.tmp.path / "straight");
  straight.shuffle = GetParam().shuffle;
  straight.engine = GetParam().engine;
  TrainResult a = run_training(straight, log);
  ASSERT_EQ(a.losses.size(), 6u);
  ASSERT_EQ(a.end_step, 6);

  TrainOptions split = tiny_run(fx.model, fx.tokens, fx.tmp.path / "split");
  split.shuffle = GetParam().shuffle;
  split.engine = GetParam().engine;
  TrainResult b1 = run_stopping(split, 3);
  ASSERT_TRUE(b1.stopped);
  ASSERT_EQ(b1.end_step, 3);
  ASSERT_EQ(b1.checkpoint.filename(), "checkpoint-3");
  split.resume = "auto";
  TrainResult b2 = run_training(split, log);
  ASSERT_FALSE(b2.stopped);
  EXPECT_EQ(b2.start_step, 3);
  ASSERT_EQ(b2.losses.size(), 3u);

  std::vector<double> joined = b1.losses;
  joined.insert(joined.end(), b2.losses.begin(), b2.losses.end());
  for (size_t i = 0; i < 6; ++i)  // exact: the same arithmetic on the same state
    EXPECT_EQ(0, std::memcmp(&a.losses[i], &joined[i], sizeof(double)))
        << "step " << i + 1 << ": " << a.losses[i] << " vs " << joined[i];
  // Evaluations at 2, 4, 6 (and 0 in each fresh run): same values where both ran them.
  ASSERT_EQ(a.eval_losses.size(), 4u);
  ASSERT_EQ(b2.eval_losses.size(), 2u);
  EXPECT_EQ(a.eval_losses[2], b2.eval_losses[0]);
  EXPECT_EQ(a.eval_losses[3], b2.eval_losses[1]);
  expect_same_final_state(a.checkpoint, b2.checkpoint);

  // The metrics log of the resumed run is the uninterrupted one apart from timings.
  auto lines = [](const fs::path& p) {
    std::vector<nlohmann::json> v;
    std::ifstream f(p);
    std::string l;
    while (std::getline(f, l)) v.push_back(nlohmann::json::parse(l));
    return v;
  };
  auto ma = lines(straight.out_dir / "metrics.jsonl"), mb = lines(split.out_dir / "metrics.jsonl");
  ASSERT_EQ(ma.size(), mb.size());
  for (size_t i = 0; i < ma.size(); ++i)
    for (const char* k : {"step", "loss", "lr", "grad_norm", "eval_loss", "tokens_seen", "epoch"})
      EXPECT_EQ(ma[i].value(k, nlohmann::json()), mb[i].value(k, nlohmann::json()))
          << "metrics line " << i << " key " << k;
  EXPECT_EQ(mb.back().at("epoch"), 1);  // the 6th step wrapped the training data

  // The trainer state records what a resume needs.
  auto st = read_trainer_state(b2.checkpoint);
  EXPECT_EQ(st.at("step"), 6);
  EXPECT_EQ(st.at("optimizer_step"), 6);
  EXPECT_EQ(st.at("settings").at("lr"), 1e-2);
  EXPECT_EQ(st.at("data").at("identity").at("tokens"), 400);
  EXPECT_TRUE(st.at("data").at("state").contains(GetParam().shuffle ? "row" : "position"));
  EXPECT_TRUE(st.at("rng").contains("state"));
  EXPECT_EQ(st.at("schedule").at("kind"), "cosine");
  EXPECT_EQ(st.at("metrics").size(), ma.size());
  EXPECT_EQ(read_file(split.out_dir / "latest"), "checkpoint-6\n");
  // The HF weights are saved in the model's dtype (tiny_config: float32).
  SafetensorsFile weights(b2.checkpoint / "model.safetensors");
  for (auto& t : weights.tensors()) EXPECT_EQ(t.dtype, StDType::F32) << t.name;
  EXPECT_EQ(load_config(b2.checkpoint / "config.json").torch_dtype, DType::f32);
}

INSTANTIATE_TEST_SUITE_P(Resume, ResumeOrder,
                         ::testing::Values(ResumeCase{false, "auto"}, ResumeCase{true, "auto"},
                                           ResumeCase{true, "sliding"}),
                         [](const auto& i) {
                           return std::string(i.param.shuffle ? "Shuffled" : "InOrder") +
                                  (std::string(i.param.engine) == "sliding" ? "Sliding" : "");
                         });

TEST(Resume, FromAnExplicitDirectoryAndWithSettingsFromTheCheckpoint) {
  Fixture fx;
  std::ostringstream log;
  TrainOptions o = tiny_run(fx.model, fx.tokens, fx.tmp.path / "a");
  o.save_every = 2;
  TrainResult a = run_training(o, log);
  // Resume from checkpoint-2 into another output directory, giving no settings at all: the
  // checkpoint supplies model, data, schedule and hyper-parameters.
  TrainOptions r;
  r.out_dir = fx.tmp.path / "b";
  r.resume = (o.out_dir / "checkpoint-2").string();
  r.backend = "host";
  r.progress = TrainOptions::Progress::quiet;
  TrainResult b = run_training(r, log);
  EXPECT_EQ(b.start_step, 2);
  ASSERT_EQ(b.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(a.losses[i + 2], b.losses[i]) << "step " << i + 3;
  expect_same_final_state(a.checkpoint, b.checkpoint);
  // A resume of a finished run has nothing to do.
  r.resume = "auto";
  TrainResult c = run_training(r, log);
  EXPECT_TRUE(c.losses.empty());
  EXPECT_EQ(c.start_step, 6);
}

TEST(Resume, InterruptedSaveIsIgnoredAndThePreviousCheckpointUsed) {
  Fixture fx;
  std::ostringstream log;
  TrainOptions straight = tiny_run(fx.model, fx.tokens, fx.tmp.path / "straight");
  TrainResult a = run_training(straight, log);

  TrainOptions o = tiny_run(fx.model, fx.tokens, fx.tmp.path / "run");
  o.save_every = 2;
  TrainResult first = run_stopping(o, 4);
  ASSERT_EQ(first.checkpoint.filename(), "checkpoint-4");
  // What a crash during the save of step 6 and during a prune leave behind: temporaries with
  // partial contents (a model file, no trainer state), and a checkpoint name without state.
  const fs::path out = o.out_dir;
  fs::create_directories(out / "checkpoint-6.tmp.4242/resume");
  write_file_atomic(out / "checkpoint-6.tmp.4242/model.safetensors", "partial");
  fs::create_directories(out / "checkpoint-8");  // no trainer_state.json: not complete
  write_file_atomic(out / "checkpoint-8/config.json", "{}");
  fs::create_directories(out / "checkpoint-2.deleting.77");
  // A crash between the rename of a newer checkpoint and the update of latest would leave
  // latest one behind; a latest naming a missing directory must fall back to the newest.
  write_file_atomic(out / "latest", "checkpoint-10\n");
  std::string note;
  auto found = find_latest_checkpoint(out, &note);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->dir.filename(), "checkpoint-4");
  EXPECT_NE(note.find("checkpoint-10"), std::string::npos) << note;
  auto all = list_checkpoints(out);
  ASSERT_EQ(all.size(), 2u);  // checkpoint-2 and checkpoint-4 only
  EXPECT_EQ(all[0].step, 2);

  o.resume = "auto";
  o.fault = {};
  o.stop_requested = {};
  TrainResult rest = run_training(o, log);
  EXPECT_EQ(rest.start_step, 4);
  ASSERT_EQ(rest.losses.size(), 2u);
  EXPECT_EQ(rest.losses[0], a.losses[4]);
  EXPECT_EQ(rest.losses[1], a.losses[5]);
  expect_same_final_state(a.checkpoint, rest.checkpoint);
  // The run cleaned up the temporaries it owned the directory for.
  EXPECT_FALSE(fs::exists(out / "checkpoint-6.tmp.4242"));
  EXPECT_FALSE(fs::exists(out / "checkpoint-2.deleting.77"));
}

TEST(Resume, FailedSaveKeepsThePreviousCheckpoint) {
  Fixture fx;
  std::ostringstream log;
  TrainOptions o = tiny_run(fx.model, fx.tokens, fx.tmp.path / "run");
  o.save_every = 2;
  for (const char* point : {"checkpoint:model-written:4", "checkpoint:before-rename:4"}) {
    fs::remove_all(o.out_dir);
    o.fault = [point](std::string_view p) {
      if (p == point) SF_FAIL(io, "simulated: No space left on device");
    };
    try {
      run_training(o, log);
      FAIL() << "the failed save at " << point << " did not stop the run";
    } catch (const Error& e) {
      std::string m = e.what();
      EXPECT_EQ(e.kind(), ErrorKind::io);
      EXPECT_NE(m.find("checkpoint-4 was not saved"), std::string::npos) << m;
      EXPECT_NE(m.find("No space left"), std::string::npos) << m;
      EXPECT_NE(m.find("checkpoint-2 is intact"), std::string::npos) << m;
      EXPECT_NE(m.find("--resume"), std::string::npos) << m;
    }
    EXPECT_FALSE(fs::exists(o.out_dir / "checkpoint-4"));
    auto all = list_checkpoints(o.out_dir);
    ASSERT_EQ(all.size(), 1u);
    EXPECT_EQ(all[0].step, 2);
    EXPECT_EQ(read_file(o.out_dir / "latest"), "checkpoint-2\n");
    for (auto& e : fs::directory_iterator(o.out_dir))  // the temporary is gone
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
  }
}

// A real full disk: a 1 MiB tmpfs (needs root and mount permission; skipped otherwise).
TEST(Resume, FullDiskIsAClearErrorAndKeepsThePreviousCheckpoint) {
  Fixture fx;
  const fs::path mnt = fx.tmp.path / "small";
  fs::create_directories(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (" << std::strerror(errno) << ")";
  struct Unmount {
    fs::path p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{mnt};

  std::ostringstream log;
  TrainOptions o = tiny_run(fx.model, fx.tokens, mnt / "out");
  o.steps = 40;      // a checkpoint is ~150 KB: the disk fills within a few saves
  o.save_every = 1;
  o.eval_every = 0;
  std::string msg;
  try {
    run_training(o, log);
  } catch (const Error& e) {
    msg = e.what();
  }
  ASSERT_FALSE(msg.empty()) << "40 checkpoints fit into 1 MiB?";
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--resume"), std::string::npos) << msg;
  auto found = find_latest_checkpoint(o.out_dir);
  ASSERT_TRUE(found) << msg;
  EXPECT_NE(msg.find(found->dir.filename().string() + " is intact"), std::string::npos) << msg;
  for (auto& e : fs::directory_iterator(o.out_dir))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();

  // The newest checkpoint is complete and loads; after freeing space the run resumes from it.
  for (auto& c : list_checkpoints(o.out_dir))
    if (c.step != found->step) fs::remove_all(c.dir);
  o.resume = "auto";
  o.steps = found->step + 1;
  o.explicit_options = {"steps"};  // else the checkpoint's 40 steps
  TrainResult r = run_training(o, log);
  EXPECT_EQ(r.start_step, found->step);
  EXPECT_EQ(r.end_step, found->step + 1);
}

TEST(Resume, RefusesOtherDataOtherModelAndChangedSettings) {
  Fixture fx;
  std::ostringstream log;
  TrainOptions o = tiny_run(fx.model, fx.tokens, fx.tmp.path / "run");
  o.steps = 2;
  run_training(o, log);
  auto expect_error = [&](TrainOptions r, const std::vector<std::string>& words) {
    r.resume = "auto";
    r.steps = 4;
    r.explicit_options.insert("steps");
    try {
      run_training(r, log);
      ADD_FAILURE() << "resumed although it should not";
    } catch (const Error& e) {
      for (auto& w : words)
        EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
    }
  };
  {  // Other tokens (same size, other content).
    TrainOptions r = o;
    r.tokens_file = make_tokens(fx.tmp.path / "other.bin", 400, 53, 99);
    r.explicit_options.insert("tokens");
    expect_error(r, {"cannot resume", "fingerprint", "--tokens"});
  }
  {  // Another model shape.
    TrainOptions r = o;
    ModelConfig big = tiny_config(Arch::qwen3);
    big.num_hidden_layers = 3;
    ModelLayout l = ModelLayout::build(big);
    auto p = init_params(l, 1);
    std::vector<const float*> w;
    for (auto& x : p) w.push_back(x.data());
    save_model_dir(fx.tmp.path / "model3", big, l, w, {});
    r.model_dir = fx.tmp.path / "model3";
    r.explicit_options.insert("model");
    expect_error(r, {"cannot resume", "num_hidden_layers"});
  }
  {  // A setting given explicitly that differs from the checkpoint's. (The learning-rate
     // schedule may change: tests/train/test_conventions.cpp.)
    TrainOptions r = o;
    r.hyper.weight_decay = 0.2f;
    r.explicit_options.insert("weight-decay");
    expect_error(r, {"--weight-decay", "differs", "drop --weight-decay"});
  }
  {  // The same setting not given explicitly is taken from the checkpoint: no error.
    TrainOptions r = o;
    r.schedule.lr = 5e-3;
    r.resume = "auto";
    r.steps = 3;
    r.explicit_options = {"steps"};
    TrainResult res = run_training(r, log);
    EXPECT_EQ(res.start_step, 2);
    EXPECT_EQ(read_trainer_state(res.checkpoint).at("settings").at("lr"), 1e-2);
  }
}

TEST(Resume, KeepCheckpointsPrunesOlderOnesAndLatestIsAtomic) {
  Fixture fx;
  std::ostringstream log;
  TrainOptions o = tiny_run(fx.model, fx.tokens, fx.tmp.path / "run");
  o.save_every = 1;
  o.keep_checkpoints = 2;
  int latest_checks = 0;
  o.fault = [&](std::string_view p) {
    // Before latest is replaced, it still names the previous complete checkpoint.
    if (p.rfind("checkpoint:before-latest:", 0) == 0) {
      int64_t step = std::stoll(std::string(p.substr(p.rfind(':') + 1)));
      if (step > 1) {
        EXPECT_EQ(read_file(o.out_dir / "latest"), "checkpoint-" + std::to_string(step - 1) + "\n");
        ++latest_checks;
      }
    }
  };
  run_training(o, log);
  EXPECT_EQ(latest_checks, 5);
  auto all = list_checkpoints(o.out_dir);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].step, 5);
  EXPECT_EQ(all[1].step, 6);
  EXPECT_TRUE(fs::exists(o.out_dir / "loss.png"));
}

TEST(Resume, FreshRunDoesNotMixWithAnEarlierRunsCheckpoints) {
  Fixture fx;
  std::ostringstream log;
  TrainOptions o = tiny_run(fx.model, fx.tokens, fx.tmp.path / "run");
  o.save_every = 2;
  run_training(o, log);
  o.steps = 3;
  try {
    run_training(o, log);
    FAIL() << "a fresh run wrote over an earlier run's checkpoints";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("checkpoint-6"), std::string::npos) << m;
    EXPECT_NE(m.find("--resume"), std::string::npos) << m;
    EXPECT_NE(m.find("--overwrite"), std::string::npos) << m;
  }
  EXPECT_EQ(list_checkpoints(o.out_dir).size(), 3u);
  o.overwrite = true;
  run_training(o, log);
  auto all = list_checkpoints(o.out_dir);
  ASSERT_EQ(all.size(), 2u);  // 2 and 3 of the new run only
  EXPECT_EQ(all[1].step, 3);
  EXPECT_EQ(read_file(o.out_dir / "latest"), "checkpoint-3\n");
}

TEST(Resume, SecondRunOnTheSameOutputDirectoryIsRefused) {
  TempDir tmp("sf-lock");
  OutDirLock a(tmp.path);
  try {
    OutDirLock b(tmp.path);
    FAIL() << "two locks on one directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("another slideformer run"), std::string::npos);
  }
}

}  // namespace
}  // namespace sf::test
