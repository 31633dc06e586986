#include "engine/device_resident_executor.h"

#include "engine/clip_decision.h"
#include "engine/device_state.h"
#include "engine/engine_config.h"  // kMlpTileTokens

namespace sf {

DeviceResidentExecutor::DeviceResidentExecutor(Backend& be, const ModelConfig& cfg, int64_t max_tokens,
                         bool keep_activations, int64_t head_chunk_rows,
                         StateFormat state_format)
    : be_(be), model_(be, cfg, max_tokens, head_chunk_rows, keep_activations, kMlpTileTokens), store_(state_units(model_.layout()), state_format),
      name_("resident on " + be.name() + " with device AdamW") {
  for (int u = 0; u < store_.n_units(); ++u) {
    if (!state_format.is_fp32()) {
      state_.push_back(be.alloc(device_state_parts(store_.layout(u)).bytes, cat("optimizer state of unit ", u)));
      continue;
    }
    size_t bytes = size_t(store_.numel(u)) * 4;
    master_.push_back(be.alloc(bytes, cat("fp32 master of unit ", u)));
    m_.push_back(be.alloc(bytes, cat("AdamW m of unit ", u)));
    v_.push_back(be.alloc(bytes, cat("AdamW v of unit ", u)));
  }
  norm_ = be.alloc(4, "gradient norm");
}

UnitStateView DeviceResidentExecutor::device_view(int u) const {
  return device_state_view(state_[size_t(u)]->data(), store_.layout(u), store_.rounding_seed, u);
}

void DeviceResidentExecutor::params_changed() {
  Stream& s = model_.stream();
  if (compact()) {
    std::vector<float> w;
    for (int u = 0; u < store_.n_units(); ++u) {
      copy_state(be_, s, store_.state(u), state_[size_t(u)]->data(), StateCopy::to_device);
      w.assign(size_t(store_.numel(u)), 0.f);  // the compute-dtype weights, from the master
      store_.read_master_f32(u, w.data());
      model_.set_unit_weights(u, w.data());
      s.synchronize();  // w is refilled for the next unit
    }
    s.synchronize();
    host_stale_ = false;
    return;
  }
  for (int u = 0; u < store_.n_units(); ++u) {
    size_t bytes = size_t(store_.numel(u)) * 4;
    be_.copy_to_device(s, master_[size_t(u)]->data(), store_.master(u), bytes);
    be_.copy_to_device(s, m_[size_t(u)]->data(), store_.m(u), bytes);
    be_.copy_to_device(s, v_[size_t(u)]->data(), store_.v(u), bytes);
    Mat src(master_[size_t(u)]->data(), DType::f32, 1, store_.numel(u));
    Mat dst(model_.unit_weights_device(u), be_.compute_dtype(), 1, store_.numel(u));
    be_.cast(s, dst, src);
  }
  s.synchronize();
  host_stale_ = false;
}

ParamStore& DeviceResidentExecutor::params() {
  if (!host_stale_) return store_;
  host_stale_ = false;
  Stream& s = model_.stream();
  for (int u = 0; u < store_.n_units(); ++u) {
    if (compact()) {
      copy_state(be_, s, store_.state(u), state_[size_t(u)]->data(), StateCopy::to_host);
      continue;
    }
    size_t bytes = size_t(store_.numel(u)) * 4;
    be_.copy_to_host(s, store_.master(u), master_[size_t(u)]->data(), bytes);
    be_.copy_to_host(s, store_.m(u), m_[size_t(u)]->data(), bytes);
    be_.copy_to_host(s, store_.v(u), v_[size_t(u)]->data(), bytes);
  }
  s.synchronize();
  return store_;
}

StepStats DeviceResidentExecutor::train_step(std::span<const Batch> micro, const OptimHyper& h) {
  StepStats st = count_step(micro);
  const float grad_scale = mean_loss_scale(st);
  model_.zero_grads();
  for (auto& b : micro) st.loss_sum += model_.forward_backward(b, grad_scale);

  Stream& s = model_.stream();
  be_.fill_zero(s, norm_->data(), 4);
  for (int u = 0; u < store_.n_units(); ++u)
    for (const ParamRange& r : store_.ranges(u))
      be_.sum_squares(s, static_cast<float*>(norm_->data()),
                      Mat(model_.unit_grads_device(u) + r.offset, DType::f32, 1, r.numel));
  float sumsq = 0;
  be_.copy_to_host(s, &sumsq, norm_->data(), 4);
  s.synchronize();
  const ClipDecision d = decide_clip(double(sumsq), h.max_grad_norm);
  d.report(st);
  if (d.skip) return st;  // keep the weights
  AdamWStep a = next_adamw_step(h, store_, d.coef);
  advance_step(store_, a);
  host_stale_ = true;
  const size_t es = dtype_size(be_.compute_dtype());
  if (compact()) {
    for (int u = 0; u < store_.n_units(); ++u)
      be_.adamw_state(s, device_view(u), 0, store_.numel(u), model_.unit_grads_device(u),
                      model_.unit_weights_device(u), store_.ranges(u), a);
    s.synchronize();
    return st;
  }
  for (int u = 0; u < store_.n_units(); ++u)
    for (const ParamRange& r : store_.ranges(u)) {
      a.weight_decay = r.decay ? h.weight_decay : 0.f;
      be_.adamw(s, static_cast<float*>(master_[size_t(u)]->data()) + r.offset,
                static_cast<float*>(m_[size_t(u)]->data()) + r.offset,
                static_cast<float*>(v_[size_t(u)]->data()) + r.offset,
                model_.unit_grads_device(u) + r.offset,
                static_cast<char*>(model_.unit_weights_device(u)) + size_t(r.offset) * es,
                r.numel, a);
    }
  s.synchronize();
  return st;
}

}  // namespace sf
