// slideformer bench: full-parameter training steps of a named model shape with random
// weights on a repeated random batch — throughput, model TFLOP/s, memory, and a loss that
// must fall. The engine benchmark of docs/BENCHMARKS.md. Memory is sampled after every step
// (one /proc read and the backend's counters) and summed up against the plan in a "memory:"
// line; --memory-log writes the samples as CSV (report/memory_sampler.h).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <random>

#include "cli/commands.h"
#include "cli/common.h"
#include "core/stopwatch.h"
#include "core/thread_pool.h"
#include "engine/executor_factory.h"
#include "model/model_init.h"
#include "model/model_presets.h"
#include "report/memory_sampler.h"
#include "train/store_weights.h"

namespace sf::cli {

namespace {
double peak_rss_gib() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return double(ru.ru_maxrss) / (1024.0 * 1024.0);  // ru_maxrss is in KiB
}
}  // namespace

void add_bench_command(CLI::App& app) {
  struct Opts : RunFlags {
    std::string size = "llama3-8b";
    int layers = 0;  // 0: the preset's
    int steps = 10;
    double lr = 1e-4;
    float max_grad_norm = 1.0f;
    bool grads_stream = true;
    bool kept_attention = true;
    std::string memory_log;  // empty: no CSV
  };
  auto o = std::make_shared<Opts>();
  auto* cmd = app.add_subcommand("bench", "time training steps of a model shape (random weights)");
  cmd->add_option("--size", o->size, "named model shape");
  cmd->add_option("--layers", o->layers, "cut the model to this many layers");
  o->add_to(cmd);
  o->add_state_format_to(cmd);
  o->add_deterministic_to(cmd);
  o->add_checkpoint_every_to(cmd);
  cmd->add_option("--steps", o->steps, "steps to time (the first is warm-up)");
  cmd->add_option("--lr,--learning-rate", o->lr, "learning rate");
  cmd->add_option("--max-grad-norm", o->max_grad_norm, "global-norm clipping (0: off)");
  cmd->add_flag("--grads-stream,!--no-grads-stream", o->grads_stream,
                "sliding window: the gradients' casts and norms on their own stream (the "
                "default; --no-grads-stream puts them on the compute stream, for an A/B)");
  cmd->add_flag("--kept-attention,!--no-kept-attention", o->kept_attention,
                "sliding window: the planner may keep the layers' attention output for the "
                "backward where it fits and is faster (the default; --no-kept-attention plans "
                "without it, recomputing the attention, for an A/B)");
  cmd->add_option("--memory-log", o->memory_log,
                  "write per-step memory samples (RSS, GPU bytes, the plan's) to this CSV file");
  cmd->callback([o, cmd] {
    SF_REQUIRE(cmd->count("--memory-log") == 0 || !o->memory_log.empty(),
               "--memory-log: the file name is empty; give the CSV file to write");
    ModelConfig cfg = model_preset(o->size);
    if (o->layers > 0) cfg.num_hidden_layers = o->layers;
    ModelLayout layout = ModelLayout::build(cfg);
    o->resolve();
    o->req.step.clipping = o->max_grad_norm > 0;
    o->req.step.kept_attention = o->kept_attention;  // planned without it: the plan says so
    PlannedRun pr = plan_run(cfg, o->req);
    pr.plan.engine.grads_stream = o->grads_stream;
    std::cout << backend_lines(pr) << describe_plan(cfg, pr.plan_request, pr.budget, pr.plan)
              << std::flush;
    // Before the engine exists: the baseline its memory is measured from.
    MemorySampler mem({pr.plan.host_bytes, pr.plan.device_bytes, pr.budget.unified}, o->memory_log);
    auto t0 = std::chrono::steady_clock::now();
    auto exec = make_executor(cfg, o->req, pr);  // the plan printed above, not a second one
    ParamStore& store = exec->params();
    const StateFormat asked = o->req.step.state_format;
    SF_REQUIRE(store.format() == asked, "--optimizer-state ", moment_format_name(asked.moments),
               " --master-weights ", master_format_name(asked.master), ": the engine (", exec->name(),
               ") does not keep its training state in this format yet; use fp32 for both");
    init_store_weights(layout, store, 1);
    exec->params_changed();
    double setup = seconds_since(t0);
    std::cout << "setup " << std::fixed << std::setprecision(1) << setup << " s (" << exec->name()
              << ")\n";

    std::mt19937_64 g(7);
    std::vector<Batch> micro;
    for (int m = 0; m < o->grad_accum; ++m) {
      std::vector<std::vector<int32_t>> rows(static_cast<size_t>(o->batch_size));
      for (auto& r : rows)
        for (int i = 0; i < o->seq_len; ++i) r.push_back(int32_t(g() % uint64_t(cfg.vocab_size)));
      micro.push_back(Batch::from_rows(rows));
    }
    OptimHyper h;
    h.lr = o->lr;
    h.max_grad_norm = o->max_grad_norm;
    double tokens = 0, seconds = 0, busy = 0;
    // Steady: the steps after an unclipped one. A clipped step's AdamW can only start once the
    // norm is known, so it delays the NEXT step's forward; a fine-tuning run past its first
    // steps is mostly steady, the bench's repeated batch starts with several clipped steps.
    double steady_tokens = 0, steady_seconds = 0;
    int steady_steps = 0;
    // The plan's prediction of the timed steps as they ran (each after a clipped step or not),
    // so that a bench whose steps clip compares its rate with the clipped prediction.
    double predicted_seconds = 0;
    int after_clipped = 0;
    bool prev_clipped = true;  // (step 1 pays the warm-up and is never counted)
    for (int s = 1; s <= o->steps; ++s) {
      auto ts = std::chrono::steady_clock::now();
      StepStats st = exec->train_step(micro, h);
      double dt = seconds_since(ts);
      mem.sample(s, exec->device_bytes_in_use(), exec->device_used_bytes());  // outside dt
      if (s > 1) {
        tokens += double(st.n_tokens);
        seconds += dt;
        busy += st.gpu_busy_seconds;
        predicted_seconds += pr.plan.step_seconds_after(prev_clipped);
        after_clipped += prev_clipped;
        if (!prev_clipped) {
          steady_tokens += double(st.n_tokens);
          steady_seconds += dt;
          ++steady_steps;
        }
      }
      prev_clipped = !(st.clip_coef >= 1.0);
      std::cout << "step " << s << "  loss " << std::setprecision(4) << st.loss() << "  gnorm "
                << st.grad_norm << "  " << std::setprecision(3) << dt << " s  "
                << std::setprecision(0) << double(st.n_tokens) / dt << " tok/s  "
                << std::setprecision(1) << pr.plan.model_flops_per_step / dt / 1e12
                << " TFLOP/s";
      if (st.forward_seconds > 0) {
        std::cout << std::setprecision(3) << "  [fwd " << st.forward_seconds << " s, bwd "
                  << st.backward_seconds << " s, waited for updates " << st.update_wait_seconds
                  << " s, previous update " << st.update_seconds << " s, GPU busy "
                  << st.gpu_busy_seconds << " s, idle fwd " << st.gpu_idle_forward_seconds
                  << " bwd " << st.gpu_idle_backward_seconds << " before "
                  << st.gpu_idle_before_seconds << " s";
        if (st.spec_units_left >= 0)
          std::cout << ", speculation busy " << st.spec_busy_seconds << " s, "
                    << st.spec_units_left << " units left for after the backward";
        if (st.finish_seconds > 0)
          std::cout << ", finishing " << st.finish_seconds << " s";
        std::cout << "]";
      }
      std::cout << "\n" << std::flush;
    }
    exec->params();  // waits for the last update
    double tps = seconds > 0 ? tokens / seconds : 0;
    std::cout << std::setprecision(0) << "RESULT size=" << o->size << " layers="
              << cfg.num_hidden_layers << " batch=" << o->batch_size << "x" << o->seq_len
              << " accum=" << o->grad_accum << " tokens/s=" << tps << " steady_tokens/s="
              << (steady_seconds > 0 ? steady_tokens / steady_seconds : 0) << " (" << steady_steps
              << " steps) model_TFLOP/s="
              << std::setprecision(1)
              << (seconds > 0 ? pr.plan.model_flops_per_step * (o->steps - 1) / seconds / 1e12 : 0)
              << " peak_gpu_GiB=" << std::setprecision(2)
              << double(exec->device_peak_bytes()) / double(1 << 30)
              << " peak_rss_GiB=" << peak_rss_gib() << " gpu_busy=" << std::setprecision(0)
              << (busy > 0 && seconds > 0 ? 100 * busy / seconds : 0) << "% predicted_tokens/s="
              << std::setprecision(0) << (predicted_seconds > 0 ? tokens / predicted_seconds : 0)
              << " (" << after_clipped << " of " << std::max(0, o->steps - 1)
              << " after a clipped step) predicted_steady_tokens/s=" << pr.plan.tokens_per_second
              << " engine=" << exec->name()
              << (o->grads_stream ? "" : " (no grads stream)")
              << (o->kept_attention ? "" : " (no kept attention)") << "\n";
    if (const std::string costs = exec->one_off_costs(); !costs.empty())
      std::cout << "one-off: " << costs << "\n";
    // Growth after step 10: the first steps still fault in pages and fill allocator pools.
    std::cout << mem.summary_line(exec->device_peak_bytes(), 10) << "\n";
  });
}

}  // namespace sf::cli
