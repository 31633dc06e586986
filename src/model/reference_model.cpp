#include "model/reference_model.h"

#include <algorithm>

#include "core/error.h"

namespace sf {

size_t ReferenceModel::scratch_bytes(const ModelConfig& cfg, int64_t max_tokens, DType cd,
                                     int64_t head_chunk_rows, bool keep,
                                     int64_t mlp_tile_tokens) {
  const int64_t rows = std::min(head_chunk_rows, max_tokens);
  const size_t layer = layer_acts_bytes(cfg, max_tokens, cd, mlp_tile_tokens);
  const size_t head = head_acts_bytes(cfg, max_tokens, cd, rows);
  if (!keep) return std::max(layer, head);
  return head + size_t(cfg.num_hidden_layers) * layer;
}

ReferenceModel::ReferenceModel(Backend& be, const ModelConfig& cfg, int64_t max_tokens,
                               int64_t head_chunk_rows, bool keep_activations,
                               int64_t mlp_tile_tokens)
    : be_(be),
      s_(be.default_stream()),
      cfg_(cfg),
      layout_(ModelLayout::build(cfg)),
      max_tokens_(max_tokens),
      head_chunk_rows_(std::min(head_chunk_rows, max_tokens)),
      mlp_tile_tokens_(mlp_tile_tokens),
      cd_(be.compute_dtype()),
      keep_(keep_activations) {
  SF_REQUIRE(max_tokens > 0, "ReferenceModel needs max_tokens > 0");
  SF_REQUIRE(head_chunk_rows > 0, "ReferenceModel needs head_chunk_rows > 0");
  SF_REQUIRE(mlp_tile_tokens >= 0, "ReferenceModel: mlp_tile_tokens is ", mlp_tile_tokens,
             "; pass a positive token count, or 0 for an untiled MLP");
  for (size_t u = 0; u < layout_.units.size(); ++u) {
    size_t n = size_t(layout_.units[u].numel);
    weights_.push_back(be.alloc(n * dtype_size(cd_), cat("weights of unit ", u)));
    grads_.push_back(be.alloc(n * 4, cat("gradients of unit ", u)));
    // Padding between slots is never read by ops, but keep buffers deterministic.
    be.fill_zero(s_, weights_.back()->data(), n * dtype_size(cd_));
  }
  const size_t xbytes = size_t(max_tokens) * size_t(cfg.hidden_size) * dtype_size(cd_);
  xs_ = be.alloc(xbytes * size_t(layout_.n_layers + 1), "layer inputs");
  dx_ = be.alloc(xbytes, "activation gradient");
  if (keep_) {
    scratch_ = be.alloc(head_acts_bytes(cfg, max_tokens, cd_, head_chunk_rows_), "head scratch");
    for (int l = 0; l < layout_.n_layers; ++l)
      layer_scratch_.push_back(be.alloc(layer_acts_bytes(cfg, max_tokens, cd_, mlp_tile_tokens_),
                                        cat("kept activations of layer ", l)));
  } else {
    scratch_ = be.alloc(std::max(layer_acts_bytes(cfg, max_tokens, cd_, mlp_tile_tokens_),
                                 head_acts_bytes(cfg, max_tokens, cd_, head_chunk_rows_)),
                        "layer and head scratch");
  }
  loss_ = be.alloc(4, "loss");
  batch_ = std::make_unique<DeviceBatch>(be, s_, cfg, max_tokens);
  zero_grads();
  s_.synchronize();
}

ReferenceModel::~ReferenceModel() = default;

void ReferenceModel::check_unit(int unit) const {
  SF_CHECK(unit >= 0 && unit < n_units(), "unit ", unit, " out of range [0, ", n_units(), ")");
}

void ReferenceModel::set_unit_weights(int unit, const float* fp32) {
  check_unit(unit);
  const size_t n = size_t(layout_.units[size_t(unit)].numel);
  if (cd_ == DType::f32) {
    be_.copy_to_device(s_, weights_[size_t(unit)]->data(), fp32, n * 4);
  } else {
    std::vector<char> tmp(n * dtype_size(cd_));
    convert_from_f32(fp32, tmp.data(), cd_, n);
    be_.copy_to_device(s_, weights_[size_t(unit)]->data(), tmp.data(), tmp.size());
  }
  s_.synchronize();  // the sources are host memory owned by the caller / this frame
}

void ReferenceModel::get_unit_weights(int unit, float* out) {
  check_unit(unit);
  const size_t n = size_t(layout_.units[size_t(unit)].numel);
  std::vector<char> tmp(n * dtype_size(cd_));
  be_.copy_to_host(s_, tmp.data(), weights_[size_t(unit)]->data(), tmp.size());
  s_.synchronize();
  convert_to_f32(tmp.data(), cd_, out, n);
}

void ReferenceModel::get_unit_grads(int unit, float* out) {
  check_unit(unit);
  const size_t n = size_t(layout_.units[size_t(unit)].numel);
  be_.copy_to_host(s_, out, grads_[size_t(unit)]->data(), n * 4);
  s_.synchronize();
}

void ReferenceModel::zero_grads() {
  for (auto& g : grads_) be_.fill_zero(s_, g->data(), g->bytes());
}

LayerWeights ReferenceModel::layer_weights(int layer) const {
  return bind_layer(layout_.layer(layer), weights_[size_t(1 + layer)]->data(), cd_);
}
LayerGrads ReferenceModel::layer_grads(int layer) const {
  return bind_layer(layout_.layer(layer), grads_[size_t(1 + layer)]->data(), DType::f32);
}
EmbeddingWeights ReferenceModel::embedding_weights() const {
  return bind_embedding(layout_.embedding(), weights_.front()->data(), cd_);
}
EmbeddingGrads ReferenceModel::embedding_grads() const {
  return bind_embedding(layout_.embedding(), grads_.front()->data(), DType::f32);
}
HeadWeights ReferenceModel::head_weights() const {
  return bind_head(layout_.head(), weights_.back()->data(), cd_,
                   layout_.tied ? embedding_weights().table : Mat{});
}
HeadGrads ReferenceModel::head_grads() const {
  return bind_head(layout_.head(), grads_.back()->data(), DType::f32,
                   layout_.tied ? embedding_grads().table : Mat{});
}

Mat ReferenceModel::x_at(int i, int64_t T) const {
  const size_t stride = size_t(max_tokens_) * size_t(cfg_.hidden_size) * dtype_size(cd_);
  return Mat(static_cast<char*>(xs_->data()) + size_t(i) * stride, cd_, T, cfg_.hidden_size);
}

LayerActs ReferenceModel::layer_acts(int layer, int64_t T) const {
  const Buffer& b = keep_ ? *layer_scratch_[size_t(layer)] : *scratch_;
  return bind_layer_acts(cfg_, T, cd_, b.data(), b.bytes(), mlp_tile_tokens_);
}

const BatchInputs& ReferenceModel::run_forward(const Batch& b) {
  const BatchInputs& in = batch_->upload(s_, b);
  const int64_t T = in.n_tokens;
  embedding_forward(be_, s_, embedding_weights(), in, x_at(0, T));
  for (int l = 0; l < layout_.n_layers; ++l)
    layer_forward(be_, s_, cfg_, layer_weights(l), layer_acts(l, T), in, x_at(l, T), x_at(l + 1, T));
  be_.fill_zero(s_, loss_->data(), 4);
  return in;
}

double ReferenceModel::read_loss() {
  float loss = 0;
  be_.copy_to_host(s_, &loss, loss_->data(), 4);
  s_.synchronize();
  return double(loss);
}

double ReferenceModel::forward(const Batch& b) {
  const BatchInputs& in = run_forward(b);
  const int64_t T = in.n_tokens;
  HeadActs h = bind_head_acts(cfg_, T, cd_, head_chunk_rows_, scratch_->data(), scratch_->bytes());
  head_forward_backward(be_, s_, cfg_, head_weights(), HeadGrads{}, h, in, x_at(layout_.n_layers, T),
                        Mat{}, static_cast<float*>(loss_->data()), 1.f);
  return read_loss();
}

double ReferenceModel::forward_backward(const Batch& b, float grad_scale) {
  const BatchInputs& in = run_forward(b);
  const int64_t T = in.n_tokens;
  const int L = layout_.n_layers;
  Mat dx(dx_->data(), cd_, T, cfg_.hidden_size);
  {
    HeadActs h = bind_head_acts(cfg_, T, cd_, head_chunk_rows_, scratch_->data(),
                                scratch_->bytes());
    head_forward_backward(be_, s_, cfg_, head_weights(), head_grads(), h, in, x_at(L, T), dx,
                          static_cast<float*>(loss_->data()), grad_scale);
  }
  // With kept activations each layer's scratch still holds its forward (the head has its
  // own): no recompute, the same bits.
  for (int l = L - 1; l >= 0; --l)
    layer_backward(be_, s_, cfg_, layer_weights(l), layer_grads(l), layer_acts(l, T), in,
                   x_at(l, T), dx, dx, !keep_);
  embedding_backward(be_, s_, embedding_grads(), in, dx);
  return read_loss();
}

}  // namespace sf
