// The tables of recorded settings (see run_settings.h for the three kinds and their rules):
// one row per flag, with how to read it from and write it into TrainOptions. A new option
// that shapes the computation belongs in fixed_settings(), else a resume silently differs.
#include "train/run_settings.h"

#include "core/dtype.h"
#include "core/error.h"

namespace sf {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Setting {
  const char* flag;
  json (*get)(const TrainOptions&);
  void (*set)(TrainOptions&, const json&);
};

// Everything that shapes the computation of a step. (Where the model and data are read from
// is recorded too, but compared by content: shape and data identity.)
const std::vector<Setting>& fixed_settings() {
  static const std::vector<Setting> s = {
      {"batch-size", [](const TrainOptions& o) { return json(o.batch_size); },
       [](TrainOptions& o, const json& j) { o.batch_size = j.get<int>(); }},
      {"seq-len", [](const TrainOptions& o) { return json(o.seq_len); },
       [](TrainOptions& o, const json& j) { o.seq_len = j.get<int>(); }},
      {"grad-accum", [](const TrainOptions& o) { return json(o.grad_accum); },
       [](TrainOptions& o, const json& j) { o.grad_accum = j.get<int>(); }},
      {"weight-decay", [](const TrainOptions& o) { return json(o.hyper.weight_decay); },
       [](TrainOptions& o, const json& j) { o.hyper.weight_decay = j.get<float>(); }},
      {"beta1", [](const TrainOptions& o) { return json(o.hyper.beta1); },
       [](TrainOptions& o, const json& j) { o.hyper.beta1 = j.get<float>(); }},
      {"beta2", [](const TrainOptions& o) { return json(o.hyper.beta2); },
       [](TrainOptions& o, const json& j) { o.hyper.beta2 = j.get<float>(); }},
      {"adam-eps", [](const TrainOptions& o) { return json(o.hyper.eps); },
       [](TrainOptions& o, const json& j) { o.hyper.eps = j.get<float>(); }},
      {"max-grad-norm", [](const TrainOptions& o) { return json(o.hyper.max_grad_norm); },
       [](TrainOptions& o, const json& j) { o.hyper.max_grad_norm = j.get<float>(); }},
      {"seed", [](const TrainOptions& o) { return json(o.seed); },
       [](TrainOptions& o, const json& j) { o.seed = j.get<uint64_t>(); }},
      {"shuffle", [](const TrainOptions& o) { return json(o.shuffle); },
       [](TrainOptions& o, const json& j) { o.shuffle = j.get<bool>(); }},
      {"eval-fraction", [](const TrainOptions& o) { return json(o.eval_fraction); },
       [](TrainOptions& o, const json& j) { o.eval_fraction = j.get<double>(); }},
      {"eval-batches", [](const TrainOptions& o) { return json(o.eval_batches); },
       [](TrainOptions& o, const json& j) { o.eval_batches = j.get<int>(); }},
  };
  return s;
}

// The learning-rate schedule: taken from the checkpoint unless given again; a new value is
// allowed (lowering the lr of a run that misbehaves is common practice), with a warning that
// names both values, and recorded in trainer_state.json's schedule_changes. Checkpoints of
// earlier versions lack warmup-ratio: 0, the warmup they ran with.
struct ScheduleSetting {
  const char* flag;
  json (*get)(const TrainOptions&);
  void (*set)(TrainOptions&, const json&);
  json fallback;
};

const std::vector<ScheduleSetting>& schedule_settings() {
  static const std::vector<ScheduleSetting> s = {
      {"lr", [](const TrainOptions& o) { return json(o.schedule.lr); },
       [](TrainOptions& o, const json& j) { o.schedule.lr = j.get<double>(); }, nullptr},
      {"lr-schedule",
       [](const TrainOptions& o) { return json(std::string(LrSchedule::kind_name(o.schedule.kind))); },
       [](TrainOptions& o, const json& j) { o.schedule.kind = LrSchedule::parse_kind(j.get<std::string>()); },
       nullptr},
      {"warmup-steps", [](const TrainOptions& o) { return json(o.schedule.warmup_steps); },
       [](TrainOptions& o, const json& j) { o.schedule.warmup_steps = j.get<int64_t>(); }, nullptr},
      {"warmup-ratio", [](const TrainOptions& o) { return json(o.warmup_ratio); },
       [](TrainOptions& o, const json& j) { o.warmup_ratio = j.get<double>(); }, 0.0},
      {"min-lr-ratio", [](const TrainOptions& o) { return json(o.schedule.min_lr_ratio); },
       [](TrainOptions& o, const json& j) { o.schedule.min_lr_ratio = j.get<double>(); }, nullptr},
  };
  return s;
}

// How the training state is stored (--optimizer-state, --master-weights): taken from the
// checkpoint unless given again; a new value is allowed: the checkpoint's state is converted
// as it loads (train/resume_state.h), said in one note and recorded in schedule_changes.
// Checkpoints before compact formats lack them: fp32, what they ran with.
const std::vector<ScheduleSetting>& state_format_settings() {
  static const std::vector<ScheduleSetting> s = {
      {"optimizer-state",
       [](const TrainOptions& o) { return json(moment_format_name(o.state_format.moments)); },
       [](TrainOptions& o, const json& j) {
         const auto f = parse_moment_format(j.get<std::string>());
         SF_REQUIRE(f, "optimizer-state \"", j.get<std::string>(), "\" is not fp32, bf16 or int8");
         o.state_format.moments = *f;
       },
       "fp32"},
      {"master-weights",
       [](const TrainOptions& o) { return json(master_format_name(o.state_format.master)); },
       [](TrainOptions& o, const json& j) {
         const auto f = parse_master_format(j.get<std::string>());
         SF_REQUIRE(f, "master-weights \"", j.get<std::string>(), "\" is not fp32 or bf16");
         o.state_format.master = *f;
       },
       "fp32"},
  };
  return s;
}

// "--optimizer-state int8, --master-weights bf16"
std::string state_format_flags(StateFormat f) {
  return cat("--optimizer-state ", moment_format_name(f.moments), ", --master-weights ",
             master_format_name(f.master));
}

// How the run is carried out, not what it computes: taken from the checkpoint unless given
// again (then the new value wins), so that the printed resume command (`--out DIR --resume
// auto`) keeps the run's evaluation and checkpoint cadence, its budgets and its backend.
// Checkpoints of earlier versions lack them: the command line's values stay.
std::string save_dtype_text(const TrainOptions& o) {
  return o.save_dtype ? std::string(dtype_name(*o.save_dtype)) : std::string("auto");
}
void set_save_dtype(TrainOptions& o, const json& j) {
  const std::string s = j.get<std::string>();
  o.save_dtype.reset();
  for (DType t : {DType::bf16, DType::f16, DType::f32})
    if (s == dtype_name(t)) o.save_dtype = t;
}

const std::vector<Setting>& run_settings() {
  static const std::vector<Setting> s = {
      {"eval-every", [](const TrainOptions& o) { return json(o.eval_every); },
       [](TrainOptions& o, const json& j) { o.eval_every = j.get<int64_t>(); }},
      {"save-every", [](const TrainOptions& o) { return json(o.save_every); },
       [](TrainOptions& o, const json& j) { o.save_every = j.get<int64_t>(); }},
      {"keep-checkpoints", [](const TrainOptions& o) { return json(o.keep_checkpoints); },
       [](TrainOptions& o, const json& j) { o.keep_checkpoints = j.get<int>(); }},
      {"log-every", [](const TrainOptions& o) { return json(o.log_every); },
       [](TrainOptions& o, const json& j) { o.log_every = j.get<int64_t>(); }},
      {"backend", [](const TrainOptions& o) { return json(o.backend); },
       [](TrainOptions& o, const json& j) { o.backend = j.get<std::string>(); }},
      {"engine", [](const TrainOptions& o) { return json(o.engine); },
       [](TrainOptions& o, const json& j) { o.engine = j.get<std::string>(); }},
      {"device-adamw-layers", [](const TrainOptions& o) { return json(o.device_adamw_layers); },
       [](TrainOptions& o, const json& j) { o.device_adamw_layers = j.get<std::string>(); }},
      {"checkpoint-every", [](const TrainOptions& o) { return json(o.checkpoint_every); },
       [](TrainOptions& o, const json& j) { o.checkpoint_every = j.get<std::string>(); }},
      {"gpu-memory", [](const TrainOptions& o) { return json(o.gpu_memory); },
       [](TrainOptions& o, const json& j) { o.gpu_memory = j.get<std::string>(); }},
      {"host-memory", [](const TrainOptions& o) { return json(o.host_memory); },
       [](TrainOptions& o, const json& j) { o.host_memory = j.get<std::string>(); }},
      {"optimizer-dir", [](const TrainOptions& o) { return json(o.optimizer_dir); },
       [](TrainOptions& o, const json& j) { o.optimizer_dir = j.get<std::string>(); }},
      {"dtype", [](const TrainOptions& o) { return json(save_dtype_text(o)); }, set_save_dtype},
  };
  return s;
}

// How the data file is read: taken from the checkpoint unless given, and compared through the
// data identity (formats, sample counts, fingerprints), not here: "auto" and the format it
// detects are the same data. Checkpoints of earlier versions lack them: the defaults.
struct DataSetting {
  const char* flag;
  json (*get)(const TrainOptions&);
  void (*set)(TrainOptions&, const json&);
  json fallback;
};

const std::vector<DataSetting>& data_settings() {
  static const std::vector<DataSetting> s = {
      {"data-format", [](const TrainOptions& o) { return json(o.data_format); },
       [](TrainOptions& o, const json& j) { o.data_format = j.get<std::string>(); }, "auto"},
      {"chat-format", [](const TrainOptions& o) { return json(o.chat_format); },
       [](TrainOptions& o, const json& j) { o.chat_format = j.get<std::string>(); }, "auto"},
      {"chat-date", [](const TrainOptions& o) { return json(o.chat_date); },
       [](TrainOptions& o, const json& j) { o.chat_date = j.get<std::string>(); }, ""},
      {"overflow", [](const TrainOptions& o) { return json(o.overflow); },
       [](TrainOptions& o, const json& j) { o.overflow = j.get<std::string>(); }, "auto"},
      {"skip-bad-lines", [](const TrainOptions& o) { return json(o.skip_bad_lines); },
       [](TrainOptions& o, const json& j) { o.skip_bad_lines = j.get<bool>(); }, false},
      {"eval-file", [](const TrainOptions& o) { return json(o.eval_file.string()); },
       [](TrainOptions& o, const json& j) { o.eval_file = j.get<std::string>(); }, ""},
  };
  return s;
}

}  // namespace

json settings_json(const TrainOptions& o) {
  json j = json::object();
  for (auto& s : fixed_settings()) j[s.flag] = s.get(o);
  for (auto& s : schedule_settings()) j[s.flag] = s.get(o);
  for (auto& s : state_format_settings()) j[s.flag] = s.get(o);
  j["steps"] = o.steps;
  j["epochs"] = o.epochs;
  j["model"] = o.model_dir.string();
  j["example-size"] = o.example_size;
  j["tokens"] = o.tokens_file.string();
  for (auto& d : data_settings()) j[d.flag] = d.get(o);
  for (auto& r : run_settings()) j[r.flag] = r.get(o);
  return j;
}

namespace {

// The schedule settings a resumed run uses, into `o`; each given value that differs from the
// checkpoint's goes into `changes` ({flag: {"from": saved, "to": given}}) with a warning.
void resume_schedule(TrainOptions& o, const TrainOptions& opt, const json& saved,
                     json& changes, std::vector<std::string>& notes) {
  auto given = [&](const char* flag) { return opt.explicit_options.count(flag) > 0; };
  for (auto& s : schedule_settings()) {
    SF_REQUIRE(saved.contains(s.flag) || !s.fallback.is_null(), "the checkpoint's settings lack \"",
               s.flag, "\"; it is damaged or from another version");
    const json old = saved.contains(s.flag) ? saved.at(s.flag) : s.fallback;
    if (!given(s.flag)) {
      s.set(o, old);
    } else if (s.get(opt) != old) {
      changes[s.flag] = {{"from", old}, {"to", s.get(opt)}};
      notes.push_back(cat("warning: --", s.flag, " ", s.get(opt).dump(), " replaces the checkpoint's ",
                          old.dump(), " from this step on (recorded in trainer_state.json "
                          "\"schedule_changes\"); the run no longer matches an uninterrupted one"));
    }
  }
  // One warmup rule: a warmup given in steps replaces a recorded ratio, and a ratio given
  // replaces the recorded steps (derived again from the ratio).
  if (given("warmup-steps")) o.warmup_ratio = 0;
}

// The state format a resumed run uses, into `o`: the checkpoint's unless given; a given one
// that differs goes into `changes` and one note says the state is converted from what to what.
void resume_state_format(TrainOptions& o, const TrainOptions& opt, const json& saved,
                         json& changes, std::vector<std::string>& notes) {
  TrainOptions before = o;  // the checkpoint's format, for the note
  for (auto& s : state_format_settings()) {
    const json old = saved.contains(s.flag) ? saved.at(s.flag) : s.fallback;
    s.set(before, old);
    if (!opt.explicit_options.count(s.flag)) s.set(o, old);
    else if (s.get(opt) != old) changes[s.flag] = {{"from", old}, {"to", s.get(opt)}};
  }
  if (before.state_format != o.state_format)
    notes.push_back(cat("note: the checkpoint's training state (", state_format_flags(before.state_format),
                        ") is converted to ", state_format_flags(o.state_format),
                        " as it loads (recorded in trainer_state.json \"schedule_changes\"); "
                        "the run no longer matches an uninterrupted one"));
}

// --steps / --epochs on resume: the checkpoint's unless given; a new length re-shapes a
// decaying schedule, so it is noted and recorded like a schedule change.
void resume_length(TrainOptions& o, const TrainOptions& opt, const json& saved, json& changes,
                   std::vector<std::string>& notes) {
  auto given = [&](const char* flag) { return opt.explicit_options.count(flag) > 0; };
  const int64_t saved_steps = saved.value("steps", int64_t(0));
  const double saved_epochs = saved.value("epochs", 0.0);
  if (!given("steps") && !given("epochs")) {
    o.steps = saved_steps;
    o.epochs = saved_epochs;
    return;
  }
  const bool steps_given = given("steps");
  if (steps_given) o.epochs = 0;
  const json from = saved_epochs > 0 ? json(saved_epochs) : json(saved_steps);
  const json to = steps_given ? json(o.steps) : json(o.epochs);
  const char* flag = steps_given ? "steps" : "epochs";
  if ((saved_epochs > 0) == !steps_given && from == to) return;
  changes[flag] = {{"from", from}, {"to", to}};
  if (o.schedule.kind == LrSchedule::Kind::constant) return;
  notes.push_back(cat("note: --", flag, " ", to.dump(), " differs from the checkpoint's ",
                      saved_epochs > 0 ? "--epochs " : "--steps ", from.dump(),
                      ": the learning-rate schedule now spans the new length, so the run no "
                      "longer matches the original one"));
}

}  // namespace

// The options a resumed run uses: the checkpoint's settings, except those the user set.
TrainOptions settings_for_resume(const TrainOptions& opt, const json& saved,
                                 const fs::path& ckpt, std::vector<std::string>& notes,
                                 json& schedule_changes) {
  TrainOptions o = opt;
  auto given = [&](const char* flag) { return opt.explicit_options.count(flag) > 0; };
  for (auto& s : fixed_settings()) {
    SF_REQUIRE(saved.contains(s.flag), ckpt.string(), "/trainer_state.json: settings lack \"",
               s.flag, "\"; the checkpoint is damaged or from another version");
    const json& v = saved.at(s.flag);
    if (given(s.flag) && s.get(opt) != v)
      SF_FAIL(input, "--", s.flag, " ", s.get(opt).dump(), " differs from ", v.dump(),
              " in the checkpoint ", ckpt.string(),
              "; a resumed run keeps the settings it started with: drop --", s.flag,
              ", or start a new run with another --out");
    s.set(o, v);
  }
  schedule_changes = json::object();
  try {
    resume_schedule(o, opt, saved, schedule_changes, notes);
  } catch (const Error& e) {
    SF_FAIL(input, ckpt.string(), "/trainer_state.json: ", e.what());
  }
  resume_length(o, opt, saved, schedule_changes, notes);
  try {
    resume_state_format(o, opt, saved, schedule_changes, notes);
  } catch (const Error& e) {
    SF_FAIL(input, ckpt.string(), "/trainer_state.json: settings: ", e.what(),
            "; the checkpoint is damaged or from a newer version");
  }
  if (!given("model")) o.model_dir = saved.value("model", std::string());
  if (!given("example-size")) o.example_size = saved.value("example-size", o.example_size);
  if (!given("tokens") && !given("data")) o.tokens_file = saved.value("tokens", std::string());
  for (auto& d : data_settings())
    if (!given(d.flag)) d.set(o, saved.contains(d.flag) ? saved.at(d.flag) : d.fallback);
  for (auto& r : run_settings())
    if (!given(r.flag) && saved.contains(r.flag)) r.set(o, saved.at(r.flag));
  return o;
}

}  // namespace sf
