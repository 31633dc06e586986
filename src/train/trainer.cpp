#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <iostream>

#include "core/error.h"
#include "engine/executor_factory.h"
#include "io/model_config.h"
#include "model/model_init.h"
#include "model/model_presets.h"
#include "model/weights_io.h"
#include "train/model_dir.h"
#include "train/token_batcher.h"

namespace sf {

namespace fs = std::filesystem;

namespace {

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
    src.config = load_config(opt.model_dir / "config.json");
    src.weights_dir = opt.model_dir;
    src.tokenizer_dir = opt.model_dir;
    SF_REQUIRE(!opt.tokens_file.empty(),
               "train: --tokens FILE is required with --model (a uint32 token stream)");
    src.tokens = opt.tokens_file;
  }
  return src;
}

std::string fmt_seconds(double s) {
  std::ostringstream os;
  if (s >= 3600) os << int(s / 3600) << "h" << std::setw(2) << std::setfill('0') << int(s / 60) % 60 << "m";
  else if (s >= 60) os << int(s / 60) << "m" << std::setw(2) << std::setfill('0') << int(s) % 60 << "s";
  else os << std::fixed << std::setprecision(1) << s << "s";
  return os.str();
}

}  // namespace

TrainResult run_training(const TrainOptions& opt, std::ostream& log) {
  SF_REQUIRE(opt.steps > 0, "--steps must be positive");
  SF_REQUIRE(opt.batch_size > 0 && opt.grad_accum > 0, "--batch-size and --grad-accum must be positive");
  ModelSource src = resolve_source(opt);
  const ModelConfig& cfg = src.config;
  ModelLayout layout = ModelLayout::build(cfg);

  TokenFile tokens(src.tokens);
  SF_REQUIRE(int64_t(tokens.max_id()) < cfg.vocab_size, src.tokens.string(),
             ": holds token id ", tokens.max_id(), " but the model's vocab_size is ",
             cfg.vocab_size, "; the tokens were made with another tokenizer");
  int64_t n_eval = int64_t(double(tokens.size()) * opt.eval_fraction);
  if (n_eval > 0 && n_eval < opt.seq_len + 1) n_eval = 0;  // too little to evaluate on
  TokenBatcher train_data(tokens, 0, tokens.size() - n_eval, opt.seq_len);

  ExecutorRequest er;
  er.backend = opt.backend;
  er.engine = opt.engine;
  er.gpu_memory = opt.gpu_memory;
  er.host_memory = opt.host_memory;
  er.step.micro_tokens = int64_t(opt.batch_size) * opt.seq_len;
  er.step.grad_accum = opt.grad_accum;
  er.step.max_seq_len = opt.seq_len;
  auto exec = make_executor(cfg, er);
  ParamStore& store = exec->params();
  if (src.weights_dir.empty()) {
    for (int u = 0; u < store.n_units(); ++u)
      init_unit(layout.units[size_t(u)], store.master(u), opt.seed);
  } else {
    load_model_weights(src.weights_dir, cfg, layout, store.master_ptrs());
  }
  exec->params_changed();

  if (!opt.quiet)
    log << "slideformer: " << arch_name(cfg.arch) << " model, "
        << double(cfg.num_parameters()) / 1e6 << "M parameters, " << cfg.num_hidden_layers
        << " layers; " << exec->name() << "; " << tokens.size() - n_eval
        << " training tokens, " << n_eval << " held out; " << opt.steps << " steps of "
        << opt.grad_accum << " x " << opt.batch_size << " x " << opt.seq_len << " tokens\n";

  auto eval = [&]() -> double {
    if (n_eval == 0) return NAN;
    TokenBatcher eval_data(tokens, tokens.size() - n_eval, tokens.size(), opt.seq_len);
    int rows = int(std::min<int64_t>(opt.batch_size, eval_data.rows_per_epoch()));
    double loss = 0;
    int64_t n = 0;
    for (int i = 0; i < opt.eval_batches; ++i) {
      Batch b = eval_data.next(rows);
      loss += exec->eval_loss_sum(b);
      n += b.n_valid_labels();
      if (eval_data.epoch() > 0) break;
    }
    return loss / double(n);
  };

  fs::create_directories(opt.out_dir);
  std::ofstream metrics(opt.out_dir / "metrics.jsonl", std::ios::app);
  TrainResult res;
  auto t0 = std::chrono::steady_clock::now();
  int64_t tokens_done = 0;
  std::vector<Batch> micro(size_t(opt.grad_accum));
  for (int64_t step = 1; step <= opt.steps; ++step) {
    for (auto& b : micro) b = train_data.next(opt.batch_size);
    OptimHyper h = opt.hyper;
    h.lr = opt.schedule.at(step);
    auto ts = std::chrono::steady_clock::now();
    StepStats st = exec->train_step(micro, h);
    double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - ts).count();
    tokens_done += st.n_tokens;
    double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    res.losses.push_back(st.loss());
    double eval_loss = NAN;
    if ((opt.eval_every > 0 && step % opt.eval_every == 0) || step == opt.steps) {
      eval_loss = eval();
      if (!std::isnan(eval_loss)) res.eval_losses.push_back(eval_loss);
    }
    double tps = double(st.n_tokens) / dt;
    metrics << "{\"step\":" << step << ",\"loss\":" << st.loss() << ",\"lr\":" << h.lr
            << ",\"grad_norm\":" << st.grad_norm << ",\"tokens\":" << st.n_tokens
            << ",\"step_seconds\":" << dt << ",\"tokens_per_second\":" << tps
            << ",\"elapsed_seconds\":" << elapsed;
    if (!std::isnan(eval_loss)) metrics << ",\"eval_loss\":" << eval_loss;
    metrics << "}\n";
    metrics.flush();
    if (!opt.quiet) {
      double eta = elapsed / double(step) * double(opt.steps - step);
      log << "step " << step << "/" << opt.steps << "  loss " << std::fixed
          << std::setprecision(4) << st.loss() << "  lr " << std::scientific
          << std::setprecision(2) << h.lr << std::defaultfloat << "  gnorm " << std::fixed
          << std::setprecision(3) << st.grad_norm << "  " << std::setprecision(0) << tps
          << " tok/s  eta " << fmt_seconds(eta);
      if (!std::isnan(eval_loss)) log << "  eval " << std::setprecision(4) << eval_loss;
      log << std::defaultfloat << "\n";
    }
  }
  double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  res.tokens_per_second = double(tokens_done) / total;

  SaveModelOptions so;
  so.dtype = opt.save_dtype;
  so.tokenizer_dir = src.tokenizer_dir;
  std::vector<const float*> w;
  for (int u = 0; u < store.n_units(); ++u) w.push_back(store.master(u));
  fs::path model_out = opt.out_dir / "model";
  save_model_dir(model_out, cfg, layout, w, so);
  if (!opt.quiet) log << "saved " << model_out.string() << "\n";
  return res;
}

}  // namespace sf
