// End to end through the slideformer binary: the bundled example trains, saves and reloads;
// options come from a config file; Ctrl-C / SIGTERM save and exit with a resume hint, a
// second Ctrl-C quits at once; a process killed during a save resumes exactly.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <regex>
#include <sstream>

#include "core/dtype.h"
#include "engine/planner.h"
#include "model/weights_io.h"
#include "optim/param_store.h"
#include "report/png.h"
#include "train/checkpoint.h"
#include "train_test_util.h"

namespace sf::test {
namespace {

bool contains(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }

std::vector<nlohmann::json> read_jsonl(const fs::path& p) {
  std::vector<nlohmann::json> v;
  std::ifstream f(p);
  std::string l;
  while (std::getline(f, l)) v.push_back(nlohmann::json::parse(l));
  return v;
}

TEST(Cli, BundledExampleTrainsSavesAndReloads) {
  ASSERT_TRUE(fs::exists(cli_binary())) << cli_binary();
  TempDir tmp("sf-cli-example");
  const fs::path out = tmp.path / "out";
  auto r = run_cli({"train", "--steps", "3", "--batch-size", "2", "--seq-len", "32",
                    "--eval-every", "2", "--save-every", "2", "--backend", "host", "--out",
                    out.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // The plan comes first: how the step runs, the memory totals, what the prediction assumed,
  // the prediction, the bound.
  for (const char* line : {"mode       resident", "  total host",
                           "hardware   measured on this host: fp32 GEMM ", "predicted  step",
                           "bound      "})
    EXPECT_TRUE(contains(r.output, line)) << line << "\n" << r.output;
  EXPECT_TRUE(contains(r.output, "eval  step 2")) << r.output;
  EXPECT_TRUE(contains(r.output, "saved " + (out / "checkpoint-3").string())) << r.output;
  EXPECT_EQ(read_file(out / "latest"), "checkpoint-3\n");
  EXPECT_TRUE(fs::exists(out / "checkpoint-2" / "trainer_state.json"));

  auto m = read_jsonl(out / "metrics.jsonl");
  ASSERT_EQ(m.size(), 4u);  // eval at 0, steps 1..3
  EXPECT_EQ(m[0].at("step"), 0);
  EXPECT_TRUE(m[0].contains("eval_loss"));
  for (int s = 1; s <= 3; ++s) {
    EXPECT_EQ(m[size_t(s)].at("step"), s);
    for (const char* k : {"loss", "lr", "grad_norm", "tokens_per_second", "tflops"})
      EXPECT_TRUE(m[size_t(s)].contains(k)) << k;
  }
  EXPECT_TRUE(m[2].contains("eval_loss") && m[3].contains("eval_loss"));
  const std::string png = read_file(out / "loss.png");
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));

  // The checkpoint is a Hugging Face directory: config, bf16 weights, tokenizer files.
  const fs::path ck = out / "checkpoint-3";
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json",
                        "tokenizer_config.json"})
    EXPECT_TRUE(fs::exists(ck / f)) << f;
  ModelConfig cfg = load_config(ck / "config.json");
  EXPECT_EQ(cfg.torch_dtype, DType::bf16);
  ModelLayout layout = ModelLayout::build(cfg);
  std::vector<std::vector<float>> w(layout.units.size());
  std::vector<float*> ptrs;
  for (size_t u = 0; u < w.size(); ++u) {
    w[u].resize(size_t(layout.units[u].numel));
    ptrs.push_back(w[u].data());
  }
  load_model_weights(ck, cfg, layout, ptrs);
  // The saved weights are the fp32 master rounded to bf16 (exactly: round to nearest even).
  SafetensorsFile master(ck / "resume" / "master.safetensors");
  ASSERT_EQ(master.tensors().size(), layout.units.size());
  size_t checked = 0;
  for (size_t u = 0; u < w.size(); ++u) {
    const TensorInfo& t = master.tensors()[u];
    std::vector<float> fp32(size_t(t.numel)), rounded(size_t(t.numel));
    std::vector<uint16_t> bf(size_t(t.numel));
    master.read_f32(t, fp32.data());
    convert_from_f32(fp32.data(), bf.data(), DType::bf16, fp32.size());
    convert_to_f32(bf.data(), DType::bf16, rounded.data(), rounded.size());
    ASSERT_EQ(fp32.size(), w[u].size());
    for (const Unit* unit = &layout.units[u]; const ParamSlot& s : unit->params)
      for (int64_t i = 0; i < s.numel(); ++i, ++checked)
        ASSERT_EQ(w[u][size_t(s.offset + i)], rounded[size_t(s.offset + i)]) << "unit " << u;
  }
  EXPECT_GT(checked, size_t(7'000'000));
}

TEST(Cli, ConfigFileSetsOptionsAndFlagsWin) {
  TempDir tmp("sf-cli-config");
  const fs::path cfg = tmp.path / "run.toml";
  write_file_atomic(cfg,
                    "# a training run\n"
                    "steps = 4\n"
                    "lr = 0.002\n"
                    "save_every = 2          # underscores work too\n"
                    "lr-schedule = \"linear\"\n"
                    "weight-decay = 0.05\n"
                    "deterministic = true\n"
                    "\n[train]\n"
                    "keep-checkpoints = 3\n"
                    "out = \"" + (tmp.path / "o").string() + "\"\n");
  auto r = run_cli({"train", "--config", cfg.string(), "--steps", "5", "--print-config"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"steps = 5\n", "lr = 0.002\n", "save-every = 2\n",
                           "lr-schedule = \"linear\"\n", "weight-decay = 0.05\n", "beta1 = 0.9\n", "adam-eps = 1e-08\n",
                           "keep-checkpoints = 3\n", "batch-size = 8\n", "seq-len = 64\n",
                           "shuffle = true\n", "deterministic = true\n"})
    EXPECT_TRUE(contains(r.output, line)) << line << " in:\n" << r.output;
  EXPECT_FALSE(fs::exists(tmp.path / "o"));  // --print-config trains nothing

  // The printed form reads back to the same options.
  const fs::path again = tmp.path / "again.toml";
  write_file_atomic(again, r.output);
  auto r2 = run_cli({"train", "--config", again.string(), "--print-config"});
  ASSERT_EQ(r2.exit_code, 0) << r2.output;
  EXPECT_EQ(r2.output, r.output);

  // Errors name the file, the key or flag, and what to do.
  write_file_atomic(cfg, "stepz = 3\n");
  auto bad = run_cli({"train", "--config", cfg.string(), "--print-config"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(contains(bad.output, "run.toml") && contains(bad.output, "stepz")) << bad.output;
  write_file_atomic(cfg, "steps = \"many\"\n");
  bad = run_cli({"train", "--config", cfg.string(), "--print-config"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(contains(bad.output, "run.toml: steps = many")) << bad.output;
  write_file_atomic(cfg, "[eval]\nsteps = 3\n");
  bad = run_cli({"train", "--config", cfg.string(), "--print-config"});
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(contains(bad.output, "eval.steps")) << bad.output;
  for (auto [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--steps", "0"}, {"--lr", "-1"}, {"--save-every", "-2"}, {"--keep-checkpoints", "-1"},
           {"--log-every", "0"}, {"--eval-every", "-5"}, {"--min-lr-ratio", "2"}}) {
    bad = run_cli({"train", flag, value, "--print-config"});
    EXPECT_EQ(bad.exit_code, 2) << flag << ": " << bad.output;
    EXPECT_TRUE(contains(bad.output, flag + " " + value)) << bad.output;
  }
  bad = run_cli({"train", "--progress", "fancy", "--print-config"});
  EXPECT_TRUE(contains(bad.output, "--progress \"fancy\"")) << bad.output;
  // Planner overrides are checked when the plan is made (plan: no training, no download).
  for (const char* v : {"some", "-1", "2x"}) {
    bad = run_cli({"plan", "--size", "llama3-8b", "--backend", "host", "--device-adamw-layers", v});
    EXPECT_NE(bad.exit_code, 0) << v;
    EXPECT_TRUE(contains(bad.output, std::string("--device-adamw-layers \"") + v + "\" is not valid"))
        << bad.output;
  }
  bad = run_cli({"plan", "--size", "llama3-8b", "--backend", "host", "--device-adamw-layers", "2"});
  EXPECT_TRUE(contains(bad.output, "needs a GPU backend")) << bad.output;
}

// --checkpoint-every: a bad value names the flag and the choices; a forced stride trains the
// bundled example in a sliding window that says so, the same losses as saving every input
// (the replays recompute the forward's bits), and is recorded for the resume.
TEST(Cli, CheckpointEveryTrainsTheSameRunAndRefusesBadValues) {
  for (const char* v : {"0", "4", "x"}) {
    auto bad = run_cli({"plan", "--size", "llama3-8b", "--backend", "host", "--checkpoint-every", v});
    EXPECT_NE(bad.exit_code, 0) << v;
    EXPECT_TRUE(contains(bad.output, std::string("--checkpoint-every \"") + v + "\" is not valid")) << bad.output;
  }
  auto resident = run_cli({"plan", "--size", "tiny", "--backend", "host", "--engine", "resident",
                           "--checkpoint-every", "2"});
  EXPECT_NE(resident.exit_code, 0);
  EXPECT_TRUE(contains(resident.output, "only the sliding window saves fewer layers' inputs")) << resident.output;
  TempDir tmp("sf-cli-ckpt");
  auto train = [&](const char* every, const char* name) {
    return run_cli({"train", "--steps", "3", "--batch-size", "2", "--seq-len", "32", "--backend", "host",
                    "--engine", "sliding", "--checkpoint-every", every, "--out", (tmp.path / name).string()});
  };
  auto one = train("1", "one"), two = train("2", "two");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_TRUE(contains(two.output, "every 2nd layer's input saved (the others' replayed in the backward)"))
      << two.output;
  EXPECT_FALSE(contains(one.output, "layer's input saved")) << one.output;
  const auto a = read_jsonl(tmp.path / "one" / "metrics.jsonl"), b = read_jsonl(tmp.path / "two" / "metrics.jsonl");
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].contains("loss")) {
      EXPECT_EQ(a[i].at("loss"), b[i].at("loss")) << "line " << i;
    }
  }
  auto cfg = run_cli({"train", "--checkpoint-every", "3", "--print-config"});
  ASSERT_EQ(cfg.exit_code, 0) << cfg.output;
  EXPECT_TRUE(contains(cfg.output, "checkpoint-every = \"3\"")) << cfg.output;
}

// The engine benchmark on the host backend: the plan, one line per step, and a RESULT line
// whose steady rate counts only the timed steps (2..N) that follow an unclipped step. Clipping
// off: steps 2..4; clipping at 0.1 (the tiny model's norms are 3-5): none.
TEST(Cli, BenchReportsMeanAndSteadyRates) {
  auto bench = [](const char* max_norm) {
    return run_cli({"bench", "--size", "tiny", "--batch-size", "2", "--seq-len", "32", "--steps",
                    "4", "--max-grad-norm", max_norm, "--backend", "host", "--engine", "sliding"});
  };
  auto r = bench("0");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "bound      ")) << r.output;
  EXPECT_TRUE(contains(r.output, "step 4  loss")) << r.output;
  EXPECT_TRUE(contains(r.output, "RESULT size=tiny")) << r.output;
  EXPECT_TRUE(contains(r.output, "(3 steps)")) << r.output;
  EXPECT_FALSE(contains(r.output, "steady_tokens/s=0 ")) << r.output;
  // The executor is built from the plan printed (it once planned a second time: free memory
  // read again could give another window than the one shown).
  std::smatch plan_slots;
  ASSERT_TRUE(std::regex_search(r.output, plan_slots,
                                std::regex("sliding window: ([0-9]+) weight slots")))
      << r.output;
  EXPECT_TRUE(contains(r.output, "sliding window (" + plan_slots[1].str() + " slots)"))
      << r.output;
  r = bench("0.1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "steady_tokens/s=0 (0 steps)")) << r.output;
}

// A number the output prints after `pattern` (a regex whose first group is the number).
double number_after(const std::string& out, const std::string& pattern) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex(pattern))) return -1;
  return std::stod(m[1].str());
}

// The RESULT line's prediction is of the timed steps as they ran: every one after a clipped
// step (the tiny model's norms are 3-5, clipped at 0.1) is predicted at the plan's clipped
// step time, none (clipping off) at its plain one; predicted_steady_tokens/s is the plan's.
TEST(Cli, BenchPredictsTheStepsAsTheyRan) {
  const double tokens = 2 * 32;
  for (const char* max_norm : {"0", "0.1"}) {
    SCOPED_TRACE(max_norm);
    auto r = run_cli({"bench", "--size", "tiny", "--batch-size", "2", "--seq-len", "32", "--steps",
                      "4", "--max-grad-norm", max_norm, "--backend", "host", "--engine", "sliding"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const bool clipping = std::string(max_norm) != "0";
    const double plan_tps = number_after(r.output, R"(predicted  step [0-9.]+ s [^\n]*\), ([0-9]+) tokens/s)");
    const double clipped_s = number_after(r.output, "clipped    a step whose gradient norm is clipped: ([0-9.]+) s");
    const double predicted = number_after(r.output, "predicted_tokens/s=([0-9]+) ");
    const double steady = number_after(r.output, "predicted_steady_tokens/s=([0-9]+) ");
    ASSERT_GT(plan_tps, 0) << r.output;
    EXPECT_NEAR(steady, plan_tps, 1.0) << r.output;
    EXPECT_TRUE(contains(r.output, clipping ? "(3 of 3 after a clipped step)" : "(0 of 3 after a clipped step)"))
        << r.output;
    if (!clipping) {
      EXPECT_NEAR(predicted, plan_tps, 1.0) << r.output;
    } else if (clipped_s > 0) {  // printed to 3 places
      EXPECT_NEAR(predicted, tokens / clipped_s, 0.02 * predicted) << r.output;
    } else {  // not printed: within 5% of the plain step
      EXPECT_TRUE(predicted <= plan_tps && predicted >= plan_tps / 1.05) << r.output;
    }
  }
}

// A tiny model run through the CLI (fast), killed or interrupted in various ways.
struct CliRun {
  TempDir tmp{"sf-cli-signals"};
  fs::path model = make_tiny_model(tmp.path / "model");
  fs::path tokens = make_tokens(tmp.path / "tokens.bin", 400);
  std::vector<std::string> args(const fs::path& out, const std::string& steps = "6") const {
    return {"train",         "--model",      model.string(), "--tokens",    tokens.string(),
            "--out",         out.string(),   "--steps",      steps,         "--batch-size",
            "2",             "--seq-len",    "16",           "--grad-accum", "2",
            "--lr",          "0.01",         "--warmup-steps", "2",         "--eval-every",
            "2",             "--save-every", "2",            "--backend",   "host"};
  }
};

TEST(Cli, CtrlCSavesAndResumesExactly_SecondCtrlCQuitsAtOnce) {
  CliRun run;
  const fs::path straight = run.tmp.path / "straight";
  auto a = run_cli(run.args(straight));
  ASSERT_EQ(a.exit_code, 0) << a.output;

  // One Ctrl-C after step 3: the step finishes, a checkpoint is saved, exit 130 with a hint.
  const fs::path out = run.tmp.path / "int";
  auto b = run_cli(run.args(out), {"SF_TEST_FAULT=sigint@step:3"});
  EXPECT_EQ(b.exit_code, 130) << b.output;
  EXPECT_TRUE(contains(b.output, "stopping after this step")) << b.output;
  EXPECT_TRUE(contains(b.output, "stopped at step 3 of 6")) << b.output;
  EXPECT_TRUE(contains(b.output, "resume with: slideformer train --out " + out.string() +
                                     " --resume auto"))
      << b.output;
  EXPECT_EQ(read_file(out / "latest"), "checkpoint-3\n");
  EXPECT_FALSE(fs::exists(out / "checkpoint-4"));
  // The hint works as printed: everything else comes from the checkpoint.
  auto c = run_cli({"train", "--out", out.string(), "--resume", "auto", "--backend", "host"});
  ASSERT_EQ(c.exit_code, 0) << c.output;
  EXPECT_TRUE(contains(c.output, "resuming from " + (out / "checkpoint-3").string())) << c.output;
  // The run's cadence came from the checkpoint too: --eval-every 2, --save-every 2.
  EXPECT_TRUE(contains(c.output, "eval  step 4")) << c.output;
  EXPECT_TRUE(fs::exists(out / "checkpoint-4" / "model.safetensors"));
  for (const char* f : {"resume/master.safetensors", "resume/adam_m.safetensors",
                        "resume/adam_v.safetensors", "model.safetensors"})
    expect_same_tensors(straight / "checkpoint-6" / f, out / "checkpoint-6" / f);

  // SIGTERM: the same, exit 143.
  const fs::path term = run.tmp.path / "term";
  auto d = run_cli(run.args(term), {"SF_TEST_FAULT=sigterm@step:1"});
  EXPECT_EQ(d.exit_code, 143) << d.output;
  EXPECT_EQ(read_file(term / "latest"), "checkpoint-1\n");

  // Two Ctrl-C during step 3 (before its save): quit at once, checkpoint-2 stays the latest.
  const fs::path twice = run.tmp.path / "twice";
  auto e = run_cli(run.args(twice), {"SF_TEST_FAULT=sigint2@step:3"});
  EXPECT_EQ(e.exit_code, 130) << e.output;
  EXPECT_TRUE(contains(e.output, "quitting without saving")) << e.output;
  EXPECT_EQ(read_file(twice / "latest"), "checkpoint-2\n");
  EXPECT_EQ(list_checkpoints(twice).size(), 1u);
}

// The trainer through the sliding engine with lazy threaded streams (every stream a thread
// that runs an op only once something waits for it): evaluation, an interrupt, a checkpoint,
// a resume and the final save give the bits of the same run on the synchronous host backend,
// so no host read of the trainer or the engine (params(), the loss, the norms) misses its
// synchronize.
TEST(Cli, LazyStreamsGiveTheSameRunAndCheckpoints) {
  CliRun run;
  auto sliding = [&](const fs::path& out) {
    auto a = run.args(out);
    a.insert(a.end(), {"--engine", "sliding", "--max-grad-norm", "0.5"});
    return a;
  };
  const fs::path straight = run.tmp.path / "straight";
  auto a = run_cli(sliding(straight));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const fs::path out = run.tmp.path / "lazy";
  auto b = run_cli(sliding(out), {"SF_TEST_LAZY_STREAMS=1", "SF_TEST_FAULT=sigint@step:3"});
  EXPECT_EQ(b.exit_code, 130) << b.output;
  // The test hook is live: the run used the lazy threaded streams (cli/test_hooks.h).
  EXPECT_NE(b.output.find("(threaded streams)"), std::string::npos) << b.output;
  auto c = run_cli({"train", "--out", out.string(), "--resume", "auto", "--backend", "host",
                    "--engine", "sliding"},
                   {"SF_TEST_LAZY_STREAMS=1"});
  ASSERT_EQ(c.exit_code, 0) << c.output;
  for (const char* f : {"resume/master.safetensors", "resume/adam_m.safetensors",
                        "resume/adam_v.safetensors", "model.safetensors"})
    for (const char* ck : {"checkpoint-2", "checkpoint-4", "checkpoint-6"})
      expect_same_tensors(straight / ck / f, out / ck / f);
  // The same losses, norms and clip coefficients (the timings differ).
  auto x = read_jsonl(straight / "metrics.jsonl"), y = read_jsonl(out / "metrics.jsonl");
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i)
    for (const char* k : {"step", "loss", "eval_loss", "grad_norm", "clip_coef", "lr"})
      EXPECT_EQ(x[i].value(k, nlohmann::json()), y[i].value(k, nlohmann::json())) << k << " " << i;
}

TEST(Cli, KilledDuringASaveResumesFromThePreviousCheckpointExactly) {
  CliRun run;
  const fs::path straight = run.tmp.path / "straight";
  ASSERT_EQ(run_cli(run.args(straight)).exit_code, 0);
  for (const char* point : {"checkpoint:model-written:4", "checkpoint:before-rename:4"}) {
    const fs::path out = run.tmp.path / (std::string("killed-") + point[11]);
    auto k = run_cli(run.args(out), {std::string("SF_TEST_FAULT=kill@") + point});
    EXPECT_EQ(k.signal, SIGKILL) << point << ": " << k.output;
    // The half-written checkpoint is a temporary; the previous one is intact and latest.
    bool tmp_left = false;
    for (auto& e : fs::directory_iterator(out))
      tmp_left |= e.path().filename().string().rfind("checkpoint-4.tmp.", 0) == 0;
    EXPECT_TRUE(tmp_left) << point;
    EXPECT_FALSE(fs::exists(out / "checkpoint-4"));
    EXPECT_EQ(read_file(out / "latest"), "checkpoint-2\n");
    auto r = run_cli({"train", "--out", out.string(), "--resume", "--backend", "host"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "resuming from " + (out / "checkpoint-2").string())) << r.output;
    for (const char* f : {"resume/master.safetensors", "resume/adam_m.safetensors",
                          "resume/adam_v.safetensors", "model.safetensors"})
      expect_same_tensors(straight / "checkpoint-6" / f, out / "checkpoint-6" / f);
  }
  // A mapped file failing (SIGBUS: the optimizer's disk, a truncated model file): a message
  // saying so, then the signal as before; the checkpoints on disk stay usable.
  const fs::path bus = run.tmp.path / "bus";
  auto b = run_cli(run.args(bus), {"SF_TEST_FAULT=sigbus@step:3"});
  EXPECT_EQ(b.signal, SIGBUS) << b.output;
  EXPECT_TRUE(contains(b.output, "a memory-mapped file could not be read or written")) << b.output;
  EXPECT_EQ(read_file(bus / "latest"), "checkpoint-2\n");
  // A failed write (full disk) in the CLI: exit 2 with the message, previous checkpoint kept.
  const fs::path full = run.tmp.path / "full";
  auto f = run_cli(run.args(full), {"SF_TEST_FAULT=fail@checkpoint:model-written:4"});
  EXPECT_EQ(f.exit_code, 2) << f.output;
  EXPECT_TRUE(contains(f.output, "No space left on device")) << f.output;
  EXPECT_TRUE(contains(f.output, (full / "checkpoint-2").string() + " is intact")) << f.output;
  EXPECT_EQ(read_file(full / "latest"), "checkpoint-2\n");
}

// With host memory one byte short of the smallest RAM-only window, --optimizer-dir puts the
// AdamW moments on disk: the plan says so, the run trains, saves and resumes exactly as the
// same run uninterrupted. (That the moments are the same numbers wherever they live, the
// engine's SlidingVsResident disk cases check bit for bit; here the short budget picks
// smaller chunks than a roomy one, which sums in another order.)
TEST(Cli, OptimizerDirTrainsWhenRamIsShortAndResumesExactly) {
  CliRun run;
  const ModelConfig cfg = tiny_config(Arch::qwen3);
  const StepRequest req{2 * 16, 2, 16};  // CliRun: batch 2 x seq 16, grad-accum 2
  auto ram_fits = [&](size_t h) {
    return make_plan(cfg, req, Budget{h, h, true}, DType::f32, HardwareModel{}, false).fits;
  };
  size_t lo = 1, hi = size_t(1) << 30;  // smallest host budget with everything in RAM
  ASSERT_TRUE(ram_fits(hi));
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (ram_fits(mid)) hi = mid;
    else lo = mid + 1;
  }
  const std::string short_ram = std::to_string(lo - 1);
  const fs::path dir = run.tmp.path / "nvme";
  fs::create_directories(dir);
  auto with = [&](std::vector<std::string> a, std::vector<std::string> extra) {
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const std::vector<std::string> on_disk = {"--engine", "sliding", "--host-memory", short_ram,
                                            "--optimizer-dir", dir.string()};
  auto refused = run_cli(with(run.args(run.tmp.path / "refused"), {"--engine", "sliding",
                                                                  "--host-memory", short_ram}));
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_TRUE(contains(refused.output, "--optimizer-dir DIR")) << refused.output;

  const fs::path straight = run.tmp.path / "straight";
  auto a = run_cli(with(run.args(straight), on_disk));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const fs::path out = run.tmp.path / "disk";
  auto b = run_cli(with(run.args(out), on_disk), {"SF_TEST_FAULT=sigint@step:3"});
  EXPECT_EQ(b.exit_code, 130) << b.output;
  EXPECT_TRUE(contains(b.output, "total disk (" + dir.string() + ")")) << b.output;
  auto c = run_cli(with({"train", "--out", out.string(), "--resume", "auto", "--backend", "host"},
                        on_disk));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  for (const char* f : {"resume/master.safetensors", "resume/adam_m.safetensors",
                        "resume/adam_v.safetensors", "model.safetensors"})
    expect_same_tensors(straight / "checkpoint-6" / f, out / "checkpoint-6" / f);
  EXPECT_TRUE(fs::is_empty(dir));  // the moments' file has no name and is gone
}

// A compact state with clipping, at the smallest host budget that fits with --optimizer-dir:
// every unit's moments there are not enough, the bf16 masters follow them (the plan says so),
// and the run trains, saves and resumes exactly as the same run uninterrupted.
// (8 wider layers: a unit's master must outweigh its share of the tier's 4 KiB-aligned slots.)
TEST(Cli, OptimizerDirTakesBf16MastersWhenTheMomentsThereAreNotEnough) {
  CliRun run;
  ModelConfig cfg = tiny_config(Arch::qwen3);
  cfg.num_hidden_layers = 8;
  cfg.hidden_size = 64;
  cfg.intermediate_size = 128;
  cfg.head_dim = 16;
  {
    const ModelLayout layout = ModelLayout::build(cfg);
    const auto params = init_params(layout, 7);
    std::vector<const float*> w;
    for (auto& p : params) w.push_back(p.data());
    SaveModelOptions so;
    so.dtype = DType::f32;
    save_model_dir(run.model, cfg, layout, w, so);  // replaces CliRun's model
  }
  StepRequest req{2 * 16, 2, 16};
  req.state_format = StateFormat{MomentFormat::int8, MasterFormat::bf16};
  const fs::path dir = run.tmp.path / "nvme";
  fs::create_directories(dir);
  auto plan_at = [&](size_t h) {
    Budget b{h, h, true};
    b.moments_dir = dir.string();
    b.moments_dir_free = disk_free_bytes(dir.string());
    return make_plan(cfg, req, b, DType::f32, HardwareModel{}, false);
  };
  size_t lo = 1, hi = size_t(1) << 30;  // the smallest host budget that fits
  ASSERT_TRUE(plan_at(hi).fits);
  while (lo < hi) {
    const size_t mid = (lo + hi) / 2;
    if (plan_at(mid).fits) hi = mid;
    else lo = mid + 1;
  }
  ASSERT_TRUE(plan_at(lo).engine.masters_on_disk) << "the tightest budget needs the masters on the disk";
  const std::vector<std::string> flags = {"--engine", "sliding", "--host-memory", std::to_string(lo),
                                          "--optimizer-dir", dir.string(), "--optimizer-state", "int8",
                                          "--master-weights", "bf16"};
  auto with = [&](std::vector<std::string> a) {
    a.insert(a.end(), flags.begin(), flags.end());
    return a;
  };
  auto plan = run_cli(with({"plan", "--model", run.model.string(), "--batch-size", "2", "--seq-len", "16",
                            "--grad-accum", "2", "--backend", "host"}));
  ASSERT_EQ(plan.exit_code, 0) << plan.output;
  EXPECT_TRUE(contains(plan.output, " masters (--optimizer-dir)")) << plan.output;
  const fs::path straight = run.tmp.path / "straight";
  auto a = run_cli(with(run.args(straight)));
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const fs::path out = run.tmp.path / "disk";
  auto b = run_cli(with(run.args(out)), {"SF_TEST_FAULT=sigint@step:3"});
  EXPECT_EQ(b.exit_code, 130) << b.output;
  auto c = run_cli(with({"train", "--out", out.string(), "--resume", "auto", "--backend", "host"}));
  ASSERT_EQ(c.exit_code, 0) << c.output;
  for (const char* f : {"resume/master.safetensors", "resume/adam_m.safetensors",
                        "resume/adam_v.safetensors", "model.safetensors"})
    expect_same_tensors(straight / "checkpoint-6" / f, out / "checkpoint-6" / f);
  EXPECT_TRUE(fs::is_empty(dir));
}

// `info` gives the training state's size, in RAM and with the moments on disk.
TEST(Cli, InfoShowsTheTrainingStateInRamAndWithADisk) {
  TempDir tmp("sf-cli-info");
  const fs::path model = make_tiny_model(tmp.path / "model");
  auto r = run_cli({"info", "--model", model.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "training state ")) << r.output;
  EXPECT_TRUE(contains(r.output, "GiB host (fp32 master + AdamW m, v; with --optimizer-dir "))
      << r.output;
}

// `plan` shows the whole memory table and the choice, cut models included, and refuses a run
// that does not fit with advice and a non-zero exit.
TEST(Cli, PlanShowsTheTableAndRefusesWhatDoesNotFit) {
  auto r = run_cli({"plan", "--size", "llama3-8b", "--layers", "8", "--batch-size", "32",
                    "--seq-len", "1024", "--backend", "cuda", "--engine", "sliding",
                    "--gpu-memory", "24GiB", "--host-memory", "112GiB"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "2.80 B parameters, 8 layers")) << r.output;
  EXPECT_TRUE(contains(r.output, "sliding window")) << r.output;
  EXPECT_TRUE(contains(r.output, "fp32 master + AdamW m, v")) << r.output;
  EXPECT_TRUE(contains(r.output, "fits       yes")) << r.output;
  auto bad = run_cli({"plan", "--size", "llama3-8b", "--batch-size", "32", "--seq-len", "1024",
                      "--backend", "cuda", "--gpu-memory", "24GiB", "--host-memory", "64GiB"});
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_TRUE(contains(bad.output, "host memory: needs")) << bad.output;
  EXPECT_TRUE(contains(bad.output, "--host-memory")) << bad.output;
}

// `plan` for another machine's disk: --disk-speed and --disk-free stand for the measurement
// and the filesystem (the directory need not exist); the 70B shape fits a 24 GiB GPU with
// 256 GiB of RAM and a 7 GB/s NVMe, some of its moments on that disk. Bad values are refused.
TEST(Cli, PlanTakesAnotherMachinesDisk) {
  const std::vector<std::string> base = {"plan", "--size", "llama3-70b", "--batch-size", "16", "--seq-len", "1024",
                                         "--backend", "cuda", "--gpu-memory", "24GiB", "--host-memory", "256GiB",
                                         "--optimizer-state", "int8", "--master-weights", "bf16",
                                         "--max-grad-norm", "0"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  auto r = run_cli(with({"--optimizer-dir", "/nonexistent/nvme/sf", "--disk-speed", "7GB/s", "--disk-free", "4TB"}));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"--disk-speed 7GB/s assumed", "optimizer disk 7.0 GB/s", "units (--optimizer-dir)",
                           "total disk (/nonexistent/nvme/sf)", "fits       yes"})
    EXPECT_TRUE(contains(r.output, line)) << line << "\n" << r.output;
  auto no_dir = run_cli(with({"--disk-speed", "7GB/s"}));
  EXPECT_NE(no_dir.exit_code, 0);
  EXPECT_TRUE(contains(no_dir.output, "--disk-speed describes --optimizer-dir's disk; add --optimizer-dir DIR"))
      << no_dir.output;
  auto not_rate = run_cli(with({"--optimizer-dir", "/x", "--disk-free", "4TB", "--disk-speed", "7GB"}));
  EXPECT_NE(not_rate.exit_code, 0);
  EXPECT_TRUE(contains(not_rate.output, "--disk-speed \"7GB\" is not a rate; write e.g. 7GB/s")) << not_rate.output;
  auto missing = run_cli(with({"--optimizer-dir", "/nonexistent/nvme/sf", "--disk-speed", "7GB/s"}));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_TRUE(contains(missing.output, "--optimizer-dir /nonexistent/nvme/sf is not a directory")) << missing.output;
}

}  // namespace
}  // namespace sf::test
