// validate_train_options: every option's value checked before anything is read or written;
// each refusal is Error(input) naming the flag and a value that works.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/bytes.h"
#include "core/error.h"
#include "data/data_source.h"
#include "data/sample_source.h"
#include "text/chat_template.h"
#include "train/train_options.h"

namespace sf {

void validate_train_options(const TrainOptions& o) {
  auto need = [](bool ok, const std::string& msg) {
    if (!ok) throw Error(ErrorKind::input, msg);
  };
  need(o.steps > 0, cat("--steps ", o.steps, " must be positive, e.g. --steps 1000"));
  need(o.batch_size > 0, cat("--batch-size ", o.batch_size, " must be positive, e.g. --batch-size 8"));
  need(o.seq_len > 1, cat("--seq-len ", o.seq_len, " must be at least 2, e.g. --seq-len 1024"));
  need(o.grad_accum > 0, cat("--grad-accum ", o.grad_accum, " must be positive (1: no accumulation)"));
  need(o.gpus >= 1, cat("--gpus ", o.gpus, " must be at least 1"));
  need(o.dist_timeout_s > 0, cat("--dist-timeout ", o.dist_timeout_s, " must be a positive number of seconds"));
  if (o.gpus > 1) {
    const int lower = o.batch_size / o.gpus * o.gpus, upper = lower + o.gpus;
    need(o.batch_size % o.gpus == 0,
         cat("--batch-size ", o.batch_size, " (the global batch) must be divisible by --gpus ", o.gpus,
             ": each rank trains on batch-size / gpus rows; use --batch-size ",
             lower > 0 ? cat(lower, " or ") : std::string(), upper));
  }
  need(std::isfinite(o.schedule.lr) && o.schedule.lr > 0,
       cat("--lr ", o.schedule.lr, " must be a positive number, e.g. --lr 2e-5"));
  need(o.schedule.warmup_steps >= 0,
       cat("--warmup-steps ", o.schedule.warmup_steps, " must be 0 or more"));
  need(std::isfinite(o.epochs) && o.epochs >= 0,
       cat("--epochs ", o.epochs, " must be a positive number of passes, e.g. --epochs 3"));
  const bool both_lengths = o.explicit_options.count("steps") && o.explicit_options.count("epochs");
  need(!both_lengths, cat("--steps ", o.steps, " and --epochs ", o.epochs,
                          " both set the run's length; pass one of them (a config file "
                          "counts as passing it)"));
  need(o.warmup_ratio >= 0 && o.warmup_ratio < 1,
       cat("--warmup-ratio ", o.warmup_ratio, " must be in [0, 1), e.g. 0.03 (3% of the steps)"));
  need(!(o.explicit_options.count("warmup-steps") && o.explicit_options.count("warmup-ratio")),
       cat("--warmup-steps ", o.schedule.warmup_steps, " and --warmup-ratio ", o.warmup_ratio,
           " both set the warmup; pass one of them"));
  // With --epochs the step count is known once the data is open (resolve_step_count).
  if (o.epochs == 0 && o.warmup_ratio == 0)
    need(o.schedule.warmup_steps <= o.steps,
         cat("--warmup-steps ", o.schedule.warmup_steps, " is longer than --steps ", o.steps,
             "; use fewer warmup steps"));
  need(o.schedule.min_lr_ratio >= 0 && o.schedule.min_lr_ratio <= 1,
       cat("--min-lr-ratio ", o.schedule.min_lr_ratio, " must be in [0, 1], e.g. 0.1"));
  need(o.hyper.weight_decay >= 0, cat("--weight-decay ", o.hyper.weight_decay, " must be 0 or more"));
  need(o.hyper.beta1 >= 0 && o.hyper.beta1 < 1, cat("--beta1 ", o.hyper.beta1, " must be in [0, 1), e.g. 0.9"));
  need(o.hyper.beta2 >= 0 && o.hyper.beta2 < 1, cat("--beta2 ", o.hyper.beta2, " must be in [0, 1), e.g. 0.999"));
  need(o.hyper.eps > 0, cat("--adam-eps ", o.hyper.eps, " must be positive, e.g. 1e-8"));
  need(o.hyper.max_grad_norm >= 0,
       cat("--max-grad-norm ", o.hyper.max_grad_norm, " must be 0 (no clipping) or positive"));
  need(o.eval_fraction >= 0 && o.eval_fraction < 1,
       cat("--eval-fraction ", o.eval_fraction, " must be in [0, 1), e.g. 0.05 (0: no evaluation)"));
  need(o.eval_batches > 0, cat("--eval-batches ", o.eval_batches, " must be positive"));
  need(o.eval_every >= 0, cat("--eval-every ", o.eval_every, " must be 0 (only at the end) or positive"));
  need(o.save_every >= 0, cat("--save-every ", o.save_every, " must be 0 (only at the end) or positive"));
  need(o.keep_checkpoints >= 0,
       cat("--keep-checkpoints ", o.keep_checkpoints, " must be 0 (keep all) or positive"));
  need(o.log_every > 0, cat("--log-every ", o.log_every, " must be positive"));
  auto one_of = [](const std::string& v, const std::vector<std::string>& names) {
    return std::find(names.begin(), names.end(), v) != names.end();
  };
  auto list = [](const std::vector<std::string>& names) {
    std::string s;
    for (auto& n : names) s += (s.empty() ? "" : ", ") + n;
    return s;
  };
  (void)parse_data_inputs(o.tokens_file.string());  // weights checked before anything is read
  need(one_of(o.data_format, data_format_names()) || o.data_format == "prompt-completion" ||
           o.data_format == "chat",
       cat("--data-format ", o.data_format, " is not known; use ", list(data_format_names())));
  need(one_of(o.overflow, overflow_names()),
       cat("--overflow ", o.overflow, " is not known; use ", list(overflow_names())));
  if (o.chat_format != "auto") {
    try {
      (void)named_chat_format(o.chat_format);
    } catch (const Error&) {
      need(false, cat("--chat-format ", o.chat_format, " is not known; use auto (the template of "
                      "the model's tokenizer_config.json) or one of ", list(chat_format_names())));
    }
    // A token file holds ids, no conversations: a chat format would be silently unused. (On
    // resume the data comes from the checkpoint; the trainer compares the format there.)
    const std::filesystem::path data =
        o.tokens_file.empty() && o.model_dir.empty() ? "the bundled example's token file"
                                                     : o.tokens_file;
    bool any_dataset = false;
    for (const DataInput& in : parse_data_inputs(o.tokens_file.string()))
      any_dataset |= is_dataset_file(in.path, o.data_format);
    need(!o.resume.empty() || any_dataset,
         cat("--chat-format ", o.chat_format, " does not apply to ", data.string(),
             ": it is token data (ids, no conversations to format); drop --chat-format, or pass "
             "a JSONL file of {\"messages\": [...]} lines with --data"));
  }
  // Sizes are checked here even where they end up unused (--gpu-memory on the host backend).
  if (!o.gpu_memory.empty()) (void)parse_bytes(o.gpu_memory, "--gpu-memory");
  if (!o.host_memory.empty()) (void)parse_bytes(o.host_memory, "--host-memory");
  need(!(o.backend == "host" && !o.gpu_memory.empty() && o.explicit_options.count("backend") &&
         o.explicit_options.count("gpu-memory")),
       cat("--gpu-memory ", o.gpu_memory, " does not apply with --backend host: the host backend "
           "trains in host RAM, whose budget is --host-memory; drop --gpu-memory, or drop "
           "--backend host to train on a GPU"));
  need(!o.out_dir.empty(), "--out must name a directory");
}

int64_t epoch_steps(double epochs, int64_t rows_per_epoch, int batch_size, int grad_accum) {
  const double rows_per_step = double(batch_size) * double(grad_accum);
  return std::max<int64_t>(1, int64_t(std::ceil(epochs * double(rows_per_epoch) / rows_per_step)));
}

void resolve_step_count(TrainOptions& o, int64_t rows_per_epoch) {
  if (o.epochs > 0) o.steps = epoch_steps(o.epochs, rows_per_epoch, o.batch_size, o.grad_accum);
  o.schedule.total_steps = o.steps;
  // transformers' TrainingArguments.get_warmup_steps: ceil(ratio x steps).
  if (o.warmup_ratio > 0)
    o.schedule.warmup_steps = int64_t(std::ceil(o.warmup_ratio * double(o.steps)));
  SF_REQUIRE(o.schedule.warmup_steps <= o.steps, "--warmup-steps ", o.schedule.warmup_steps,
             " is longer than the run's ", o.steps, " steps",
             o.epochs > 0 ? cat(" (--epochs ", o.epochs, ")") : std::string(),
             "; use fewer warmup steps or --warmup-ratio");
}

}  // namespace sf
