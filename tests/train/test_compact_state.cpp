// Compact training state in checkpoints (train/resume_state.h) and on resume, in each of the
// modes fp32/fp32, bf16/fp32, int8/fp32, int8/bf16 (moments/master), at the store level (the
// optimizer run directly on a ParamStore, so these run before the engine is wired for compact
// formats) and through the trainer: the resume files hold the state as stored and a resume is
// bit-exact; a checkpoint of another format converts, with one note; a checkpoint written
// before compact formats resumes; the HF weights of a bf16 master are its bits; bad flag
// values are refused naming the flag.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "core/thread_pool.h"
#include "optim/state_adamw.h"
#include "train/checkpoint.h"
#include "train/run_settings.h"
#include "train/trainer_state.h"
#include "state_format_test_util.h"
#include "train_test_util.h"

namespace sf::test {
namespace {

bool contains(const std::string& s, const std::string& w) { return s.find(w) != std::string::npos; }

const StateFormat kFp32{MomentFormat::f32, MasterFormat::f32};
const StateFormat kModes[] = {kFp32,
                              {MomentFormat::bf16, MasterFormat::f32},
                              {MomentFormat::int8, MasterFormat::f32},
                              {MomentFormat::int8, MasterFormat::bf16}};
const auto& kAllModes = kAllStateFormats;
std::string mode_name(StateFormat f) { return state_format_label(f); }

fs::path make_compact_model(const fs::path& dir) {
  const ModelConfig cfg = compact_config();
  const ModelLayout layout = ModelLayout::build(cfg);
  auto params = init_params(layout, 7);
  std::vector<const float*> w;
  for (auto& p : params) w.push_back(p.data());
  SaveModelOptions so;
  so.dtype = DType::f32;
  save_model_dir(dir, cfg, layout, w, so);
  return dir;
}

// Every unit of the store from random fp32 values, encoded in its format.
void fill_random(ParamStore& s, uint64_t seed) {
  for (int u = 0; u < s.n_units(); ++u) {
    const size_t n = size_t(s.numel(u));
    const auto w = random_vec(n, seed + 3 * uint64_t(u), -1.f, 1.f);
    const auto m = random_vec(n, seed + 3 * uint64_t(u) + 1, -0.1f, 0.1f);
    const auto v = random_vec(n, seed + 3 * uint64_t(u) + 2, 0.f, 0.01f);
    state_from_f32(s.state(u), 0, s.numel(u), w.data(), m.data(), v.data(), s.ranges(u));
  }
}

// Every byte of both stores' state (master, m, v, scales) is equal.
void expect_same_state(const ParamStore& a, const ParamStore& b, const std::string& what) {
  ASSERT_EQ(a.format(), b.format()) << what;
  ASSERT_EQ(a.n_units(), b.n_units()) << what;
  for (int u = 0; u < a.n_units(); ++u) {
    const UnitStateView x = a.state(u), y = b.state(u);
    const UnitStateLayout& l = *x.layout;
    const size_t sb = size_t(l.scale_count) * sizeof(float);
    EXPECT_EQ(0, std::memcmp(x.master, y.master, l.master_bytes)) << what << ": unit " << u << " master";
    EXPECT_EQ(0, std::memcmp(x.m, y.m, l.moment_bytes)) << what << ": unit " << u << " m";
    EXPECT_EQ(0, std::memcmp(x.v, y.v, l.moment_bytes)) << what << ": unit " << u << " v";
    if (sb > 0) {
      EXPECT_EQ(0, std::memcmp(x.m_scale, y.m_scale, sb)) << what << ": unit " << u << " m scales";
      EXPECT_EQ(0, std::memcmp(x.v_scale, y.v_scale, sb)) << what << ": unit " << u << " v scales";
    }
  }
}

// AdamW steps on every unit with gradients that depend only on (step, unit), as training
// would run them (whole units: windows that split no int8 block).
void run_steps(ParamStore& s, int n) {
  for (int k = 0; k < n; ++k) {
    AdamWStep st;
    st.lr = 1e-2f;  // large enough that a bf16 master moves every step
    st.weight_decay = 0.1f;
    st.step = s.step + 1;
    for (int u = 0; u < s.n_units(); ++u) {
      const auto g = random_vec(size_t(s.numel(u)), 1000 * uint64_t(st.step) + uint64_t(u), -1.f, 1.f);
      adamw_update_state(s.state(u), 0, s.numel(u), g.data(), nullptr, s.ranges(u), st, &host_pool());
    }
    ++s.step;
  }
}

struct StoreFixture {
  TempDir tmp{"sf-compact"};
  ModelConfig cfg = compact_config();
  ModelLayout layout = ModelLayout::build(cfg);
  std::vector<StateUnit> units = state_units(layout);

  // save_checkpoint of `s` at its step, with the trainer state a run would write.
  fs::path save(const ParamStore& s, const std::string& out, DType model_dtype = DType::f32) {
    TrainOptions opt;
    opt.state_format = s.format();
    RunPosition at{.step = s.step, .optimizer_step = s.step, .state_format = s.format(),
                   .rounding_seed = s.rounding_seed};
    CheckpointContents c;
    c.config = &cfg;
    c.layout = &layout;
    c.store = &s;
    c.trainer_state = trainer_state_json(at, opt, nlohmann::json::object(),
                                         nlohmann::json::object(), model_json(cfg, layout),
                                         nlohmann::json::array(), {});
    c.model.dtype = model_dtype;
    return save_checkpoint(tmp.path / out, s.step, c);
  }
};

class CompactCheckpoint : public ::testing::TestWithParam<StateFormat> {};

// The resume files hold the store's bytes as they are, in their own dtypes, and load back
// into a store of the same format byte for byte.
TEST_P(CompactCheckpoint, RoundTripKeepsEveryByteInItsOwnDtype) {
  const StateFormat f = GetParam();
  StoreFixture fx;
  ParamStore a(fx.units, f);
  fill_random(a, 5);
  a.step = 3;
  const fs::path dir = fx.save(a, "out");
  EXPECT_EQ(resume_state_format(dir), f);
  ParamStore b(fx.units, f);
  EXPECT_EQ(load_resume_tensors(dir, fx.layout, b), f);
  expect_same_state(a, b, mode_name(f));

  SafetensorsFile master(dir / "resume/master.safetensors"), m(dir / "resume/adam_m.safetensors");
  const StDType want_master = f.master == MasterFormat::bf16 ? StDType::BF16 : StDType::F32;
  for (auto& t : master.tensors()) EXPECT_EQ(t.dtype, want_master) << t.name;
  const StDType want_m = f.moments == MomentFormat::int8   ? StDType::U8
                         : f.moments == MomentFormat::bf16 ? StDType::BF16
                                                           : StDType::F32;
  size_t scales = 0;
  for (auto& t : m.tensors()) {
    const bool scale = t.name.size() > 6 && t.name.compare(t.name.size() - 6, 6, ".scale") == 0;
    scales += scale;
    EXPECT_EQ(t.dtype, scale ? StDType::F32 : want_m) << t.name;
  }
  EXPECT_EQ(scales, f.moments == MomentFormat::int8 ? fx.layout.units.size() : 0u);
  EXPECT_EQ(m.view().metadata().at("optimizer_state"), moment_format_name(f.moments));
  EXPECT_EQ(master.view().metadata().at("master_weights"), master_format_name(f.master));
  const nlohmann::json st = read_trainer_state(dir);
  EXPECT_EQ(st.at("state_format").at("optimizer_state"), moment_format_name(f.moments));
  EXPECT_EQ(st.at("state_format").at("master_weights"), master_format_name(f.master));
  EXPECT_EQ(st.at("settings").at("optimizer-state"), moment_format_name(f.moments));
}

// N steps straight equal N/2, save, load into a new store, N/2: every byte, the bf16
// master's stochastic rounding included (its seed comes back from trainer_state.json).
TEST_P(CompactCheckpoint, StoreResumedMidwayEqualsStraightBitForBit) {
  const StateFormat f = GetParam();
  StoreFixture fx;
  ParamStore straight(fx.units, f), first(fx.units, f);
  for (ParamStore* s : {&straight, &first}) {
    fill_random(*s, 9);
    s->rounding_seed = 0xabcdef12345ull;
  }
  run_steps(straight, 4);
  run_steps(first, 2);
  const fs::path dir = fx.save(first, "out");
  const ResumePoint rp = ResumePoint::read(dir);
  ParamStore resumed(fx.units, f);
  load_resume_tensors(dir, fx.layout, resumed);
  resumed.step = rp.optimizer_step();
  resumed.rounding_seed = rp.rounding_seed();
  EXPECT_EQ(resumed.rounding_seed, 0xabcdef12345ull);
  run_steps(resumed, 2);
  expect_same_state(straight, resumed, mode_name(f));
  if (f.master == MasterFormat::bf16) {
    // The test can fail: another rounding seed gives another bf16 master.
    ParamStore other(fx.units, f);
    load_resume_tensors(dir, fx.layout, other);
    other.step = rp.optimizer_step();
    run_steps(other, 2);
    EXPECT_NE(0, std::memcmp(other.state(1).master, straight.state(1).master,
                             straight.layout(1).master_bytes));
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, CompactCheckpoint, ::testing::ValuesIn(kModes),
                         [](const auto& i) { return mode_name(i.param); });

// A checkpoint in one format loaded into a store of another holds what state_from_f32 of the
// checkpoint's decoded state gives: every pair of the six formats.
TEST(CompactCheckpointConversion, LoadingIntoAnotherFormatConvertsThroughFp32) {
  StoreFixture fx;
  for (StateFormat from : kAllModes) {
    ParamStore saved(fx.units, from);
    fill_random(saved, 21);
    const fs::path dir = fx.save(saved, std::string("out-") + mode_name(from));
    for (StateFormat to : kAllModes) {
      if (to == from) continue;
      ParamStore loaded(fx.units, to), want(fx.units, to);
      EXPECT_EQ(load_resume_tensors(dir, fx.layout, loaded), from);
      for (int u = 0; u < saved.n_units(); ++u) {
        const size_t n = size_t(saved.numel(u));
        std::vector<float> w(n, 0.f), m(n, 0.f), v(n, 0.f);
        state_to_f32(saved.state(u), 0, saved.numel(u), w.data(), m.data(), v.data(), saved.ranges(u));
        state_from_f32(want.state(u), 0, want.numel(u), w.data(), m.data(), v.data(), want.ranges(u));
      }
      expect_same_state(want, loaded, mode_name(from) + " -> " + mode_name(to));
    }
  }
}

// The settings of a resume: the checkpoint's format unless given; a given other one is noted
// once (from what to what) and recorded; a checkpoint without the settings ran fp32.
TEST(CompactCheckpointConversion, ResumeSettingsTakeNoteOfAChangedFormat) {
  TrainOptions saved_opt;
  saved_opt.state_format = {MomentFormat::int8, MasterFormat::f32};
  const nlohmann::json saved = settings_json(saved_opt);
  std::vector<std::string> notes;
  nlohmann::json changes;
  TrainOptions asked;
  TrainOptions o = settings_for_resume(asked, saved, "ckpt", notes, changes);
  EXPECT_EQ(o.state_format, saved_opt.state_format);
  EXPECT_TRUE(notes.empty());
  EXPECT_TRUE(changes.empty()) << changes.dump();

  asked.state_format = {MomentFormat::int8, MasterFormat::bf16};
  asked.explicit_options = {"master-weights"};
  o = settings_for_resume(asked, saved, "ckpt", notes, changes);
  EXPECT_EQ(o.state_format, asked.state_format);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_TRUE(contains(notes[0], "(--optimizer-state int8, --master-weights fp32) is converted "
                                 "to --optimizer-state int8, --master-weights bf16"))
      << notes[0];
  EXPECT_EQ(changes.at("master-weights"), (nlohmann::json{{"from", "fp32"}, {"to", "bf16"}}));
  EXPECT_FALSE(changes.contains("optimizer-state"));

  nlohmann::json old = saved;  // a checkpoint before compact formats
  old.erase("optimizer-state");
  old.erase("master-weights");
  notes.clear();
  o = settings_for_resume(TrainOptions{}, old, "ckpt", notes, changes);
  EXPECT_EQ(o.state_format, kFp32);
  EXPECT_TRUE(notes.empty());
  old["optimizer-state"] = "int4";
  try {
    settings_for_resume(TrainOptions{}, old, "ckpt", notes, changes);
    FAIL() << "a damaged format setting was taken";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "ckpt/trainer_state.json")) << e.what();
    EXPECT_TRUE(contains(e.what(), "optimizer-state \"int4\" is not fp32, bf16 or int8")) << e.what();
  }
}

// The HF model directory of a checkpoint keeps the model's dtype; a bf16 master saved as bf16
// is written from its bits, saved as f32 from their exact values.
TEST(CompactCheckpoint, Bf16MasterIsSavedExactly) {
  StoreFixture fx;
  ParamStore s(fx.units, {MomentFormat::int8, MasterFormat::bf16});
  fill_random(s, 33);
  for (DType dtype : {DType::bf16, DType::f32}) {
    const fs::path dir = fx.save(s, std::string("out-") + std::string(dtype_name(dtype)), dtype);
    SafetensorsFile model(dir / "model.safetensors");
    EXPECT_EQ(load_config(dir / "config.json").torch_dtype, dtype);
    for (size_t u = 0; u < fx.layout.units.size(); ++u)
      for (auto& slot : fx.layout.units[u].params)
        for (auto& part : slot.parts) {
          const TensorInfo& t = model.get(part.hf_name);
          const uint16_t* bits = s.master_bf16(int(u)) + part.offset;
          if (dtype == DType::bf16) {
            ASSERT_EQ(t.dtype, StDType::BF16);
            EXPECT_EQ(0, std::memcmp(model.view().raw(t), bits, size_t(part.numel) * 2)) << part.hf_name;
          } else {
            std::vector<float> got(size_t(part.numel));
            model.read_f32(t, got.data());
            for (int64_t i = 0; i < part.numel; ++i)
              ASSERT_EQ(got[size_t(i)], bf16_to_f32(bits[i])) << part.hf_name << " " << i;
          }
        }
  }
}

// ---- through the trainer --------------------------------------------------------------------

struct RunFixture {
  TempDir tmp{"sf-compact-run"};
  fs::path model = make_compact_model(tmp.path / "model");
  fs::path tokens = make_tokens(tmp.path / "tokens.bin", 400, 80);
};

void expect_same_checkpoint_state(const fs::path& a, const fs::path& b) {
  for (const char* f : {"resume/master.safetensors", "resume/adam_m.safetensors",
                        "resume/adam_v.safetensors", "model.safetensors"})
    expect_same_tensors(a / f, b / f);
}

// 6 steps straight vs 3, stop, resume, 3: losses and every state byte equal. engine: the
// planner's choice (resident here) or the sliding window with its speculative updates.
void expect_train_resume_bit_exact(StateFormat f, const char* engine = "auto") {
  RunFixture fx;
  std::ostringstream log;
  TrainOptions straight = tiny_run(fx.model, fx.tokens, fx.tmp.path / "straight");
  straight.state_format = f;
  straight.engine = engine;
  TrainResult a = run_training(straight, log);
  TrainOptions split = tiny_run(fx.model, fx.tokens, fx.tmp.path / "split");
  split.state_format = f;
  split.engine = engine;
  TrainResult b1 = run_stopping(split, 3);
  ASSERT_EQ(b1.end_step, 3);
  split.resume = "auto";
  split.state_format = {};  // the checkpoint's format applies (not given again)
  TrainResult b2 = run_training(split, log);
  ASSERT_EQ(a.losses.size(), 6u);
  ASSERT_EQ(b2.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(0, std::memcmp(&a.losses[i], &b1.losses[i], sizeof(double))) << "step " << i + 1;
    EXPECT_EQ(0, std::memcmp(&a.losses[i + 3], &b2.losses[i], sizeof(double))) << "step " << i + 4;
  }
  expect_same_checkpoint_state(a.checkpoint, b2.checkpoint);
  EXPECT_EQ(resume_state_format(b2.checkpoint), f);
  const nlohmann::json st = read_trainer_state(b2.checkpoint);
  EXPECT_EQ(st.at("state_format").at("optimizer_state"), moment_format_name(f.moments));
  EXPECT_EQ(st.at("state_format").at("rounding_seed"),
            read_trainer_state(a.checkpoint).at("state_format").at("rounding_seed"));
}

TEST(CompactTrainResume, Fp32IsBitExact) {
  expect_train_resume_bit_exact(kFp32);
  expect_train_resume_bit_exact(kFp32, "sliding");
}

// Every compact mode, trained straight and interrupted + resumed: the same bits.
TEST(CompactTrainResume, CompactModesAreBitExact) {
  for (StateFormat f : kModes)
    for (const char* engine : {"auto", "sliding"})
      if (f != kFp32) {
        SCOPED_TRACE(mode_name(f) + " " + engine);
        expect_train_resume_bit_exact(f, engine);
      }
}

// Resuming an fp32 checkpoint with --optimizer-state int8 converts it with the note; the
// next checkpoint is int8.
TEST(CompactTrainResume, ResumeWithAnotherFormatConvertsWithANote) {
  RunFixture fx;
  TrainOptions o = tiny_run(fx.model, fx.tokens, fx.tmp.path / "run");
  run_stopping(o, 3);
  o.resume = "auto";
  o.state_format = {MomentFormat::int8, MasterFormat::f32};
  o.explicit_options = {"optimizer-state"};
  o.progress = TrainOptions::Progress::lines;
  std::ostringstream log;
  TrainResult r = run_training(o, log);
  EXPECT_TRUE(contains(log.str(), "(--optimizer-state fp32, --master-weights fp32) is converted to "
                                  "--optimizer-state int8"))
      << log.str();
  EXPECT_EQ(resume_state_format(r.checkpoint), o.state_format);
  const nlohmann::json st = read_trainer_state(r.checkpoint);
  EXPECT_EQ(st.at("schedule_changes").back().at("changes").at("optimizer-state").at("to"), "int8");
}

// A checkpoint written before compact formats: fp32 resume files without format metadata,
// no state_format in trainer_state.json, no format settings. It resumes bit for bit.
TEST(CompactTrainResume, CheckpointBeforeCompactFormatsResumes) {
  RunFixture fx;
  std::ostringstream log;
  TrainOptions straight = tiny_run(fx.model, fx.tokens, fx.tmp.path / "straight");
  TrainResult a = run_training(straight, log);
  TrainOptions o = tiny_run(fx.model, fx.tokens, fx.tmp.path / "old");
  TrainResult first = run_stopping(o, 3);
  const fs::path ckpt = first.checkpoint;
  // Age it: the resume files as the earlier version wrote them, and its trainer state.
  for (const char* name : {"master.safetensors", "adam_m.safetensors", "adam_v.safetensors"}) {
    const fs::path p = ckpt / "resume" / name;
    std::vector<std::vector<float>> data;
    std::vector<TensorWrite> ts;
    {
      SafetensorsFile f(p);
      for (auto& t : f.tensors()) data.push_back(f.read_f32(t.name));
      for (size_t i = 0; i < f.tensors().size(); ++i)
        ts.push_back({f.tensors()[i].name, DType::f32, f.tensors()[i].shape, data[i].data(), nullptr});
    }
    write_safetensors_file(p, ts, {{"slideformer", "resume-state"}, {"step", "3"}});
  }
  nlohmann::json st = read_trainer_state(ckpt);
  st.erase("state_format");
  st.at("settings").erase("optimizer-state");
  st.at("settings").erase("master-weights");
  write_file_atomic(ckpt / "trainer_state.json", st.dump(1) + "\n");
  ASSERT_FALSE(SafetensorsFile(ckpt / "resume/adam_m.safetensors").view().metadata().contains("optimizer_state"));

  o.resume = "auto";
  o.fault = {};
  o.stop_requested = {};
  TrainResult rest = run_training(o, log);
  ASSERT_EQ(rest.losses.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(a.losses[i + 3], rest.losses[i]) << "step " << i + 4;
  expect_same_checkpoint_state(a.checkpoint, rest.checkpoint);
  EXPECT_EQ(resume_state_format(rest.checkpoint), kFp32);
}

// ---- flags -------------------------------------------------------------------------------

void expect_refused(const std::vector<std::string>& args, const std::vector<std::string>& words) {
  auto r = run_cli(args);
  std::string cmd;
  for (auto& a : args) cmd += a + " ";
  EXPECT_EQ(r.exit_code, 2) << cmd << "\n" << r.output;
  for (auto& w : words) EXPECT_TRUE(contains(r.output, w)) << cmd << ": \"" << w << "\" in\n" << r.output;
}

TEST(CompactStateFlags, BadValuesAreRefusedNamingTheFlag) {
  const std::vector<std::string> state = {"--optimizer-state", "int4"};
  const std::vector<std::string> master = {"--master-weights", "fp16"};
  const std::vector<std::string> want_state = {"--optimizer-state \"int4\" is unknown", "fp32, bf16 or int8"};
  const std::vector<std::string> want_master = {"--master-weights \"fp16\" is unknown", "fp32 or bf16"};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  expect_refused(with({"train", "--print-config"}, state), want_state);
  expect_refused(with({"train", "--print-config"}, master), want_master);
  expect_refused(with({"bench", "--size", "tiny", "--backend", "host", "--steps", "1"}, state), want_state);
  expect_refused(with({"bench", "--size", "tiny", "--backend", "host", "--steps", "1"}, master), want_master);
  expect_refused(with({"plan", "--size", "tiny", "--backend", "host"}, state), want_state);
  expect_refused(with({"plan", "--size", "tiny", "--backend", "host"}, master), want_master);
}

// The YAML keys optimizer_state / master_weights are the flags; --print-config shows them.
TEST(CompactStateFlags, ConfigFileKeysAndPrintConfig) {
  TempDir tmp("sf-compact-cfg");
  const fs::path cfg = tmp.path / "run.yaml";
  std::ofstream(cfg) << "optimizer_state: int8\nmaster_weights: bf16\n";
  auto r = run_cli({"train", "--config", cfg.string(), "--print-config"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "optimizer-state = \"int8\"")) << r.output;
  EXPECT_TRUE(contains(r.output, "master-weights = \"bf16\"")) << r.output;
  std::ofstream(cfg) << "optimizer_state: int2\n";
  expect_refused({"train", "--config", cfg.string(), "--print-config"},
                 {"--optimizer-state \"int2\" is unknown"});
}

// `info` prints the training state's size in every mode, from unit_state_bytes.
TEST(CompactStateFlags, InfoPrintsTheStateSizePerMode) {
  TempDir tmp("sf-compact-info");
  const fs::path model = make_compact_model(tmp.path / "model");
  auto r = run_cli({"info", "--model", model.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const ModelLayout layout = ModelLayout::build(compact_config());
  size_t int8_bf16 = 0;
  for (auto& u : state_units(layout)) int8_bf16 += unit_state_bytes(u, kModes[3]);
  std::ostringstream want;
  want << std::fixed << std::setprecision(2)
       << double(int8_bf16) / double(compact_config().num_parameters()) << " B/param";
  EXPECT_TRUE(contains(r.output, "--master-weights bf16 --optimizer-state int8  " + want.str()))
      << r.output;
  EXPECT_TRUE(contains(r.output, "--master-weights fp32 --optimizer-state fp32  12.")) << r.output;
}

}  // namespace
}  // namespace sf::test

namespace sf::test {
namespace {

// Conversion windows: in order, covering every range exactly once, each inside one range,
// ending on the block grid (row == 0: absolute multiples of kStateBlock, or the range's end;
// row > 0: whole rows), and no longer than the chunk (rows: one row when a row exceeds it).
TEST(CompactCheckpointConversion, WindowsCoverTheRangesOnTheBlockGrid) {
  StateUnit u;
  u.numel = 20000;
  u.ranges = {{100, 3000, true, 0}, {3100, 40, false, 0}, {3200, 9 * 576, true, 576},
              {8400, 11000, true, 0}};
  for (int64_t chunk : {512, 1000, 4096}) {
    std::vector<std::pair<int64_t, int64_t>> w;
    for_each_state_window(u, chunk, [&](int64_t off, int64_t len) { w.push_back({off, len}); });
    size_t k = 0;
    for (const ParamRange& r : u.ranges) {
      int64_t at = r.offset;
      while (at < r.offset + r.numel) {
        ASSERT_LT(k, w.size());
        const auto [off, len] = w[k++];
        ASSERT_EQ(off, at) << "chunk " << chunk;
        ASSERT_GT(len, 0);
        const int64_t end = off + len;
        ASSERT_LE(end, r.offset + r.numel);
        if (r.row > 0) {
          EXPECT_EQ(len % r.row, 0) << off;
          EXPECT_LE(len, std::max(r.row, chunk));
        } else {
          EXPECT_TRUE(end == r.offset + r.numel || end % kStateBlock == 0) << off << " " << len;
          EXPECT_LE(len, chunk);
        }
        at = end;
      }
    }
    EXPECT_EQ(k, w.size()) << "chunk " << chunk;
    // The encoders take these windows and give the bytes of one whole-unit call.
    for (StateFormat f : kAllModes) {
      ParamStore whole({u}, f), pieces({u}, f);
      const size_t n = size_t(u.numel);
      const auto p = random_vec(n, 1, -1.f, 1.f), m = random_vec(n, 2, -.1f, .1f),
                 v = random_vec(n, 3, 0.f, .01f);
      state_from_f32(whole.state(0), 0, u.numel, p.data(), m.data(), v.data(), u.ranges);
      for (auto [off, len] : w)
        state_from_f32(pieces.state(0), off, len, p.data() + off, m.data() + off, v.data() + off,
                       u.ranges);
      expect_same_state(whole, pieces, mode_name(f) + " chunk " + std::to_string(chunk));
    }
  }
}

}  // namespace
}  // namespace sf::test
