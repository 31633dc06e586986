// Decoder (generate/decoder.h): the layer forward of model/recipes.cpp with the attention
// over the KV cache instead of over the chunk alone, and the head reduced to the last token.
#include "generate/decoder.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace sf {

namespace {

size_t max_layer_numel(const ModelLayout& layout) {
  int64_t n = 0;
  for (int l = 0; l < layout.n_layers; ++l) n = std::max(n, layout.layer(l).numel);
  return size_t(n);
}

size_t weight_bytes(const ModelLayout& layout, const DecoderOptions& opt, DType cd) {
  const size_t e = dtype_size(cd);
  if (opt.placement == WeightPlacement::placement_resident)
    return size_t(layout.total_numel()) * e;
  return (size_t(layout.embedding().numel) + size_t(layout.head().numel) +
          2 * max_layer_numel(layout)) * e;
}

size_t cache_bytes(const ModelConfig& c, int64_t max_context, DType cd) {
  return size_t(c.num_hidden_layers) * 2 * size_t(max_context) * size_t(c.kv_dim()) *
         dtype_size(cd);
}

// Device inputs of one chunk: tokens [chunk] | positions [chunk] | cu_seqlens [2] (int32) |
// inv_freq [D/2] (f32).
size_t inv_freq_offset(int64_t chunk) { return size_t(chunk) * 8 + 8; }
size_t input_bytes(const ModelConfig& c, int64_t chunk) {
  return inv_freq_offset(chunk) + size_t(c.head_dim / 2) * 4;
}

void convert_unit(const float* fp32, void* dst, DType cd, size_t n) {
  if (cd == DType::f32) std::memcpy(dst, fp32, n * 4);
  else convert_from_f32(fp32, dst, cd, n);
}

}  // namespace

struct Decoder::Streaming {
  std::vector<std::unique_ptr<Buffer>> host_layers;  // compute dtype, copyable asynchronously
  std::unique_ptr<Buffer> slots[2];
  std::unique_ptr<Stream> copy;
  std::unique_ptr<Event> loaded[2], freed[2];
  bool freed_recorded[2] = {false, false};

  // Copies layer l into its slot once the compute stream is done with the slot's last layer.
  void prefetch(Backend& be, int l) {
    const int slot = l & 1;
    if (freed_recorded[slot]) freed[slot]->wait(*copy);
    be.copy_to_device(*copy, slots[slot]->data(), host_layers[size_t(l)]->data(),
                      host_layers[size_t(l)]->bytes());
    loaded[slot]->record(*copy);
  }
};

size_t Decoder::device_bytes(const ModelConfig& cfg, const DecoderOptions& opt, DType cd) {
  const ModelLayout layout = ModelLayout::build(cfg);
  const size_t e = dtype_size(cd);
  const size_t chunk = size_t(opt.chunk_tokens), C = size_t(cfg.hidden_size);
  return weight_bytes(layout, opt, cd) + cache_bytes(cfg, opt.max_context, cd) +
         layer_acts_bytes(cfg, opt.chunk_tokens, cd) + chunk * C * e + C * e +
         size_t(cfg.vocab_size) * 4 + input_bytes(cfg, opt.chunk_tokens);
}

Decoder::Decoder(Backend& be, const ModelConfig& cfg, const DecoderOptions& opt)
    : be_(be), s_(be.default_stream()), cfg_(cfg), layout_(ModelLayout::build(cfg)), opt_(opt),
      cd_(be.compute_dtype()) {
  SF_REQUIRE(opt.max_context > 0 && opt.chunk_tokens > 0, "Decoder needs max_context > 0 and "
             "chunk_tokens > 0, got ", opt.max_context, " and ", opt.chunk_tokens);
  check_sequence_length(cfg, opt.max_context, "the model's config.json", "--max-context");
  opt_.chunk_tokens = std::min(opt.chunk_tokens, opt.max_context);
  const size_t e = dtype_size(cd_);
  auto unit_buffer = [&](int u) {
    return be.alloc(size_t(layout_.units[size_t(u)].numel) * e, cat("weights of unit ", u));
  };
  if (opt.placement == WeightPlacement::placement_resident) {
    for (int u = 0; u < n_units(); ++u) units_.push_back(unit_buffer(u));
  } else {
    units_.push_back(unit_buffer(0));
    units_.push_back(unit_buffer(n_units() - 1));
    stream_ = std::make_unique<Streaming>();
    for (int l = 0; l < layout_.n_layers; ++l)
      stream_->host_layers.push_back(be.alloc_host(size_t(layout_.layer(l).numel) * e,
                                                   cat("host copy of layer ", l)));
    for (int i = 0; i < 2; ++i) {
      stream_->slots[i] = be.alloc(max_layer_numel(layout_) * e, cat("layer slot ", i));
      stream_->loaded[i] = be.create_event();
      stream_->freed[i] = be.create_event();
    }
    stream_->copy = be.create_stream("layer copies");
  }
  const int64_t chunk = opt_.chunk_tokens, C = cfg.hidden_size;
  cache_ = be.alloc(cache_bytes(cfg, opt.max_context, cd_), "KV cache");
  scratch_ = be.alloc(layer_acts_bytes(cfg, chunk, cd_), "layer scratch");
  x_ = be.alloc(size_t(chunk * C) * e, "hidden state");
  head_xn_ = be.alloc(size_t(C) * e, "normed last token");
  logits_dev_ = be.alloc(size_t(cfg.vocab_size) * 4, "logits");
  logits_host_ = be.alloc_host(size_t(cfg.vocab_size) * 4, "logits (host)");
  inputs_dev_ = be.alloc(input_bytes(cfg, chunk), "decoder inputs");
  inputs_host_ = be.alloc_host(input_bytes(cfg, chunk), "decoder inputs (host)");
  for (auto& u : units_) be.fill_zero(s_, u->data(), u->bytes());
  const std::vector<float> inv_freq = rope_inv_freq(cfg);
  char* host = static_cast<char*>(inputs_host_->data());
  const size_t off = inv_freq_offset(chunk);
  std::memcpy(host + off, inv_freq.data(), inv_freq.size() * 4);
  be.copy_to_device(s_, static_cast<char*>(inputs_dev_->data()) + off, host + off,
                    inv_freq.size() * 4);
  s_.synchronize();
}

Decoder::~Decoder() = default;

void Decoder::set_unit_weights(int unit, const float* fp32) {
  SF_CHECK(unit >= 0 && unit < n_units(), "unit ", unit, " out of range [0, ", n_units(), ")");
  const size_t n = size_t(layout_.units[size_t(unit)].numel);
  const bool layer = unit >= 1 && unit <= layout_.n_layers;
  if (stream_ && layer) {  // streamed layers live in host memory
    convert_unit(fp32, stream_->host_layers[size_t(unit - 1)]->data(), cd_, n);
    return;
  }
  const size_t slot = stream_ ? (unit == 0 ? 0 : 1) : size_t(unit);
  std::vector<char> tmp(n * dtype_size(cd_));
  convert_unit(fp32, tmp.data(), cd_, n);
  be_.copy_to_device(s_, units_[slot]->data(), tmp.data(), tmp.size());
  s_.synchronize();  // tmp is this frame's
}

LayerWeights Decoder::layer_weights(int layer) {
  void* base = stream_ ? stream_->slots[layer & 1]->data() : units_[size_t(1 + layer)]->data();
  return bind_layer(layout_.layer(layer), base, cd_);
}

HeadWeights Decoder::head_weights() const {
  const Mat table = bind_embedding(layout_.embedding(), units_.front()->data(), cd_).table;
  return bind_head(layout_.head(), units_.back()->data(), cd_, layout_.tied ? table : Mat{});
}

Mat Decoder::cache_rows(int layer, int kv) const {
  const size_t rows = size_t(opt_.max_context), cols = size_t(cfg_.kv_dim());
  char* base = static_cast<char*>(cache_->data()) +
               (size_t(layer) * 2 + size_t(kv)) * rows * cols * dtype_size(cd_);
  return Mat(base, cd_, int64_t(rows), int64_t(cols));
}

void Decoder::truncate(int64_t n) {
  SF_CHECK(n >= 0 && n <= cached_, "Decoder::truncate(", n, ") with ", cached_, " cached");
  cached_ = n;
}

std::span<const float> Decoder::append(std::span<const int32_t> tokens) {
  SF_REQUIRE(!tokens.empty(), "Decoder::append: no tokens");
  SF_REQUIRE(cached_ + int64_t(tokens.size()) <= opt_.max_context, "the sequence reaches ",
             cached_ + int64_t(tokens.size()), " tokens, more than the context of ",
             opt_.max_context, " this run holds; raise --max-context (the model allows ",
             cfg_.max_position_embeddings, ") or shorten the prompt");
  for (int32_t t : tokens)
    SF_REQUIRE(t >= 0 && t < cfg_.vocab_size, "token id ", t, " is outside the model's "
               "vocabulary [0, ", cfg_.vocab_size, "): the tokenizer does not match the model");
  for (size_t i = 0; i < tokens.size(); i += size_t(opt_.chunk_tokens))
    run_chunk(tokens.subspan(i, std::min(tokens.size() - i, size_t(opt_.chunk_tokens))));
  const size_t V = size_t(cfg_.vocab_size);
  be_.copy_to_host(s_, logits_host_->data(), logits_dev_->data(), V * 4);
  s_.synchronize();
  return {static_cast<const float*>(logits_host_->data()), V};
}

void Decoder::run_chunk(std::span<const int32_t> tokens) {
  const int64_t T = int64_t(tokens.size()), chunk = opt_.chunk_tokens;
  s_.synchronize();  // the staging buffer may still feed the previous chunk's copy
  int32_t* host = static_cast<int32_t*>(inputs_host_->data());
  for (int64_t i = 0; i < T; ++i) {
    host[i] = tokens[size_t(i)];
    host[chunk + i] = int32_t(cached_ + i);
  }
  host[2 * chunk] = 0;
  host[2 * chunk + 1] = int32_t(T);
  int32_t* dev = static_cast<int32_t*>(inputs_dev_->data());
  be_.copy_to_device(s_, dev, host, size_t(T) * 4);
  be_.copy_to_device(s_, dev + chunk, host + chunk, size_t(T) * 4);
  be_.copy_to_device(s_, dev + 2 * chunk, host + 2 * chunk, 8);
  BatchInputs in;
  in.n_tokens = T;
  in.tokens = dev;
  in.positions = dev + chunk;
  in.cu_seqlens = dev + 2 * chunk;
  in.inv_freq = reinterpret_cast<const float*>(static_cast<char*>(inputs_dev_->data()) +
                                               inv_freq_offset(chunk));
  in.attn = attention_shape(cfg_, 1, int(T));
  const Mat x(x_->data(), cd_, T, cfg_.hidden_size);
  const int L = layout_.n_layers;
  if (stream_) for (int l = 0; l < std::min(L, 2); ++l) stream_->prefetch(be_, l);
  embedding_forward(be_, s_, bind_embedding(layout_.embedding(), units_.front()->data(), cd_),
                    in, x);
  for (int l = 0; l < L; ++l) {
    if (stream_) stream_->loaded[l & 1]->wait(s_);
    run_layer(l, layer_weights(l), in, x);
    if (!stream_) continue;
    stream_->freed[l & 1]->record(s_);
    stream_->freed_recorded[l & 1] = true;
    if (l + 2 < L) stream_->prefetch(be_, l + 2);
  }
  cached_ += T;
  logits_of_last(x);
}

// model/recipes.cpp's layer_forward_body + down projection, with the new keys / values written
// into the cache at their positions and the attention reading the cache.
void Decoder::run_layer(int layer, const LayerWeights& w, const BatchInputs& in, Mat x) {
  const float eps = float(cfg_.rms_norm_eps);
  const int64_t T = in.n_tokens, Q = cfg_.q_dim(), KV = cfg_.kv_dim(), F = cfg_.intermediate_size;
  const int H = int(cfg_.num_attention_heads), KVH = int(cfg_.num_key_value_heads);
  const int D = int(cfg_.head_dim);
  const LayerActs a = bind_layer_acts(cfg_, T, cd_, scratch_->data(), scratch_->bytes());
  be_.rmsnorm_forward(s_, a.xn1, nullptr, x, w.attn_norm, eps);
  if (!a.qkv.empty()) {  // fused: one GEMM, q|k|v are column blocks
    be_.gemm(s_, a.qkv, a.xn1, Trans::no, w.wqkv, Trans::yes, 1.f, 0.f);
    if (!w.bqkv.empty()) be_.bias_add(s_, a.qkv, w.bqkv);
  } else {  // planar (qk_norm): three GEMMs on row blocks of wqkv
    const Mat outs[3] = {a.q, a.k, a.v};
    const int64_t row0[3] = {0, Q, Q + KV}, rows[3] = {Q, KV, KV};
    for (int i = 0; i < 3; ++i) {
      be_.gemm(s_, outs[i], a.xn1, Trans::no, w.wqkv.row_block(row0[i], rows[i]), Trans::yes,
               1.f, 0.f);
      if (!w.bqkv.empty()) be_.bias_add(s_, outs[i], w.bqkv.col_block(row0[i], rows[i]));
    }
    be_.rmsnorm_forward(s_, a.qr.reshaped(T * H, D), nullptr, a.q.reshaped(T * H, D), w.q_norm,
                        eps);
    be_.rmsnorm_forward(s_, a.kr.reshaped(T * KVH, D), nullptr, a.k.reshaped(T * KVH, D),
                        w.k_norm, eps);
  }
  be_.rope_forward(s_, a.qr, H, D, in.positions, in.inv_freq);
  be_.rope_forward(s_, a.kr, KVH, D, in.positions, in.inv_freq);
  const Mat k_cache = cache_rows(layer, 0), v_cache = cache_rows(layer, 1);
  const int64_t pos0 = cached_;
  be_.cast(s_, k_cache.row_block(pos0, T), a.kr);
  be_.cast(s_, v_cache.row_block(pos0, T), a.v);
  if (pos0 == 0)  // a sequence from its start: the training attention (flash on CUDA)
    be_.attention_forward(s_, a.att, a.lse, a.qr, a.kr, a.v, in.attn, in.cu_seqlens);
  else
    be_.attention_decode(s_, a.att, a.qr, k_cache, v_cache, in.attn, pos0 + T);
  be_.gemm(s_, a.attn_proj, a.att, Trans::no, w.wo, Trans::yes, 1.f, 0.f);
  be_.add_rmsnorm_forward(s_, a.resid, a.xn2, nullptr, x, a.attn_proj, w.mlp_norm, eps);
  be_.gemm(s_, a.gate_up, a.xn2, Trans::no, w.w_gate_up, Trans::yes, 1.f, 0.f);
  be_.swiglu_forward(s_, a.sw, a.gate_up.col_block(0, F), a.gate_up.col_block(F, F));
  be_.copy_on_device(s_, x.data, a.resid.data, x.bytes());
  be_.gemm(s_, x, a.sw, Trans::no, w.w_down, Trans::yes, 1.f, 1.f);
}

void Decoder::logits_of_last(Mat x) {
  const HeadWeights w = head_weights();
  const Mat xn(head_xn_->data(), cd_, 1, cfg_.hidden_size);
  be_.rmsnorm_forward(s_, xn, nullptr, x.row_block(x.rows - 1, 1), w.final_norm,
                      float(cfg_.rms_norm_eps));
  const Mat logits(logits_dev_->data(), DType::f32, 1, cfg_.vocab_size);
  be_.gemm(s_, logits, xn, Trans::no, w.lm_head, Trans::yes, 1.f, 0.f);
}

}  // namespace sf
