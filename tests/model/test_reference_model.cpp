// ReferenceModel and recipe tests: forward against an independent double-precision
// implementation of the Hugging Face modelling code, loss/gradient bookkeeping (accumulation,
// grad_scale, packing), recipe buffer aliasing, scratch layout, init.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "model/device_batch.h"
#include "model/model_test_util.h"
#include "test_util.h"
#include "model/recipes.h"

namespace sf::test {
namespace {

const Arch kArchs[] = {Arch::llama, Arch::mistral, Arch::qwen2, Arch::qwen3};

// ---- an independent forward, in double, written from the HF modelling code ---------------
// (LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM), reading the
// fp32 unit buffers through ParamLayout slot offsets only.
struct NaiveModel {
  const ModelConfig& c;
  const ModelLayout& lay;
  const std::vector<std::vector<float>>& p;

  using Vec = std::vector<double>;
  const float* slot(int unit, ParamKind k) const {
    return p[size_t(unit)].data() + lay.units[size_t(unit)].get(k).offset;
  }
  // y[rows] = W[rows, cols] x[cols] (+ b)
  Vec matvec(const float* W, int64_t rows, int64_t cols, const Vec& x,
             const float* b = nullptr) const {
    Vec y(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      double s = b ? b[r] : 0.0;
      for (int64_t j = 0; j < cols; ++j) s += double(W[r * cols + j]) * x[size_t(j)];
      y[size_t(r)] = s;
    }
    return y;
  }
  Vec rmsnorm(const Vec& x, const float* w, size_t off = 0, size_t n = 0) const {
    if (n == 0) n = x.size();
    Vec y = x;
    double ms = 0;
    for (size_t i = 0; i < n; ++i) ms += x[off + i] * x[off + i];
    const double r = 1.0 / std::sqrt(ms / double(n) + c.rms_norm_eps);
    for (size_t i = 0; i < n; ++i) y[off + i] = x[off + i] * r * w[i];
    return y;
  }
  void rope(Vec& x, int64_t heads, int pos, const std::vector<float>& inv) const {
    const int64_t D = c.head_dim, half = D / 2;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < half; ++i) {
        const double a = double(pos) * double(inv[size_t(i)]);
        double& x1 = x[size_t(h * D + i)];
        double& x2 = x[size_t(h * D + i + half)];
        const double y1 = x1 * std::cos(a) - x2 * std::sin(a);
        const double y2 = x2 * std::cos(a) + x1 * std::sin(a);
        x1 = y1;
        x2 = y2;
      }
  }

  double loss(const Batch& b) const {
    const int64_t C = c.hidden_size, F = c.intermediate_size, V = c.vocab_size;
    const int64_t H = c.num_attention_heads, KVH = c.num_key_value_heads, D = c.head_dim;
    const int64_t Q = c.q_dim(), KV = c.kv_dim();
    const auto inv = rope_inv_freq(c);
    const size_t T = size_t(b.n_tokens());
    std::vector<Vec> x(T);
    for (size_t t = 0; t < T; ++t) {
      const float* e = slot(0, ParamKind::embedding) + b.tokens[t] * C;
      x[t].assign(e, e + C);
    }
    for (int l = 0; l < lay.n_layers; ++l) {
      const int u = 1 + l;
      const float* wqkv = slot(u, ParamKind::wqkv);
      const float* bias = c.qkv_bias ? slot(u, ParamKind::bqkv) : nullptr;
      std::vector<Vec> q(T), k(T), v(T);
      for (size_t t = 0; t < T; ++t) {
        Vec h = rmsnorm(x[t], slot(u, ParamKind::attn_norm));
        q[t] = matvec(wqkv, Q, C, h, bias);
        k[t] = matvec(wqkv + Q * C, KV, C, h, bias ? bias + Q : nullptr);
        v[t] = matvec(wqkv + (Q + KV) * C, KV, C, h, bias ? bias + Q + KV : nullptr);
        if (c.qk_norm) {
          for (int64_t hh = 0; hh < H; ++hh)
            q[t] = rmsnorm(q[t], slot(u, ParamKind::q_norm), size_t(hh * D), size_t(D));
          for (int64_t hh = 0; hh < KVH; ++hh)
            k[t] = rmsnorm(k[t], slot(u, ParamKind::k_norm), size_t(hh * D), size_t(D));
        }
        rope(q[t], H, b.positions[t], inv);
        rope(k[t], KVH, b.positions[t], inv);
      }
      std::vector<Vec> nx(T);
      for (int s = 0; s < b.n_seqs(); ++s)
        for (int t = b.cu_seqlens[s]; t < b.cu_seqlens[s + 1]; ++t) {
          Vec att(size_t(Q), 0.0);
          for (int64_t hh = 0; hh < H; ++hh) {
            const int64_t kh = hh / (H / KVH);  // repeat_kv
            std::vector<double> sc;
            for (int j = b.cu_seqlens[s]; j <= t; ++j) {
              double d = 0;
              for (int64_t i = 0; i < D; ++i)
                d += q[size_t(t)][size_t(hh * D + i)] * k[size_t(j)][size_t(kh * D + i)];
              sc.push_back(d / std::sqrt(double(D)));
            }
            const double m = *std::max_element(sc.begin(), sc.end());
            double z = 0;
            for (auto& e : sc) z += (e = std::exp(e - m));
            for (int j = b.cu_seqlens[s]; j <= t; ++j)
              for (int64_t i = 0; i < D; ++i)
                att[size_t(hh * D + i)] +=
                    sc[size_t(j - b.cu_seqlens[s])] / z * v[size_t(j)][size_t(kh * D + i)];
          }
          Vec o = matvec(slot(u, ParamKind::wo), C, Q, att);
          Vec r(static_cast<size_t>(C));
          for (int64_t i = 0; i < C; ++i) r[size_t(i)] = x[size_t(t)][size_t(i)] + o[size_t(i)];
          Vec h2 = rmsnorm(r, slot(u, ParamKind::mlp_norm));
          const float* wgu = slot(u, ParamKind::w_gate_up);
          Vec gate = matvec(wgu, F, C, h2), up = matvec(wgu + F * C, F, C, h2);
          Vec a(static_cast<size_t>(F));
          for (int64_t i = 0; i < F; ++i)
            a[size_t(i)] = gate[size_t(i)] / (1 + std::exp(-gate[size_t(i)])) * up[size_t(i)];
          Vec dn = matvec(slot(u, ParamKind::w_down), C, F, a);
          for (int64_t i = 0; i < C; ++i) r[size_t(i)] += dn[size_t(i)];
          nx[size_t(t)] = r;
        }
      x = nx;
    }
    const int head = lay.n_layers + 1;
    const float* W = lay.tied ? slot(0, ParamKind::embedding) : slot(head, ParamKind::lm_head);
    double total = 0;
    for (size_t t = 0; t < T; ++t) {
      if (b.labels[t] == kIgnoreLabel) continue;
      Vec logits = matvec(W, V, C, rmsnorm(x[t], slot(head, ParamKind::final_norm)));
      const double m = *std::max_element(logits.begin(), logits.end());
      double z = 0;
      for (double e : logits) z += std::exp(e - m);
      total += m + std::log(z) - logits[size_t(b.labels[t])];
    }
    return total;
  }
};

Batch three_seq_batch(int64_t vocab, uint64_t seed) {
  std::mt19937_64 g(seed);
  return pack({random_tokens(9, vocab, g), random_tokens(4, vocab, g), random_tokens(6, vocab, g)},
              {1, 12});
}

class PerArch : public ::testing::TestWithParam<std::tuple<Arch, bool>> {
 protected:
  ModelConfig cfg() const { return tiny_config(std::get<0>(GetParam()), std::get<1>(GetParam())); }
};

// The recipes implement the HF semantics (q/k/v and gate/up order, rotate-half RoPE with
// llama3 scaling, GQA head mapping, qwen3 q/k norm before RoPE, bias, tied head, packing).
// Tolerance 2e-6 relative: fp32 forward (~1e-7 per op, a few dozen ops deep) vs double.
TEST_P(PerArch, ForwardMatchesIndependentDoubleImplementation) {
  Fixture f(cfg(), 32, 5, gradcheck_init());
  Batch b = three_seq_batch(f.cfg.vocab_size, 11);
  NaiveModel naive{f.cfg, f.model->layout(), f.params};
  const double want = naive.loss(b), got = f.model->forward(b);
  EXPECT_NEAR(got, want, 2e-6 * std::fabs(want)) << arch_name(f.cfg.arch);
}

// forward_backward reports the same loss as forward: the same ops run in the same order, and
// the loss does not depend on grad_scale. Tolerance: one f32 ulp of the sum.
TEST_P(PerArch, ForwardBackwardLossEqualsForwardLoss) {
  Fixture f(cfg(), 32, 6, gradcheck_init());
  Batch b = three_seq_batch(f.cfg.vocab_size, 12);
  const double l0 = f.model->forward(b);
  const double l1 = f.model->forward_backward(b, 0.37f);
  EXPECT_NEAR(l1, l0, 1e-7 * std::fabs(l0));
}

// Max |a - b| over every unit, relative to the largest |b|.
double max_rel_diff(const std::vector<std::vector<float>>& a,
                    const std::vector<std::vector<float>>& b, double scale_a = 1.0) {
  double diff = 0, mag = 0;
  for (size_t u = 0; u < a.size(); ++u)
    for (size_t i = 0; i < a[u].size(); ++i) {
      diff = std::max(diff, std::fabs(scale_a * a[u][i] - b[u][i]));
      mag = std::max(mag, std::fabs(double(b[u][i])));
    }
  return diff / mag;
}

// Gradient accumulation over micro-batches: {A, B} then {C} with grad_scale 1/N equals one
// batch {A, B, C} with the same scale (N = valid labels of the whole batch). Tolerance 2e-6
// relative to the largest gradient: fp32 weight-gradient GEMMs sum tokens in another order.
TEST_P(PerArch, GradientAccumulationEqualsFullBatch) {
  Fixture f(cfg(), 32, 7, gradcheck_init());
  std::mt19937_64 g(13);
  const int64_t V = f.cfg.vocab_size;
  Batch mb1 = pack({random_tokens(8, V, g), random_tokens(5, V, g)}, {3});
  Batch mb2 = pack({random_tokens(7, V, g)});
  Batch full = concat(mb1, mb2);
  const float scale = 1.f / float(full.n_valid_labels());
  f.model->zero_grads();
  const double l_full = f.model->forward_backward(full, scale);
  auto g_full = f.grads();
  f.model->zero_grads();
  const double l_acc = f.model->forward_backward(mb1, scale) + f.model->forward_backward(mb2, scale);
  auto g_acc = f.grads();
  EXPECT_NEAR(l_acc, l_full, 1e-6 * l_full);
  EXPECT_LT(max_rel_diff(g_acc, g_full), 2e-6);
}

// Kept activations (one scratch per layer, no recompute in the backward) give the same bits
// as recomputing: the backward consumes exactly what the forward left. Two micro-batches of
// different lengths accumulate, then an evaluation, then another step.
TEST_P(PerArch, KeptActivationsEqualRecomputeBitForBit) {
  Fixture rec(cfg(), 32, 8, gradcheck_init());
  Fixture keep(cfg(), 32, 8, gradcheck_init(), true);
  std::mt19937_64 g(17);
  const int64_t V = rec.cfg.vocab_size;
  Batch mb1 = pack({random_tokens(9, V, g), random_tokens(6, V, g)}, {2});
  Batch mb2 = pack({random_tokens(11, V, g)});
  for (Fixture* f : {&rec, &keep}) f->model->zero_grads();
  double l_rec = 0, l_keep = 0;
  for (const Batch* b : {&mb1, &mb2}) {
    l_rec += rec.model->forward_backward(*b, 0.25f);
    l_keep += keep.model->forward_backward(*b, 0.25f);
  }
  EXPECT_EQ(l_rec, l_keep);
  EXPECT_EQ(rec.grads(), keep.grads());
  EXPECT_EQ(rec.model->forward(mb2), keep.model->forward(mb2));
  EXPECT_EQ(rec.model->forward_backward(mb1, 1.f), keep.model->forward_backward(mb1, 1.f));
  EXPECT_EQ(rec.grads(), keep.grads());
}

// grad_scale multiplies every gradient (a power of two: exactly, up to fp32 rounding of
// intermediate values that scale exactly too).
TEST_P(PerArch, GradScaleScalesGradients) {
  Fixture f(cfg(), 32, 8, gradcheck_init());
  Batch b = three_seq_batch(f.cfg.vocab_size, 14);
  f.model->zero_grads();
  f.model->forward_backward(b, 1.f);
  auto g1 = f.grads();
  f.model->zero_grads();
  f.model->forward_backward(b, 0.25f);
  auto gq = f.grads();
  EXPECT_LT(max_rel_diff(g1, gq, 0.25), 1e-6);
  // Without zero_grads in between, a second call adds the same gradient again.
  f.model->forward_backward(b, 0.25f);
  auto gh = f.grads();
  EXPECT_LT(max_rel_diff(g1, gh, 0.5), 1e-6);
}

// Packing: sequences packed into one batch give the same loss and gradients as each alone
// (attention never crosses a sequence boundary; positions restart). Tolerance as above.
TEST_P(PerArch, PackedSequencesEqualSeparateSequences) {
  Fixture f(cfg(), 32, 9, gradcheck_init());
  std::mt19937_64 g(15);
  const int64_t V = f.cfg.vocab_size;
  auto a = random_tokens(10, V, g), c = random_tokens(6, V, g);
  f.model->zero_grads();
  const double l_packed = f.model->forward_backward(pack({a, c}), 1.f);
  auto g_packed = f.grads();
  f.model->zero_grads();
  const double la = f.model->forward_backward(pack({a}), 1.f);
  const double lc = f.model->forward_backward(pack({c}), 1.f);
  auto g_sep = f.grads();
  EXPECT_NEAR(la + lc, l_packed, 1e-6 * l_packed);
  EXPECT_LT(max_rel_diff(g_sep, g_packed), 2e-6);
  // The same sequence at the end of a pack (not at token 0) also has the same loss.
  EXPECT_NEAR(f.model->forward(pack({a, c})) - f.model->forward(pack({a})), lc, 1e-5 * l_packed);
}

// At the standard init (matrices N(0, 0.02), norms 1) the logits are nearly uniform: per-token
// logits have std ~0.02 sqrt(C) ~ 0.11, so the mean loss is log V + ~0.006, with a spread of
// ~0.11 / sqrt(labels). Tolerance 0.05 (labels ~ 60: > 4 sigma).
TEST_P(PerArch, LossAtInitIsLogVocab) {
  Fixture f(cfg(), 64, 10, InitOptions{});
  std::mt19937_64 g(16);
  const int64_t V = f.cfg.vocab_size;
  Batch b = pack({random_tokens(30, V, g), random_tokens(20, V, g), random_tokens(14, V, g)});
  const double mean = f.model->forward(b) / double(b.n_valid_labels());
  EXPECT_NEAR(mean, std::log(double(V)), 0.05);
}

INSTANTIATE_TEST_SUITE_P(Archs, PerArch,
                         ::testing::Values(std::tuple{Arch::llama, false},
                                           std::tuple{Arch::llama, true},
                                           std::tuple{Arch::mistral, false},
                                           std::tuple{Arch::qwen2, false},
                                           std::tuple{Arch::qwen3, false},
                                           std::tuple{Arch::qwen3, true}),
                         [](const auto& info) {
                           return std::string(arch_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_tied" : "");
                         });

// ---- recipes used directly, with caller-bound buffers ------------------------------------

std::vector<float> to_host(Backend& be, Mat m) {
  std::vector<float> v(size_t(m.numel()));
  be.copy_to_host(be.default_stream(), v.data(), m.data, m.bytes());
  return v;
}

// layer_forward with x_out == x_in equals x_out separate; layer_backward with dx_in == dx_out
// equals separate buffers (bitwise: the same ops on the same values). LayerActs bound for
// fewer tokens than the buffer was sized for.
TEST(Recipes, AliasedActivationBuffersGiveTheSameResults) {
  for (Arch arch : kArchs) {
    Fixture f(tiny_config(arch), 32, 21, gradcheck_init());
    Backend& be = f.be;
    Stream& s = be.default_stream();
    const ModelConfig& c = f.cfg;
    std::mt19937_64 g(17);
    Batch b = pack({random_tokens(6, c.vocab_size, g), random_tokens(5, c.vocab_size, g)});
    const int64_t T = b.n_tokens(), C = c.hidden_size;
    DeviceBatch db(be, s, c, 32);
    const BatchInputs& in = db.upload(s, b);
    auto acts_buf = be.alloc(layer_acts_bytes(c, 32, be.compute_dtype()), "acts");
    LayerActs acts = bind_layer_acts(c, T, be.compute_dtype(), acts_buf->data(), acts_buf->bytes());
    auto xb = be.alloc(size_t(4 * T * C) * 4, "x");
    auto mat = [&](int i) { return Mat(static_cast<float*>(xb->data()) + i * T * C, DType::f32, T, C); };
    auto x0 = random_vec(size_t(T * C), 3), dy = random_vec(size_t(T * C), 4);
    be.copy_to_device(s, mat(0).data, x0.data(), size_t(T * C) * 4);

    // forward: separate vs in place
    LayerWeights w = f.model->layer_weights(0);
    layer_forward(be, s, c, w, acts, in, mat(0), mat(1));
    be.copy_on_device(s, mat(2).data, mat(0).data, size_t(T * C) * 4);
    layer_forward(be, s, c, w, acts, in, mat(2), mat(2));
    EXPECT_EQ(to_host(be, mat(1)), to_host(be, mat(2))) << arch_name(arch);

    // backward: separate dx_in vs dx_in == dx_out
    const LayerGrads gr = f.model->layer_grads(0);
    auto read_grads = [&] {
      std::vector<float> v(f.model->layout().layer(0).numel);
      f.model->get_unit_grads(1, v.data());
      return v;
    };
    f.model->zero_grads();
    be.copy_to_device(s, mat(1).data, dy.data(), size_t(T * C) * 4);
    layer_backward(be, s, c, w, gr, acts, in, mat(0), mat(1), mat(2));
    auto dx_sep = to_host(be, mat(2));
    auto g_sep = read_grads();
    f.model->zero_grads();
    be.copy_to_device(s, mat(3).data, dy.data(), size_t(T * C) * 4);
    layer_backward(be, s, c, w, gr, acts, in, mat(0), mat(3), mat(3));
    EXPECT_EQ(dx_sep, to_host(be, mat(3))) << arch_name(arch);
    EXPECT_EQ(g_sep, read_grads()) << arch_name(arch);
    // x_in is untouched by the backward
    EXPECT_EQ(to_host(be, mat(0)), x0);
  }
}

// The scratch layout: sizes grow with T, qk_norm adds its slots, a short buffer is refused,
// slots do not overlap and stay aligned.
TEST(Recipes, ScratchTables) {
  for (Arch arch : kArchs) {
    ModelConfig c = tiny_config(arch);
    auto t = layer_acts_table(c, 10, DType::bf16);
    EXPECT_EQ(t.size(), c.qk_norm ? 12u : 9u);
    for (size_t i = 0; i < t.size(); ++i) {
      EXPECT_EQ(t[i].offset % 256, 0u);
      if (i) {
        EXPECT_GE(t[i].offset, t[i - 1].offset + t[i - 1].bytes);
      }
    }
    EXPECT_LT(layer_acts_bytes(c, 10, DType::bf16), layer_acts_bytes(c, 11, DType::bf16));
    EXPECT_LT(layer_acts_bytes(c, 10, DType::bf16), layer_acts_bytes(c, 10, DType::f32));
    std::vector<char> buf(layer_acts_bytes(c, 10, DType::f32));
    EXPECT_NO_THROW(bind_layer_acts(c, 10, DType::f32, buf.data(), buf.size()));
    EXPECT_NO_THROW(bind_layer_acts(c, 7, DType::f32, buf.data(), buf.size()));
    EXPECT_THROW(bind_layer_acts(c, 11, DType::f32, buf.data(), buf.size()), Error);
    EXPECT_THROW(bind_head_acts(c, 10, DType::f32, 4, buf.data(), 100), Error);
  }
  // Per token, an 8B-class layer (C 4096, Q 4096, KV 1024, F 14336) needs
  // R + N + QKV + A + G + S = 4096 * 2 + 6144 + 4096 + 28672 + 14336 elements (xn1 shares
  // R with resid, the o-proj output and every gradient temporary share other slots).
  ModelConfig big = tiny_config(Arch::llama);
  big.hidden_size = 4096;
  big.num_attention_heads = 32;
  big.num_key_value_heads = 8;
  big.head_dim = 128;
  big.intermediate_size = 14336;
  const size_t T = 1024;
  const size_t elems = 4096 * 2 + 6144 + 4096 + 28672 + 14336;
  const size_t stats = (2 + 32) * T * 4;
  EXPECT_EQ(layer_acts_bytes(big, int64_t(T), DType::bf16), elems * T * 2 + stats);
}

TEST(Recipes, HeadBindingForTiedEmbeddings) {
  ModelLayout tied = ModelLayout::build(tiny_config(Arch::qwen3, true));
  std::vector<float> emb(size_t(tied.embedding().numel)), head(size_t(tied.head().numel));
  EmbeddingParams e = bind_embedding(tied.embedding(), emb.data(), DType::f32);
  HeadParams h = bind_head(tied.head(), head.data(), DType::f32, e.table);
  EXPECT_EQ(h.lm_head.data, emb.data());
  EXPECT_THROW(bind_head(tied.head(), head.data(), DType::f32), Error);
  ModelLayout untied = ModelLayout::build(tiny_config(Arch::qwen3, false));
  std::vector<float> head2(size_t(untied.head().numel));
  HeadParams h2 = bind_head(untied.head(), head2.data(), DType::f32);
  EXPECT_EQ(h2.lm_head.data, head2.data() + untied.head().get(ParamKind::lm_head).offset);
  EXPECT_THROW(bind_layer(untied.head(), head2.data(), DType::f32), Error);
}

TEST(DeviceBatchTest, RejectsBadBatches) {
  HostBackend be;
  ModelConfig c = tiny_config(Arch::llama);
  DeviceBatch db(be, be.default_stream(), c, 8);
  Batch ok = pack({{1, 2, 3}, {4, 5}});
  const BatchInputs& in = db.upload(be.default_stream(), ok);
  EXPECT_EQ(in.n_tokens, 5);
  EXPECT_EQ(in.attn.n_seqs, 2);
  EXPECT_EQ(in.attn.max_seqlen, 3);
  EXPECT_FLOAT_EQ(in.attn.scale, 1.f / std::sqrt(8.f));
  EXPECT_EQ(in.positions[3], 0);  // host backend memory is host memory
  // The host's copy of the lengths rides in the shape (the cuDNN path groups sequences by them),
  // its own copy: the Batch may go away once the upload ran.
  ASSERT_NE(in.attn.host_cu_seqlens, nullptr);
  EXPECT_NE(in.attn.host_cu_seqlens, ok.cu_seqlens.data());
  EXPECT_EQ(std::vector<int32_t>(in.attn.host_cu_seqlens, in.attn.host_cu_seqlens + 3),
            (std::vector<int32_t>{0, 3, 5}));
  EXPECT_THROW(db.upload(be.default_stream(), pack({{1, 2, 99}})), Error);  // token >= vocab
  EXPECT_THROW(db.upload(be.default_stream(), pack({{1, 2, 3, 4, 5}, {1, 2, 3, 4}})), Error);
}

TEST(DeviceBatchTest, SlidingWindowLimitsSequenceLength) {
  HostBackend be;
  Stream& s = be.default_stream();
  // Through config.json, as a model directory states it (io/model_config.h derives the window).
  auto with = [](Arch a, const nlohmann::json& fields) {
    nlohmann::json j = config_to_json(tiny_config(a));
    j.update(fields);
    return config_from_json(j, "config.json");
  };
  ModelConfig m = with(Arch::mistral, {{"sliding_window", 4}});
  DeviceBatch dm(be, s, m, 16);
  EXPECT_NO_THROW(dm.upload(s, pack({{1, 2, 3, 4}, {1, 2, 3}})));
  EXPECT_THROW(dm.upload(s, pack({{1, 2, 3, 4, 5}})), Error);
  m = with(Arch::mistral, {{"sliding_window", nullptr}});  // mistral v0.2+: no window
  DeviceBatch dn(be, s, m, 16);
  EXPECT_NO_THROW(dn.upload(s, pack({{1, 2, 3, 4, 5}})));
  ModelConfig q = with(Arch::qwen2, {{"sliding_window", 4}, {"use_sliding_window", false}});
  DeviceBatch dq(be, s, q, 16);
  EXPECT_NO_THROW(dq.upload(s, pack({{1, 2, 3, 4, 5}})));
  // Qwen slides only the layers from max_window_layers on (default 28: none of these 2).
  q = with(Arch::qwen2, {{"sliding_window", 4}, {"use_sliding_window", true}});
  DeviceBatch dq2(be, s, q, 16);
  EXPECT_NO_THROW(dq2.upload(s, pack({{1, 2, 3, 4, 5}})));
  q = with(Arch::qwen2, {{"sliding_window", 4}, {"use_sliding_window", true},
                         {"max_window_layers", 1}});
  DeviceBatch dq3(be, s, q, 16);
  EXPECT_THROW(dq3.upload(s, pack({{1, 2, 3, 4, 5}})), Error);
}

TEST(Init, DeterministicWithExpectedStatistics) {
  ModelLayout lay = ModelLayout::build(tiny_config(Arch::qwen2));
  InitOptions opt;
  auto a = init_params(lay, 42, opt), b = init_params(lay, 42, opt), c = init_params(lay, 43, opt);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Layer 0 and layer 1 draw different values.
  EXPECT_NE(std::vector<float>(a[1].begin(), a[1].begin() + 64),
            std::vector<float>(a[2].begin(), a[2].begin() + 64));
  for (size_t u = 0; u < lay.units.size(); ++u) {
    std::vector<bool> covered(a[u].size(), false);
    for (auto& s : lay.units[u].params) {
      double sum = 0, sq = 0;
      for (int64_t i = 0; i < s.numel(); ++i) {
        const double v = a[u][size_t(s.offset + i)];
        covered[size_t(s.offset + i)] = true;
        sum += v;
        sq += v * v;
      }
      const double n = double(s.numel()), mean = sum / n, sd = std::sqrt(sq / n - mean * mean);
      switch (s.kind) {
        case ParamKind::attn_norm: case ParamKind::mlp_norm: case ParamKind::final_norm:
          EXPECT_EQ(mean, 1.0);
          break;
        case ParamKind::bqkv:
          EXPECT_EQ(sq, 0.0);
          break;
        default:
          // n >= 1024: the sample std is within 10% of 0.02 (4.5 sigma of sqrt(1/2n)).
          EXPECT_NEAR(sd, 0.02, 0.02 * 0.10) << param_kind_name(s.kind);
          EXPECT_NEAR(mean, 0.0, 0.02 * 4 / std::sqrt(n)) << param_kind_name(s.kind);
      }
    }
    for (size_t i = 0; i < covered.size(); ++i)
      if (!covered[i]) {
        EXPECT_EQ(a[u][i], 0.f) << "padding must be zero";
      }
  }
  // Non-trivial options move norms and biases off their defaults.
  InitOptions j;
  j.norm_jitter = 0.1f;
  j.bias_std = 0.1f;
  auto d = init_params(lay, 42, j);
  const auto& bq = lay.layer(0).get(ParamKind::bqkv);
  const auto& an = lay.layer(0).get(ParamKind::attn_norm);
  EXPECT_NE(d[1][size_t(bq.offset)], 0.f);
  EXPECT_NE(d[1][size_t(an.offset)], 1.f);
}

}  // namespace
}  // namespace sf::test
