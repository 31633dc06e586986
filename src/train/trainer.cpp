// Trainer (see trainer.h): the training loop as member functions, in the order a run calls
// them: the start (constructor), set-up, the steps, checkpoints and the end. Owns the run's
// counters; checkpoint bookkeeping is the Checkpointer's, metrics.jsonl and loss.png the
// MetricsLog's, the recorded settings run_settings.h's.
#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>
#include <utility>

#include "core/dtype.h"
#include "core/error.h"
#include "core/stopwatch.h"
#include "engine/window_buffers.h"
#include "model/model_init.h"
#include "model/model_presets.h"
#include "model/weights_io.h"
#include "train/store_weights.h"
#include "train/run_settings.h"

namespace sf {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

ProgressDisplay::Mode display_mode(TrainOptions::Progress p) {
  switch (p) {
    case TrainOptions::Progress::bar: return ProgressDisplay::Mode::bar;
    case TrainOptions::Progress::lines: return ProgressDisplay::Mode::lines;
    case TrainOptions::Progress::quiet: break;
  }
  return ProgressDisplay::Mode::quiet;
}

// Checks the options and creates the output directory, so that it can be locked.
fs::path prepared_out_dir(const TrainOptions& opt) {
  validate_train_options(opt);
  fs::create_directories(opt.out_dir);
  return opt.out_dir;
}

ExecutorRequest executor_request(const TrainOptions& opt) {
  ExecutorRequest er;
  er.backend = opt.backend;
  er.engine = opt.engine;
  er.device_adamw_layers = opt.device_adamw_layers;
  er.checkpoint_every = opt.checkpoint_every;
  er.gpu_memory = opt.gpu_memory;
  er.host_memory = opt.host_memory;
  er.optimizer_dir = opt.optimizer_dir;
  er.deterministic = opt.deterministic;
  er.step.micro_tokens = int64_t(opt.batch_size) * opt.seq_len;
  er.step.grad_accum = opt.grad_accum;
  er.step.max_seq_len = opt.seq_len;
  er.step.clipping = opt.hyper.max_grad_norm > 0;
  er.step.state_format = opt.state_format;
  return er;
}

std::string plot_title(const ModelConfig& cfg, const TrainOptions& opt) {
  std::ostringstream t;
  t << "loss of " << arch_name(cfg.arch) << ", " << std::setprecision(3)
    << double(cfg.num_parameters()) / 1e6 << "m parameters, " << opt.grad_accum * opt.batch_size
    << " x " << opt.seq_len << " tokens per step";
  return t.str();
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Training rows in the stream's first pass. A stream reports its progress as rows drawn /
// rows in the pass (TrainStream::epoch_fraction), so one row drawn from the start gives the
// count; the stream is put back where it was.
int64_t rows_per_epoch(TrainStream& train) {
  const json start = train.state();
  (void)train.next(1);
  const double f = train.epoch() > 0 ? 1.0 : train.epoch_fraction();
  train.restore(start);
  SF_CHECK(f > 0, "a training stream reported no progress after one row");
  return std::max<int64_t>(1, std::llround(1.0 / f));
}

// b's sequences, in order, in batches of at most max_tokens tokens (a longer sequence alone).
std::vector<Batch> split_sequences(const Batch& b, int64_t max_tokens) {
  std::vector<Batch> out;
  for (int s = 0; s < b.n_seqs(); ++s) {
    const int32_t s0 = b.cu_seqlens[size_t(s)], s1 = b.cu_seqlens[size_t(s) + 1];
    if (out.empty() || out.back().n_tokens() + (s1 - s0) > max_tokens) {
      out.emplace_back();
      out.back().cu_seqlens.push_back(0);
    }
    Batch& cur = out.back();
    cur.tokens.insert(cur.tokens.end(), b.tokens.begin() + s0, b.tokens.begin() + s1);
    cur.labels.insert(cur.labels.end(), b.labels.begin() + s0, b.labels.begin() + s1);
    cur.positions.insert(cur.positions.end(), b.positions.begin() + s0, b.positions.begin() + s1);
    cur.cu_seqlens.push_back(int32_t(cur.tokens.size()));
  }
  return out;
}

// The executor keeps its training state in the format asked for (an engine that cannot would
// otherwise train in another one, silently).
void check_state_format(StateFormat got, StateFormat asked, const char* engine) {
  SF_REQUIRE(got == asked, "--optimizer-state ", moment_format_name(asked.moments),
             " --master-weights ", master_format_name(asked.master), ": the engine (", engine,
             ") does not keep its training state in this format yet (it holds optimizer-state ",
             moment_format_name(got.moments), ", master-weights ", master_format_name(got.master),
             "); use --optimizer-state fp32 --master-weights fp32");
}

}  // namespace

DataRequest data_request(const TrainOptions& opt, const ModelSource& src) {
  DataRequest dr;
  dr.path = src.tokens;
  dr.seq_len = opt.seq_len;
  dr.eval_fraction = opt.eval_fraction;
  dr.eval_batches = opt.eval_batches;
  dr.eval_rows = opt.batch_size;
  dr.vocab_size = src.config.vocab_size;
  dr.seed = opt.seed;
  dr.shuffle = opt.shuffle;
  dr.tokenizer_dir = src.tokenizer_dir;
  dr.format = opt.data_format;
  dr.chat_format = opt.chat_format;
  dr.chat_date = opt.chat_date;
  dr.overflow = opt.overflow;
  dr.skip_bad_lines = opt.skip_bad_lines;
  dr.eval_file = opt.eval_file;
  return dr;
}

ModelSource resolve_model_source(const TrainOptions& opt) {
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

TrainResult run_training(const TrainOptions& opt, std::ostream& log) {
  Trainer trainer(opt, log);
  return trainer.run();
}

// ---- start and set-up -----------------------------------------------------------------

Trainer::Trainer(const TrainOptions& requested, std::ostream& log)
    : out_(prepared_out_dir(requested)),
      progress_(log, display_mode(requested.progress), requested.log_every, requested.columns) {
  if (requested.rank() == 0) {  // the other ranks of a data-parallel run write nothing here
    lock_.emplace(out_);
    remove_checkpoint_temporaries(out_);
  }
  resolve_start(requested);
}

// The checkpoint to resume from, or a fresh start; then the options in force.
void Trainer::resolve_start(const TrainOptions& requested) {
  fs::path resume_dir;
  if (!requested.resume.empty()) {
    std::string note;
    resume_dir = resolve_resume(requested.resume, out_, &note);
    if (!note.empty()) say(note);
    if (resume_dir.empty())
      say(cat("no checkpoint in ", out_.string(), " to resume from; starting a new run"));
  }
  opt_ = requested;
  if (resume_dir.empty()) {
    // A fresh run never mixes its checkpoints with an earlier run's: refused here, or (with
    // overwrite) deleted once the model and data have loaded.
    earlier_ = earlier_run_checkpoints(out_, requested.overwrite);
  } else {
    resume_ = ResumePoint::read(resume_dir);
    std::vector<std::string> notes;
    json changes;
    opt_ = settings_for_resume(requested, resume_->settings(), resume_dir, notes, changes);
    opt_.comm = requested.comm;  // this run's ranks, whatever the checkpoint's were
    opt_.run_id = requested.run_id;
    opt_.device_reduce_scatter = requested.device_reduce_scatter;
    opt_.gpus = requested.gpus;
    validate_train_options(opt_);
    for (auto& n : notes) say(n);
    schedule_changes_ = resume_->schedule_changes();
    if (!changes.empty())
      schedule_changes_.push_back({{"step", resume_->step()}, {"changes", changes}});
  }
  // With --epochs the length is known once the data is open (open_data).
  if (opt_.epochs == 0) resolve_step_count(opt_, 0);
  const int64_t start_step = resume_ ? resume_->step() : 0;
  result_.start_step = result_.end_step = start_step;
  result_.checkpoint = resume_dir;  // until this run saves one
  step_ = start_step;
  // A resumed run's start is already on disk.
  checkpointer_ = Checkpointer(out_, opt_.keep_checkpoints, opt_.fault, resume_dir, start_step);
}

bool Trainer::already_done() {
  result_.total_steps = opt_.steps;
  if (result_.start_step < opt_.steps) return false;
  say(cat("the checkpoint ", result_.checkpoint.string(), " is at step ", result_.start_step,
          ", which already reaches the run's ", opt_.steps, " steps",
          opt_.epochs > 0 ? cat(" (--epochs ", opt_.epochs, ")") : std::string(),
          "; nothing to do (pass a larger --steps or --epochs to train further)"));
  return true;
}

// Data parallel: an error of this rank stops the others at once (their waits and collectives
// throw naming it) instead of after --dist-timeout.
TrainResult Trainer::run() {
  if (!opt_.comm) return run_steps();
  try {
    return run_steps();
  } catch (const std::exception& e) {
    const std::string why = cat("rank ", opt_.rank(), ": ", e.what());
    if (dp_.counters) dp_.counters->fail(opt_.rank(), why);
    opt_.comm->abort(why);
    throw;
  }
}

TrainResult Trainer::run_steps() {
  // The length is known before set-up unless it comes from --epochs and the data's size.
  if (opt_.epochs == 0 && already_done()) return result_;
  set_up();
  if (already_done()) return result_;
  evaluate_at_start();
  while (step_ < opt_.steps && !stop_requested()) one_step();
  return finish();
}

void Trainer::set_up() {
  load_model();
  open_data();
  build_executor();
  restore_run_position();
  open_logs();
  announce();
  session_start_ = std::chrono::steady_clock::now();
  micro_.resize(size_t(opt_.grad_accum));
}

void Trainer::load_model() {
  src_ = resolve_model_source(opt_);
  check_sequence_length(cfg(), opt_.seq_len, src_.weights_dir.empty()
                                                 ? std::string("the bundled example")
                                                 : (src_.weights_dir / "config.json").string());
  layout_ = ModelLayout::build(cfg());
  model_record_ = model_json(cfg(), layout_);
  if (resume_) {
    std::string why = model_mismatch(resume_->model(), model_record_);
    SF_REQUIRE(why.empty(), "cannot resume from ", resume_->dir().string(), ": ", why,
               "; resume with the model the checkpoint was trained from, or start a new run "
               "with another --out");
  }
}

void Trainer::open_data() {
  data_ = open_data_source(data_request(opt_, src_));
  // The date a Llama 3.2+ template rendered (today's, unless given): recorded in the settings so
  // that a resume, on another day, renders the same conversations.
  if (opt_.chat_date.empty() && data_.identity.contains("chat_date"))
    opt_.chat_date = data_.identity.at("chat_date").get<std::string>();
  if (opt_.epochs > 0) {
    rows_per_epoch_ = rows_per_epoch(*data_.train);
    resolve_step_count(opt_, rows_per_epoch_);
  }
  if (resume_) {
    std::string why = data_identity_mismatch(resume_->data_identity(), data_.identity);
    SF_REQUIRE(why.empty(), "cannot resume from ", resume_->dir().string(), " on ",
               src_.tokens.string(), ": ", why,
               "; resume with the data and data settings the checkpoint was trained on (--data / "
               "--tokens, --data-format, --chat-format, --chat-date, --overflow, "
               "--skip-bad-lines, --eval-file), or start a new run with another --out");
    data_.train->restore(resume_->data_state());
  }
}

// The executor, with the checkpoint's weights and moments, the model's, or a random init.
// Data parallel: the shared state first (collective), each rank's executor over its share;
// rank 0 alone writes the state, and params_changed() (collective) lets the others see it.
void Trainer::build_executor() {
  ExecutorRequest er = executor_request(opt_);
  if (opt_.comm) {
    shared_state_ = std::make_unique<SharedTrainingState>(*opt_.comm, opt_.run_id, state_units(layout_),
                                                          opt_.state_format);
    dp_ = shared_state_->data_parallel();
    dp_.device_reduce_scatter = opt_.device_reduce_scatter;
    er.data_parallel = &dp_;
    er.step.micro_tokens = int64_t(opt_.batch_size / opt_.world()) * opt_.seq_len;
  }
  planned_ = plan_run(cfg(), er);
  // The ranks' one copy of the streamed homes, sized by the plan (collective). A plan that
  // does not fit is refused by make_executor, whose error stops the other ranks.
  if (opt_.comm && planned_.plan.fits && planned_.plan.mode == Plan::Mode::sliding) {
    shared_state_->map_homes(shared_bytes(window_buffer_specs(cfg(), planned_.plan.engine, planned_.compute_dtype)));
    dp_.homes = shared_state_->data_parallel().homes;
  }
  exec_ = make_executor(cfg(), er, planned_);
  ParamStore& store = exec_->params();
  check_state_format(store.format(), opt_.state_format, exec_->name());
  if (resume_) {
    if (primary()) load_resume_tensors(resume_->dir(), layout_, store);  // converts a changed format
    store.step = resume_->optimizer_step();
    store.rounding_seed = resume_->rounding_seed();
  } else {
    store.rounding_seed = state_rounding_seed(opt_.seed);
    if (primary() && src_.weights_dir.empty()) init_store_weights(layout_, store, opt_.seed);
    else if (primary()) load_store_weights(src_.weights_dir, cfg(), layout_, store);
  }
  exec_->params_changed();
}

void Trainer::restore_run_position() {
  rng_ = TrainerRng{opt_.seed};
  if (!resume_) return;
  rng_.state = resume_->rng_state();
  elapsed_before_ = resume_->elapsed_seconds();
  tokens_seen_ = resume_->tokens_seen();
}

// A fresh run deletes an earlier run's checkpoints (--overwrite) and plot; metrics.jsonl then
// holds exactly the history the run starts from.
void Trainer::open_logs() {
  if (!primary()) return;
  std::vector<json> history;  // metrics records so far (one per step, plus evaluations)
  if (resume_) {
    history = resume_->metrics();
  } else {
    for (auto& c : earlier_) fs::remove_all(c.dir);
    if (!earlier_.empty())
      say(cat("removed ", earlier_.size(), " checkpoint(s) of an earlier run in ", out_.string()));
    std::error_code ec;
    for (const char* f : {"latest", "loss.png"}) fs::remove(out_ / f, ec);
  }
  // Event files of earlier sessions may hold steps past the checkpoint: with the log off they
  // go too, rather than show a history the run went back on.
  std::error_code ec;
  if (opt_.tensorboard == TensorBoardLog::off) fs::remove_all(out_ / "tensorboard", ec);
  metrics_ = MetricsLog(out_, std::move(history), plot_title(cfg(), opt_), opt_.tensorboard);
}

void Trainer::announce() {
  say(cat("slideformer: ", arch_name(cfg().arch), " model, ", std::setprecision(4),
          double(cfg().num_parameters()) / 1e6, "M parameters, ", cfg().num_hidden_layers,
          " layers; ", exec_->name(), "; ", data_.description, "; ", opt_.steps, " steps of ",
          opt_.grad_accum, " x ", opt_.batch_size, " x ", opt_.seq_len, " tokens"));
  say(cat("backend    ", planned_.backend == BackendKind::cuda ? "cuda" : "host", " (",
          planned_.backend_reason, ")"));
  if (!planned_.note.empty()) say(planned_.note);
  {  // the plan, without its memory table (`slideformer plan` prints the table)
    std::istringstream lines(
        describe_plan(cfg(), planned_.plan_request, planned_.budget, planned_.plan, true));
    for (std::string l; std::getline(lines, l);) say(l);
  }
  announce_schedule();
  if (resume_)
    say(cat("resuming from ", resume_->dir().string(), " at step ", result_.start_step,
            " (epoch ", data_.train->epoch(), ")"));
}

// The lr line of the header (peak, schedule, warmup, where the length came from), and a
// warning for a peak rate that full fine-tuning of a pretrained model rarely survives.
void Trainer::announce_schedule() {
  const LrSchedule& s = opt_.schedule;
  std::ostringstream l;
  l << "lr         " << std::setprecision(3) << s.lr << " peak, " << LrSchedule::kind_name(s.kind);
  if (s.kind != LrSchedule::Kind::constant && s.min_lr_ratio > 0)
    l << " to " << s.min_lr_ratio << " x peak";
  l << ", warmup " << s.warmup_steps << (s.warmup_steps == 1 ? " step" : " steps");
  if (opt_.warmup_ratio > 0) l << " (--warmup-ratio " << opt_.warmup_ratio << ")";
  l << "; " << opt_.steps << " steps";
  if (opt_.epochs > 0)
    l << " (--epochs " << opt_.epochs << ": " << rows_per_epoch_ << " training rows per pass, "
      << opt_.grad_accum * opt_.batch_size << " per step)";
  if (!opt_.explicit_options.count("lr"))
    l << (src_.weights_dir.empty() ? " (the bundled example's --lr)"
                                   : " (the default --lr for full fine-tuning)");
  say(l.str());
  if (!src_.weights_dir.empty() && s.lr > kSuspiciousFullFineTuneLr)
    say(cat("warning: --lr ", s.lr, " is high for full fine-tuning of a pretrained model "
            "(usual: 1e-5 to 5e-5; above ", kSuspiciousFullFineTuneLr, " the weights often "
            "diverge); the run stops if the loss stops being finite or the gradient vanishes"));
}

// ---- the loop -------------------------------------------------------------------------

// Several ranks: any rank's request stops all of them after the same step (collective).
bool Trainer::stop_requested() const {
  const bool mine = opt_.stop_requested && opt_.stop_requested();
  if (!opt_.comm) return mine;
  return sum_over_ranks(*opt_.comm, mine ? 1.0 : 0.0) > 0;
}

// Rows rank, rank + N, ... of the next global batch of batch_size rows (every rank draws all
// of them, so the streams stay at the same position, the one-rank run's).
Batch Trainer::next_rows() {
  if (!opt_.comm) return data_.train->next(opt_.batch_size);
  Batch mine;
  mine.cu_seqlens.push_back(0);
  for (int row = 0; row < opt_.batch_size; ++row) {
    const Batch b = data_.train->next(1);
    if (row % opt_.world() != opt_.rank()) continue;
    const int32_t base = int32_t(mine.tokens.size());
    mine.tokens.insert(mine.tokens.end(), b.tokens.begin(), b.tokens.end());
    mine.labels.insert(mine.labels.end(), b.labels.begin(), b.labels.end());
    mine.positions.insert(mine.positions.end(), b.positions.begin(), b.positions.end());
    for (size_t s = 1; s < b.cu_seqlens.size(); ++s) mine.cu_seqlens.push_back(base + b.cu_seqlens[s]);
  }
  return mine;
}

double Trainer::session_seconds() const { return seconds_since(session_start_); }

void Trainer::evaluate_at_start() {
  if (!primary() || result_.start_step != 0 || opt_.eval_every <= 0 || data_.eval.empty()) return;
  double e = evaluate();
  record({{"step", 0}, {"eval_loss", e}, {"wall_time", unix_seconds()}});
  result_.eval_steps.push_back(0);
  result_.eval_losses.push_back(e);
  say(cat("eval  step 0  loss ", std::fixed, std::setprecision(4), e));
}

void Trainer::one_step() {
  const StepReport r = train_step();
  json m = step_record(r);
  if (const std::string why = divergence(r); !why.empty()) {
    record(m);  // metrics.jsonl shows the step that stopped the run
    progress_.finish();
    SF_FAIL(input, why);
  }
  warn_if_not_finite(r);
  const double eval_loss = evaluate_if_due(m);
  record(m);
  show_progress(r);
  if (!std::isnan(eval_loss))
    say(cat("eval  step ", step_, "  loss ", std::fixed, std::setprecision(4), eval_loss));
  if (opt_.fault) opt_.fault("step:" + std::to_string(step_));
  if (opt_.fault && opt_.comm) opt_.fault(cat("rank", opt_.rank(), ":step:", step_));  // one rank's fault
  if (primary() && opt_.save_every > 0 && step_ % opt_.save_every == 0 && step_ < opt_.steps)
    save(SaveReason::periodic);
}

// Draws the micro-batches, runs the optimizer step and advances the run's counters.
Trainer::StepReport Trainer::train_step() {
  for (auto& b : micro_) b = next_rows();
  OptimHyper h = opt_.hyper;
  h.lr = opt_.schedule.at(step_ + 1);
  StepReport r;
  r.lr = h.lr;
  auto ts = std::chrono::steady_clock::now();
  r.stats = exec_->train_step(micro_, h);
  r.seconds = seconds_since(ts);
  ++step_;
  rng_.next();
  tokens_seen_ += r.stats.n_tokens;
  session_tokens_ += r.stats.n_tokens;
  session_step_seconds_ += r.seconds;
  result_.losses.push_back(r.stats.loss());
  result_.end_step = step_;
  r.flops = step_model_flops(cfg(), micro_) * opt_.world();  // the global batch's (shares alike)
  return r;
}

// The step's line of metrics.jsonl (evaluate_if_due may add its eval_loss).
json Trainer::step_record(const StepReport& r) const {
  const StepStats& st = r.stats;
  const double dt = r.seconds;
  const size_t rss = host_rss_bytes();  // one /proc read for both of its columns
  constexpr double kGiB = double(size_t(1) << 30);
  return {{"step", step_},
          {"loss", st.loss()},
          {"lr", r.lr},
          {"grad_norm", st.grad_norm},
          {"clip_coef", st.clip_coef},
          {"tokens", st.n_tokens},
          {"tokens_seen", tokens_seen_},
          {"epoch", data_.train->epoch()},
          {"step_seconds", dt},
          {"tokens_per_second", double(st.n_tokens) / dt},
          {"tflops", r.flops / dt / 1e12},
          {"peak_device_bytes", exec_->device_peak_bytes()},
          {"host_rss_bytes", rss},
          {"elapsed_seconds", elapsed_before_ + session_seconds()},
          {"wall_time", unix_seconds()},
          {"rss_gib", double(rss) / kGiB},
          {"gpu_gib", double(exec_->device_bytes_in_use()) / kGiB}};
}

// Why the run cannot go on after step `r` ("" when it can): a non-finite loss, or a gradient
// norm of exactly 0 over labelled tokens, which a model only reaches once it has collapsed (a
// far too high lr saturates every unit; the loss then sits at ln(vocab)). Nothing is saved, so
// the newest checkpoint is the last one written before the failure.
std::string Trainer::divergence(const StepReport& r) const {
  const double loss = r.stats.loss();
  std::string what;
  if (!std::isfinite(loss))
    what = cat("the loss is ", loss);
  else if (r.stats.grad_norm == 0 && r.stats.n_valid > 0)
    what = cat("the gradient norm is exactly 0 (loss ", std::setprecision(5), loss,
               "; ln(vocab) = ", std::log(double(cfg().vocab_size)), ")");
  else
    return "";
  return cat("step ", step_, ": ", what, " at lr ", std::setprecision(3), r.lr,
             ": the model has diverged, most likely from a learning rate too high for it; "
             "stopped without saving (", checkpointer_.what_survives(),
             "); start again with a lower --lr (full fine-tuning: 1e-5 to 5e-5) or check the "
             "data");
}

void Trainer::warn_if_not_finite(const StepReport& r) {
  if (!std::isfinite(r.stats.grad_norm))
    say(cat("warning: step ", step_, ": the gradient is not finite, so the weights were left "
            "unchanged; lower --lr or check the data if this repeats"));
}

// Evaluates every eval_every steps and at the last; the loss (NaN: none) goes into `record`
// and the result. Returns it.
double Trainer::evaluate_if_due(json& record) {
  if (!primary()) return NAN;
  if (!((opt_.eval_every > 0 && step_ % opt_.eval_every == 0) || step_ == opt_.steps))
    return NAN;
  const double eval_loss = evaluate();
  if (!std::isnan(eval_loss)) {
    record["eval_loss"] = eval_loss;
    result_.eval_steps.push_back(step_);
    result_.eval_losses.push_back(eval_loss);
  }
  return eval_loss;
}

// Mean loss over the held-out batches; NaN without evaluation data.
double Trainer::evaluate() {
  if (data_.eval.empty()) return NAN;
  double loss = 0;
  int64_t n = 0;
  // Several ranks: the executor is planned for one rank's share, so rank 0 evaluates each
  // batch in pieces of that size (whole sequences; the sum is the same sequences' losses).
  const int64_t piece = int64_t(opt_.batch_size / opt_.world()) * opt_.seq_len;
  for (const Batch& b : data_.eval) {
    for (const Batch& part : opt_.comm ? split_sequences(b, piece) : std::vector<Batch>{b})
      loss += exec_->eval_loss_sum(part);
    n += b.n_valid_labels();
  }
  return loss / double(std::max<int64_t>(1, n));
}

void Trainer::show_progress(const StepReport& r) {
  ProgressSnapshot ps;
  ps.step = step_;
  ps.total = opt_.steps;
  ps.loss = r.stats.loss();
  ps.lr = r.lr;
  ps.grad_norm = r.stats.grad_norm;
  ps.tokens_per_second = double(session_tokens_) / session_step_seconds_;
  ps.tflops = r.flops / r.seconds / 1e12;
  ps.device_bytes = exec_->device_peak_bytes();
  ps.host_bytes = host_rss_bytes();
  ps.epoch = data_.train->epoch();
  const int64_t done = step_ - result_.start_step, left = opt_.steps - step_;
  ps.eta_seconds = session_seconds() / double(done) * double(left);  // evals and saves included
  progress_.update(ps);
}

// ---- logs, checkpoints and the end ----------------------------------------------------

void Trainer::record(const json& m) {
  if (!primary()) return;
  try {
    metrics_.append(m);
  } catch (const Error& e) {
    fail_io(e.what());
  }
}

void Trainer::fail_io(const std::string& what) {
  progress_.finish();
  SF_FAIL(io, what, "; ", checkpointer_.what_survives(),
          "; free disk space and run again with --resume auto");
}

// trainer_state.json and the tensors of a checkpoint at the current step.
CheckpointContents Trainer::checkpoint_contents() {
  const ParamStore& store = exec_->params();  // waits for any update still in flight
  const RunPosition at{.step = step_,
                       .optimizer_step = store.step,
                       .tokens_seen = tokens_seen_,
                       .elapsed_seconds = elapsed_before_ + session_seconds(),
                       .rng_state = rng_.state,
                       .state_format = store.format(),
                       .rounding_seed = store.rounding_seed};
  CheckpointContents c;
  c.config = &cfg();
  c.layout = &layout_;
  c.trainer_state = trainer_state_json(at, opt_, data_.identity, data_.train->state(),
                                       model_record_, schedule_changes_, metrics_.history());
  c.store = &store;
  c.model.dtype = opt_.save_dtype.value_or(cfg().torch_dtype);
  c.model.tokenizer_dir = src_.tokenizer_dir;
  return c;
}

void Trainer::save(SaveReason why) {
  auto t0 = std::chrono::steady_clock::now();
  const CheckpointContents c = checkpoint_contents();
  try {
    checkpointer_.write(step_, c);
  } catch (const Error& e) {
    fail_io(e.what());
  }
  result_.checkpoint = checkpointer_.newest();
  checkpointer_.rotate();
  refresh_plot();
  const char* reason = why == SaveReason::periodic  ? "periodic"
                       : why == SaveReason::stopped ? "stopped"
                                                    : "final";
  double dt = seconds_since(t0);
  say(cat("saved ", result_.checkpoint.string(), " (", reason, ", ", format_duration(dt), ")"));
}

void Trainer::refresh_plot() {
  if (!primary()) return;
  if (auto problem = metrics_.refresh_plot()) say(cat("warning: no loss plot: ", *problem));
}

TrainResult Trainer::finish() {
  result_.stopped = step_ < opt_.steps;
  if (!primary()) {  // rank 0 saves; this rank's update is in before its params() returns
    progress_.finish();
    return result_;
  }
  if (!checkpointer_.on_disk(step_))
    save(result_.stopped ? SaveReason::stopped : SaveReason::final);
  else if (result_.stopped && step_ == result_.start_step && result_.start_step == 0)
    say("stopped before the first step; nothing was saved");
  refresh_plot();
  progress_.finish();
  result_.tokens_per_second =
      session_step_seconds_ > 0 ? double(session_tokens_) / session_step_seconds_ : 0;
  if (!result_.stopped && step_ > result_.start_step)
    say(cat("done: ", step_ - result_.start_step, " steps in ", format_duration(session_seconds()),
            ", ", format_rate(result_.tokens_per_second), " tokens/s; model ",
            result_.checkpoint.string(), "; metrics ", metrics_.file().string(), "; plot ",
            metrics_.plot_file().string()));
  if (const std::string costs = exec_->one_off_costs(); !costs.empty() && step_ > result_.start_step)
    say(cat("one-off: ", costs));
  return result_;
}

}  // namespace sf
