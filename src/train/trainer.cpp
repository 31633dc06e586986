#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "core/dtype.h"
#include "core/error.h"
#include "core/stopwatch.h"
#include "data/data_source.h"
#include "engine/executor_factory.h"
#include "io/atomic_file.h"
#include "io/model_config.h"
#include "model/model_init.h"
#include "model/model_presets.h"
#include "model/weights_io.h"
#include "report/plot.h"
#include "report/progress.h"
#include "train/model_dir.h"
#include "train/run_settings.h"

namespace sf {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr int kStateVersion = 1;

struct ModelSource {
  ModelConfig config;
  fs::path weights_dir;    // empty: random init
  fs::path tokenizer_dir;  // copied next to saved weights
  fs::path tokens;
};

ModelSource resolve_source(const TrainOptions& opt) {
  ModelSource src;
  if (opt.model_dir.empty()) {
    src.config = model_preset(opt.example_size);
    src.tokenizer_dir = opt.examples_dir / "sotu";
    src.tokens = opt.tokens_file.empty() ? opt.examples_dir / "sotu" / "sotu-gpt2.bin"
                                         : opt.tokens_file;
  } else {
    SF_REQUIRE(fs::exists(opt.model_dir / "config.json"), opt.model_dir.string(),
               ": no config.json here; --model must be a Hugging Face model directory");
    src.config = load_config(opt.model_dir / "config.json");
    src.weights_dir = opt.model_dir;
    src.tokenizer_dir = opt.model_dir;
    SF_REQUIRE(!opt.tokens_file.empty(),
               "--data FILE is required with --model (a JSONL dataset: text, prompt/completion "
               "or messages; or a token file: llm.c .bin or raw uint32)");
    src.tokens = opt.tokens_file;
  }
  return src;
}

json model_json(const ModelConfig& c, const ModelLayout& layout) {
  json units = json::array();
  for (auto& u : layout.units) units.push_back(u.numel);
  return {{"model_type", std::string(arch_name(c.arch))},
          {"vocab_size", c.vocab_size},
          {"hidden_size", c.hidden_size},
          {"intermediate_size", c.intermediate_size},
          {"num_hidden_layers", c.num_hidden_layers},
          {"num_attention_heads", c.num_attention_heads},
          {"num_key_value_heads", c.num_key_value_heads},
          {"head_dim", c.head_dim},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"qkv_bias", c.qkv_bias},
          {"qk_norm", c.qk_norm},
          {"rope_theta", c.rope_theta},
          {"rms_norm_eps", c.rms_norm_eps},
          {"num_parameters", c.num_parameters()},
          {"unit_numel", units}};
}

std::string model_mismatch(const json& saved, const json& now) {
  for (auto& [k, v] : now.items()) {
    if (!saved.contains(k)) return cat("the checkpoint does not record the model's ", k);
    if (saved.at(k) != v)
      return cat("the model's ", k, " is ", v.dump(), " but the checkpoint's is ",
                 saved.at(k).dump());
  }
  return {};
}

// SplitMix64: the trainer's RNG. Nothing in a step draws from it today; it advances once per
// step so that a stochastic feature added later (dropout, sampling) resumes exactly too.
struct Rng {
  uint64_t state = 0;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

std::string hex64(uint64_t v) {
  std::ostringstream os;
  os << std::hex << std::setw(16) << std::setfill('0') << v;
  return os.str();
}

uint64_t parse_hex64(const std::string& s) { return std::stoull(s, nullptr, 16); }

double json_number(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : NAN;
}

fs::path resolve_resume(const std::string& arg, const fs::path& out, std::string* note) {
  if (arg == "auto") {
    auto c = find_latest_checkpoint(out, note);
    return c ? c->dir : fs::path();
  }
  fs::path p(arg);
  SF_REQUIRE(fs::exists(p), "--resume ", arg, ": no such directory; pass a checkpoint-<step> "
             "directory, an output directory, or auto");
  if (fs::exists(p / "trainer_state.json")) return p;
  auto c = find_latest_checkpoint(p, note);
  SF_REQUIRE(c, "--resume ", arg, ": neither a checkpoint (no trainer_state.json) nor an output "
             "directory holding one; pass a checkpoint-<step> directory or auto");
  return c->dir;
}

}  // namespace

TrainResult run_training(const TrainOptions& opt_in, std::ostream& log) {
  validate_train_options(opt_in);
  fs::create_directories(opt_in.out_dir);
  OutDirLock lock(opt_in.out_dir);
  remove_checkpoint_temporaries(opt_in.out_dir);
  const fs::path out = opt_in.out_dir;

  ProgressDisplay::Mode mode = opt_in.progress == TrainOptions::Progress::bar
                                   ? ProgressDisplay::Mode::bar
                               : opt_in.progress == TrainOptions::Progress::lines
                                   ? ProgressDisplay::Mode::lines
                                   : ProgressDisplay::Mode::quiet;
  ProgressDisplay progress(log, mode, opt_in.log_every, opt_in.columns);
  auto say = [&](const std::string& s) { progress.message(s); };

  // ---- where we start from
  std::string note;
  fs::path resume_dir;
  if (!opt_in.resume.empty()) {
    resume_dir = resolve_resume(opt_in.resume, out, &note);
    if (!note.empty()) say(note);
    if (resume_dir.empty())
      say(cat("no checkpoint in ", out.string(), " to resume from; starting a new run"));
  }
  // A fresh run never mixes its checkpoints with an earlier run's: refused here, or (with
  // overwrite) deleted once the model and data have loaded.
  std::vector<CheckpointRef> earlier;
  if (resume_dir.empty()) {
    earlier = list_checkpoints(out);
    SF_REQUIRE(earlier.empty() || opt_in.overwrite, out.string(),
               " holds checkpoints of an earlier run (newest: ",
               earlier.empty() ? std::string() : earlier.back().dir.filename().string(),
               "); pass --resume to continue it, --overwrite to delete them and start again, or "
               "another --out");
  }
  json saved;
  TrainOptions opt = opt_in;
  if (!resume_dir.empty()) {
    saved = read_trainer_state(resume_dir);
    SF_REQUIRE(saved.value("format", std::string()) == "slideformer-trainer-state" &&
                   saved.value("version", 0) == kStateVersion,
               (resume_dir / "trainer_state.json").string(),
               ": not a slideformer trainer state of version ", kStateVersion);
    std::vector<std::string> notes;
    opt = settings_for_resume(opt_in, saved.at("settings"), resume_dir, notes);
    validate_train_options(opt);
    for (auto& n : notes) say(n);
  }
  opt.schedule.total_steps = opt.steps;
  const int64_t start_step = saved.is_null() ? 0 : saved.at("step").get<int64_t>();
  TrainResult res;
  res.start_step = res.end_step = start_step;
  res.checkpoint = resume_dir;  // until this run saves one
  if (start_step >= opt.steps) {
    say(cat("the checkpoint ", resume_dir.string(), " is at step ", start_step,
            ", which already reaches --steps ", opt.steps,
            "; nothing to do (pass a larger --steps to train further)"));
    return res;
  }

  // ---- model and data
  ModelSource src = resolve_source(opt);
  const ModelConfig& cfg = src.config;
  check_sequence_length(cfg, opt.seq_len, src.weights_dir.empty()
                                              ? std::string("the bundled example")
                                              : (src.weights_dir / "config.json").string());
  ModelLayout layout = ModelLayout::build(cfg);
  const json model_now = model_json(cfg, layout);
  if (!saved.is_null()) {
    std::string why = model_mismatch(saved.at("model"), model_now);
    SF_REQUIRE(why.empty(), "cannot resume from ", resume_dir.string(), ": ", why,
               "; resume with the model the checkpoint was trained from, or start a new run "
               "with another --out");
  }
  DataRequest dr;
  dr.path = src.tokens;
  dr.seq_len = opt.seq_len;
  dr.eval_fraction = opt.eval_fraction;
  dr.eval_batches = opt.eval_batches;
  dr.eval_rows = opt.batch_size;
  dr.vocab_size = cfg.vocab_size;
  dr.seed = opt.seed;
  dr.shuffle = opt.shuffle;
  dr.tokenizer_dir = src.tokenizer_dir;
  dr.format = opt.data_format;
  dr.chat_format = opt.chat_format;
  dr.chat_date = opt.chat_date;
  dr.overflow = opt.overflow;
  dr.skip_bad_lines = opt.skip_bad_lines;
  dr.eval_file = opt.eval_file;
  DataSource data = open_data_source(dr);
  // The date a Llama 3.2+ template rendered (today's, unless given): recorded in the settings so
  // that a resume, on another day, renders the same conversations.
  if (opt.chat_date.empty() && data.identity.contains("chat_date"))
    opt.chat_date = data.identity.at("chat_date").get<std::string>();
  if (!saved.is_null()) {
    std::string why = data_identity_mismatch(saved.at("data").at("identity"), data.identity);
    SF_REQUIRE(why.empty(), "cannot resume from ", resume_dir.string(), " on ",
               src.tokens.string(), ": ", why,
               "; resume with the data and data settings the checkpoint was trained on (--data / "
               "--tokens, --data-format, --chat-format, --chat-date, --overflow, "
               "--skip-bad-lines, --eval-file), or start a new run with another --out");
    data.train->restore(saved.at("data").at("state"));
  }

  ExecutorRequest er;
  er.backend = opt.backend;
  er.engine = opt.engine;
  er.device_adamw_layers = opt.device_adamw_layers;
  er.gpu_memory = opt.gpu_memory;
  er.host_memory = opt.host_memory;
  er.optimizer_dir = opt.optimizer_dir;
  er.step.micro_tokens = int64_t(opt.batch_size) * opt.seq_len;
  er.step.grad_accum = opt.grad_accum;
  er.step.max_seq_len = opt.seq_len;
  const PlannedRun planned = plan_run(cfg, er);
  auto exec = make_executor(cfg, er, planned);
  {
    ParamStore& store = exec->params();
    if (!saved.is_null()) {
      load_resume_tensors(resume_dir, layout, store);
      store.step = saved.at("optimizer_step").get<int64_t>();
    } else if (src.weights_dir.empty()) {
      for (int u = 0; u < store.n_units(); ++u)
        init_unit(layout.units[size_t(u)], store.master(u), opt.seed);
    } else {
      load_model_weights(src.weights_dir, cfg, layout, store.master_ptrs());
    }
  }
  exec->params_changed();

  Rng rng{opt.seed};
  double elapsed_before = 0;
  int64_t tokens_seen = 0;
  std::vector<json> history;  // metrics records so far (one per step, plus evaluations)
  if (!saved.is_null()) {
    rng.state = parse_hex64(saved.at("rng").at("state").get<std::string>());
    elapsed_before = saved.value("elapsed_seconds", 0.0);
    tokens_seen = saved.value("tokens_seen", int64_t(0));
    for (auto& m : saved.value("metrics", json::array())) history.push_back(m);
  }
  if (resume_dir.empty()) {
    for (auto& c : earlier) fs::remove_all(c.dir);
    if (!earlier.empty())
      say(cat("removed ", earlier.size(), " checkpoint(s) of an earlier run in ", out.string()));
    std::error_code ec;
    for (const char* f : {"latest", "loss.png"}) fs::remove(out / f, ec);
  }
  // metrics.jsonl: exactly the history up to the start, then appended step by step.
  {
    std::string text;
    for (auto& m : history) text += m.dump() + "\n";
    write_file_atomic(out / "metrics.jsonl", text);
  }
  std::ofstream metrics(out / "metrics.jsonl", std::ios::app);
  SF_REQUIRE(metrics.good(), (out / "metrics.jsonl").string(), ": cannot open for appending");

  say(cat("slideformer: ", arch_name(cfg.arch), " model, ", std::setprecision(4),
          double(cfg.num_parameters()) / 1e6, "M parameters, ", cfg.num_hidden_layers,
          " layers; ", exec->name(), "; ", data.description, "; ", opt.steps, " steps of ",
          opt.grad_accum, " x ", opt.batch_size, " x ", opt.seq_len, " tokens"));
  {  // the plan, without its memory table (`slideformer plan` prints the table)
    std::istringstream lines(
        describe_plan(cfg, planned.plan_request, planned.budget, planned.plan, true));
    for (std::string l; std::getline(lines, l);) say(l);
  }
  if (!saved.is_null())
    say(cat("resuming from ", resume_dir.string(), " at step ", start_step, " (epoch ",
            data.train->epoch(), ")"));

  auto eval = [&]() -> double {
    if (data.eval.empty()) return NAN;
    double loss = 0;
    int64_t n = 0;
    for (const Batch& b : data.eval) {
      loss += exec->eval_loss_sum(b);
      n += b.n_valid_labels();
    }
    return loss / double(std::max<int64_t>(1, n));
  };
  auto curves = [&] {
    LossCurves c;
    for (auto& m : history) {
      double x = json_number(m, "step"), l = json_number(m, "loss"), e = json_number(m, "eval_loss");
      if (!std::isnan(l)) c.train.push_back({x, l});
      if (!std::isnan(e)) c.eval.push_back({x, e});
    }
    std::ostringstream t;
    t << "loss of " << arch_name(cfg.arch) << ", " << std::setprecision(3)
      << double(cfg.num_parameters()) / 1e6 << "m parameters, " << opt.grad_accum * opt.batch_size
      << " x " << opt.seq_len << " tokens per step";
    c.title = t.str();
    return c;
  };
  // What survives a failed write, for error messages.
  auto intact = [&]() -> std::string {
    const fs::path prev = res.checkpoint;
    return prev.empty() ? std::string("no checkpoint was saved yet")
                        : "the previous checkpoint " + prev.string() + " is intact";
  };
  auto record = [&](const json& m) {
    history.push_back(m);
    errno = 0;
    metrics << m.dump() << "\n";
    metrics.flush();
    if (!metrics.good()) {
      const int err = errno;
      progress.finish();
      SF_FAIL(io, (out / "metrics.jsonl").string(), ": write failed (",
              err ? std::strerror(err) : "stream error", "); ", intact(),
              "; free disk space and run again with --resume auto");
    }
  };
  auto plot = [&] {
    try {
      write_loss_plot(out / "loss.png", curves());
    } catch (const Error& e) {
      say(cat("warning: no loss plot: ", e.what()));
    }
  };

  const auto t_start = std::chrono::steady_clock::now();
  auto session_seconds = [&] {
    return seconds_since(t_start);
  };
  int64_t step = start_step;
  int64_t last_saved = start_step;  // a resumed run's start is already on disk

  auto save = [&](const std::string& why) {
    auto t0 = std::chrono::steady_clock::now();
    json state;
    state["format"] = "slideformer-trainer-state";
    state["version"] = kStateVersion;
    state["step"] = step;
    state["optimizer_step"] = exec->params().step;
    state["tokens_seen"] = tokens_seen;
    state["elapsed_seconds"] = elapsed_before + session_seconds();
    state["rng"] = {{"kind", "splitmix64"}, {"seed", opt.seed}, {"state", hex64(rng.state)}};
    state["data"] = {{"identity", data.identity}, {"state", data.train->state()}};
    state["schedule"] = {{"kind", LrSchedule::kind_name(opt.schedule.kind)},
                         {"lr", opt.schedule.lr},
                         {"warmup_steps", opt.schedule.warmup_steps},
                         {"total_steps", opt.schedule.total_steps},
                         {"min_lr_ratio", opt.schedule.min_lr_ratio}};
    state["settings"] = settings_json(opt);
    state["model"] = model_now;
    state["metrics"] = history;
    CheckpointContents c;
    c.config = &cfg;
    c.layout = &layout;
    c.store = &exec->params();  // waits for any update still in flight
    c.trainer_state = std::move(state);
    c.model.dtype = opt.save_dtype.value_or(cfg.torch_dtype);
    c.model.tokenizer_dir = src.tokenizer_dir;
    try {
      res.checkpoint = save_checkpoint(out, step, c, opt.fault);
    } catch (const Error& e) {
      progress.finish();
      SF_FAIL(io, e.what(), "; ", intact(), "; free disk space and run again with --resume auto");
    }
    last_saved = step;
    prune_checkpoints(out, opt.keep_checkpoints, res.checkpoint);
    plot();
    double dt = seconds_since(t0);
    say(cat("saved ", res.checkpoint.string(), " (", why, ", ", format_duration(dt), ")"));
  };

  auto stop = [&] { return opt.stop_requested && opt.stop_requested(); };

  if (start_step == 0 && opt.eval_every > 0 && !data.eval.empty()) {
    double e = eval();
    record({{"step", 0}, {"eval_loss", e}});
    res.eval_steps.push_back(0);
    res.eval_losses.push_back(e);
    say(cat("eval  step 0  loss ", std::fixed, std::setprecision(4), e));
  }

  int64_t session_tokens = 0;
  double step_seconds_total = 0;
  std::vector<Batch> micro(size_t(opt.grad_accum));
  while (step < opt.steps && !stop()) {
    for (auto& b : micro) b = data.train->next(opt.batch_size);
    OptimHyper h = opt.hyper;
    h.lr = opt.schedule.at(step + 1);
    auto ts = std::chrono::steady_clock::now();
    StepStats st = exec->train_step(micro, h);
    const double dt = seconds_since(ts);
    ++step;
    rng.next();
    tokens_seen += st.n_tokens;
    session_tokens += st.n_tokens;
    step_seconds_total += dt;
    res.losses.push_back(st.loss());
    res.end_step = step;
    const double flops = step_model_flops(cfg, micro);

    json m = {{"step", step},
              {"loss", st.loss()},
              {"lr", h.lr},
              {"grad_norm", st.grad_norm},
              {"clip_coef", st.clip_coef},
              {"tokens", st.n_tokens},
              {"tokens_seen", tokens_seen},
              {"epoch", data.train->epoch()},
              {"step_seconds", dt},
              {"tokens_per_second", double(st.n_tokens) / dt},
              {"tflops", flops / dt / 1e12},
              {"elapsed_seconds", elapsed_before + session_seconds()}};
    if (!std::isfinite(st.grad_norm))
      say(cat("warning: step ", step, ": the gradient is not finite, so the weights were left "
              "unchanged; lower --lr or check the data if this repeats"));
    else if (!std::isfinite(st.loss()))
      say(cat("warning: step ", step, ": the loss is not finite; lower --lr or check the data"));
    double eval_loss = NAN;
    if ((opt.eval_every > 0 && step % opt.eval_every == 0) || step == opt.steps) {
      eval_loss = eval();
      if (!std::isnan(eval_loss)) {
        m["eval_loss"] = eval_loss;
        res.eval_steps.push_back(step);
        res.eval_losses.push_back(eval_loss);
      }
    }
    record(m);

    ProgressSnapshot ps;
    ps.step = step;
    ps.total = opt.steps;
    ps.loss = st.loss();
    ps.lr = h.lr;
    ps.grad_norm = st.grad_norm;
    ps.tokens_per_second = double(session_tokens) / step_seconds_total;
    ps.tflops = flops / dt / 1e12;
    ps.device_bytes = exec->device_peak_bytes();
    ps.host_bytes = host_rss_bytes();
    ps.epoch = data.train->epoch();
    const int64_t done = step - start_step, left = opt.steps - step;
    ps.eta_seconds = session_seconds() / double(done) * double(left);  // evals and saves included
    progress.update(ps);
    if (!std::isnan(eval_loss))
      say(cat("eval  step ", step, "  loss ", std::fixed, std::setprecision(4), eval_loss));
    if (opt.fault) opt.fault("step:" + std::to_string(step));

    if (opt.save_every > 0 && step % opt.save_every == 0 && step < opt.steps) save("periodic");
  }
  res.stopped = step < opt.steps;
  if (step > last_saved) save(res.stopped ? "stopped" : "final");
  else if (res.stopped && step == start_step && start_step == 0)
    say("stopped before the first step; nothing was saved");
  plot();
  progress.finish();
  res.tokens_per_second =
      step_seconds_total > 0 ? double(session_tokens) / step_seconds_total : 0;
  if (!res.stopped && step > start_step)
    say(cat("done: ", step - start_step, " steps in ", format_duration(session_seconds()),
            ", ", format_rate(res.tokens_per_second), " tokens/s; model ", res.checkpoint.string(),
            "; metrics ", (out / "metrics.jsonl").string(), "; plot ", (out / "loss.png").string()));
  return res;
}

}  // namespace sf
