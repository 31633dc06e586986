// slideformer eval: the mean next-token loss of a model directory on a token file, through
// the same engine as training (so it doubles as a numerics check against other frameworks).
#include <iomanip>
#include <iostream>

#include "cli/commands.h"
#include "cli/common.h"
#include "data/token_file_source.h"
#include "engine/executor_factory.h"
#include "io/model_config.h"
#include "model/weights_io.h"

namespace sf::cli {

void add_eval_command(CLI::App& app) {
  struct Opts : RunFlags {
    std::string model, tokens;
    int batches = 1;
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("eval", "mean loss of a model on a token file");
  cmd->add_option("--model", o->model, "Hugging Face model directory")->required();
  cmd->add_option("--tokens", o->tokens, "uint32 token ids (llm.c .bin or raw)")->required();
  o->batch_size = 4;
  o->seq_len = 256;
  o->add_to(cmd, false);
  cmd->add_option("--batches", o->batches, "batches from the start of the file");
  cmd->callback([o] {
    std::filesystem::path dir(o->model);
    ModelConfig cfg = load_config(dir / "config.json");
    check_sequence_length(cfg, o->seq_len, (dir / "config.json").string());
    ModelLayout layout = ModelLayout::build(cfg);
    o->resolve();
    auto exec = make_executor(cfg, o->req);
    load_model_weights(dir, cfg, layout, exec->params().master_ptrs());
    exec->params_changed();
    TokenFile tf(o->tokens);
    TokenBatcher data(tf, 0, tf.size(), o->seq_len);
    double loss = 0;
    int64_t n = 0;
    for (int i = 0; i < o->batches; ++i) {
      Batch b = data.next(o->batch_size);
      b.validate(cfg.vocab_size);
      loss += exec->eval_loss_sum(b);
      n += b.n_valid_labels();
    }
    std::cout << std::setprecision(9) << "loss " << loss / double(n) << " over " << n
              << " tokens (" << exec->name() << ")\n";
  });
}

}  // namespace sf::cli
