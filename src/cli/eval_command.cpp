// slideformer eval: the mean next-token loss (and perplexity) of a model directory on data,
// through the same engine as training (so it doubles as a numerics check against other
// frameworks). --data reads whatever `train --data` reads, through the same DataRequest path,
// and evaluates every row of the whole file (no held-out split: the file is the evaluation
// set), each file on its own; --tokens evaluates the first --batches rows of a token file.
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/error.h"
#include "data/data_file_kind.h"
#include "data/data_source.h"
#include "data/token_file_source.h"
#include "engine/executor_factory.h"
#include "io/model_config.h"
#include "model/weights_io.h"
#include "train/store_weights.h"
#include "text/chat_template.h"

namespace sf::cli {

namespace {

struct EvalOpts : RunFlags {
  std::string model, tokens;
  std::vector<std::string> data;
  std::string data_format = "auto", chat_format = "auto", chat_date, overflow = "auto";
  bool skip_bad_lines = false;
  int batches = 0;  // 0: --data: the whole file; --tokens: 1 (as before --data existed)
};

struct LossSum {
  double loss = 0;
  int64_t tokens = 0;  // labels that count
};

void print_loss(const LossSum& s, const std::string& what, const StepExecutor& exec) {
  SF_REQUIRE(s.tokens > 0, what, ": no token with loss to evaluate");
  const double mean = s.loss / double(s.tokens);
  std::cout << std::setprecision(9) << "loss " << mean << " over " << s.tokens << " tokens ("
            << exec.name() << "), perplexity " << std::setprecision(6) << std::exp(mean)
            << ": " << what << "\n";
}

LossSum eval_batch(StepExecutor& exec, const Batch& b, const ModelConfig& cfg) {
  b.validate(cfg.vocab_size);
  return {exec.eval_loss_sum(b), b.n_valid_labels()};
}

// --tokens: a token file only (a dataset is pointed to --data), the first --batches batches.
LossSum eval_token_file(const EvalOpts& o, StepExecutor& exec, const ModelConfig& cfg) {
  SF_REQUIRE(std::filesystem::exists(o.tokens), o.tokens, ": token file not found (--tokens)");
  SF_REQUIRE(classify_data_file(o.tokens, "auto") == DataFileKind::tokens, o.tokens, ": this is ",
             describe_file_content(o.tokens), ", not a token file; --tokens takes token ids "
             "(llm.c .bin or raw uint32): pass a dataset with --data ", o.tokens);
  TokenFile tf(o.tokens);
  TokenBatcher data(tf, 0, tf.size(), o.seq_len);
  LossSum s;
  for (int i = 0; i < std::max(1, o.batches); ++i) {
    LossSum b = eval_batch(exec, data.next(o.batch_size), cfg);
    s.loss += b.loss, s.tokens += b.tokens;
  }
  return s;
}

// One --data file whole, in file order.
LossSum eval_data_file(const EvalOpts& o, const std::filesystem::path& file, StepExecutor& exec,
                       const ModelConfig& cfg) {
  DataRequest r;
  r.path = file;
  r.seq_len = o.seq_len;
  r.eval_fraction = 0;  // the whole file is evaluated
  r.vocab_size = cfg.vocab_size;
  r.tokenizer_dir = o.model;
  r.format = o.data_format;
  r.chat_format = o.chat_format;
  r.chat_date = o.chat_date;
  r.overflow = o.overflow;
  r.skip_bad_lines = o.skip_bad_lines;
  DataSource ds = open_data_source(r);
  std::cout << "data       " << ds.description << "\n";
  LossSum s;
  for (int i = 0; o.batches == 0 || i < o.batches; ++i) {
    const int64_t left = ds.train->rows_left_in_epoch();
    if (left <= 0) break;
    LossSum b = eval_batch(exec, ds.train->next(int(std::min<int64_t>(o.batch_size, left))), cfg);
    s.loss += b.loss, s.tokens += b.tokens;
  }
  return s;
}

// The dataset flags' values, checked before the model is loaded (none silently unused).
void check_data_flags(const EvalOpts& o) {
  auto known = [](const std::string& v, const std::vector<std::string>& names) {
    return std::find(names.begin(), names.end(), v) != names.end();
  };
  SF_REQUIRE(known(o.data_format, data_format_names()), "--data-format ", o.data_format,
             " is not known; use one of those `slideformer train --help` lists");
  SF_REQUIRE(known(o.overflow, overflow_names()), "--overflow ", o.overflow,
             " is not known; use auto, truncate, split or drop");
  if (o.chat_format != "auto") (void)named_chat_format(o.chat_format);
  const bool given = o.data_format != "auto" || o.chat_format != "auto" || !o.chat_date.empty() ||
                     o.overflow != "auto" || o.skip_bad_lines;
  SF_REQUIRE(!given || o.tokens.empty(), "--data-format, --chat-format, --chat-date, --overflow "
             "and --skip-bad-lines apply to --data datasets, not to --tokens ", o.tokens,
             "; drop them or pass the file with --data");
}

void run_eval(EvalOpts& o) {
  SF_REQUIRE(o.data.empty() != o.tokens.empty(),
             o.data.empty() ? "eval needs data: pass --data FILE (any file train --data reads) "
                              "or --tokens FILE (a token file)"
                            : "--data and --tokens are two ways to name the data; pass one");
  check_data_flags(o);
  SF_REQUIRE(o.batches >= 0, "--batches ", o.batches, " must be 0 (the whole --data file) or positive");
  std::filesystem::path dir(o.model);
  ModelConfig cfg = load_config(dir / "config.json");
  check_sequence_length(cfg, o.seq_len, (dir / "config.json").string());
  ModelLayout layout = ModelLayout::build(cfg);
  o.resolve();
  const PlannedRun planned = plan_run(cfg, o.req);
  std::cout << backend_lines(planned);
  auto exec = make_executor(cfg, o.req, planned);
  load_store_weights(dir, cfg, layout, exec->params());
  exec->params_changed();
  if (!o.tokens.empty()) return print_loss(eval_token_file(o, *exec, cfg), o.tokens, *exec);
  LossSum total;
  for (const DataInput& in : parse_data_inputs(join_data_values(o.data))) {
    SF_REQUIRE(in.weight == 0, "eval --data ", in.path.string(), ":", in.weight,
               ": eval takes no mixing weights (each file is evaluated on its own)");
    LossSum s = eval_data_file(o, in.path, *exec, cfg);
    print_loss(s, in.path.string(), *exec);
    total.loss += s.loss, total.tokens += s.tokens;
  }
  if (o.data.size() > 1) print_loss(total, "all files", *exec);
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto o = std::make_shared<EvalOpts>();
  auto* cmd = app.add_subcommand("eval", "mean loss and perplexity of a model on data");
  cmd->add_option("--model", o->model, "Hugging Face model directory")->required();
  cmd->add_option("--data", o->data,
                  "evaluation data, repeatable: anything train --data reads (datasets are "
                  "tokenized with the model's tokenizer); each file is evaluated whole");
  cmd->add_option("--tokens", o->tokens, "a token file (llm.c .bin or raw uint32)");
  cmd->add_option("--data-format", o->data_format, "as for train");
  cmd->add_option("--chat-format", o->chat_format, "as for train");
  cmd->add_option("--chat-date", o->chat_date, "as for train");
  cmd->add_option("--overflow", o->overflow, "as for train");
  cmd->add_flag("--skip-bad-lines", o->skip_bad_lines, "as for train");
  o->batch_size = 4;
  o->seq_len = 256;
  o->add_to(cmd, false);
  cmd->add_option("--batches", o->batches,
                  "batches to evaluate (0: --data: every row of each file; --tokens: 1)");
  cmd->callback([o] { run_eval(*o); });
}

}  // namespace sf::cli
