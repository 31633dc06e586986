#include "engine/resident_executor.h"

#include "core/thread_pool.h"
#include "engine/clip_decision.h"
#include "engine/engine_config.h"  // kMlpTileTokens
#include "optim/adamw.h"
#include "optim/grad_norm.h"
#include "optim/state_adamw.h"

namespace sf {

ResidentExecutor::ResidentExecutor(Backend& be, const ModelConfig& cfg, int64_t max_tokens,
                         bool keep_activations, int64_t head_chunk_rows,
                         StateFormat state_format)
    : be_(be), model_(be, cfg, max_tokens, head_chunk_rows, keep_activations, kMlpTileTokens), store_(state_units(model_.layout()), state_format),
      name_("resident on " + be.name()) {
  for (int u = 0; u < store_.n_units(); ++u) grads_.emplace_back(size_t(store_.numel(u)));
}

void ResidentExecutor::params_changed() {
  if (store_.format().master == MasterFormat::f32) {
    for (int u = 0; u < store_.n_units(); ++u) model_.set_unit_weights(u, store_.master(u));
    return;
  }
  std::vector<float> w;  // a bf16 master, decoded for the f32 model
  for (int u = 0; u < store_.n_units(); ++u) {
    w.assign(size_t(store_.numel(u)), 0.f);
    store_.read_master_f32(u, w.data());
    model_.set_unit_weights(u, w.data());
  }
}

StepStats ResidentExecutor::train_step(std::span<const Batch> micro, const OptimHyper& h) {
  StepStats st = count_step(micro);
  const float grad_scale = mean_loss_scale(st);
  model_.zero_grads();
  for (auto& b : micro) st.loss_sum += model_.forward_backward(b, grad_scale);

  ThreadPool& pool = host_pool();
  double sumsq = 0;
  for (int u = 0; u < store_.n_units(); ++u) {
    model_.get_unit_grads(u, grads_[size_t(u)].data());
    sumsq += sum_squares(grads_[size_t(u)].data(), store_.numel(u), &pool);
  }
  const ClipDecision d = decide_clip(sumsq, h.max_grad_norm);
  d.report(st);
  if (d.skip) return st;  // keep the weights

  const AdamWStep s = next_adamw_step(h, store_, d.coef);
  for (int u = 0; u < store_.n_units(); ++u) {
    if (store_.format().is_fp32())
      adamw_update_ranges(store_.master(u), store_.m(u), store_.v(u), grads_[size_t(u)].data(),
                          nullptr, store_.numel(u), store_.ranges(u), s, &pool);
    else
      adamw_update_state(store_.state(u), 0, store_.numel(u), grads_[size_t(u)].data(), nullptr,
                         store_.ranges(u), s, &pool);
  }
  advance_step(store_, s);
  params_changed();
  return st;
}

}  // namespace sf
