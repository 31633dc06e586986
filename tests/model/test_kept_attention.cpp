// layer_backward with Recompute::all_but_attention (model/recipes.h) against the full
// recompute, on the host backend: the attention output and lse that layer_forward left are
// kept (in the scratch, or copied to a buffer outside it, as the sliding window's store does),
// everything else in the scratch is poisoned with NaN, and the backward must give the
// recompute's bits without calling attention_forward. Every architecture (qwen2's qkv bias,
// qwen3's qk_norm), packed sequences, the MLP untiled and in tiles.
//
// Bitwise because the host backend's attention is deterministic and the mode reruns every
// other op of the forward with the same inputs in the same order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "backend/forwarding_backend.h"
#include "model/device_batch.h"
#include "model/model_test_util.h"
#include "model/recipes.h"
#include "test_util.h"

namespace sf::test {
namespace {

// Counts the attention kernels the recipe enqueues.
class AttentionCalls final : public PassThroughBackend {
 public:
  explicit AttentionCalls(Backend& in) : PassThroughBackend(in) {}
  void attention_forward(Stream& s, Mat out, float* lse, Mat q, Mat k, Mat v, const AttentionShape& sh,
                         const int32_t* cu) override {
    ++forwards;
    ForwardingBackend::attention_forward(s, out, lse, q, k, v, sh, cu);
  }
  int forwards = 0;
};

std::vector<float> read(Backend& be, const void* p, size_t bytes) {
  std::vector<float> v(bytes / 4);
  be.copy_to_host(be.default_stream(), v.data(), p, bytes);
  be.default_stream().synchronize();
  return v;
}

void write(Backend& be, void* p, const std::vector<float>& v) {
  be.copy_to_device(be.default_stream(), p, v.data(), v.size() * 4);
}

// Where the kept attention lives during the backward; dropped: poisoned like the rest (the
// negative case: the poison must reach the result).
enum class Kept { in_scratch, outside, dropped };

struct Result {
  std::vector<float> dx, grads;
  int attention_forwards = 0;
};

// Layer 0 of a tiny model over packed sequences: x_in, dy and prior gradients random.
class KeptAttentionLayer {
 public:
  KeptAttentionLayer(Arch arch, int64_t mlp_tile)
      : f_(tiny_config(arch), 64, 5, gradcheck_init()), tile_(mlp_tile),
        db_(f_.be, f_.be.default_stream(), f_.cfg, 64) {
    std::mt19937_64 rng(11);
    const int64_t V = f_.cfg.vocab_size;
    b_ = pack({random_tokens(9, V, rng), random_tokens(7, V, rng), random_tokens(7, V, rng)});
    in_ = &db_.upload(f_.be.default_stream(), b_);
    T_ = b_.n_tokens();
    const size_t n = size_t(T_ * f_.cfg.hidden_size);
    x0_ = random_vec(n, 1);
    dy_ = random_vec(n, 2);
    g0_ = random_vec(size_t(f_.model->layout().layer(0).numel), 3);
    bytes_ = layer_acts_bytes(f_.cfg, T_, DType::f32, tile_);
    scratch_ = f_.be.alloc(bytes_, "scratch");
    xs_ = f_.be.alloc(3 * n * 4, "x, x_out, dx");
  }

  // Forward, then the backward in `mode`; for all_but_attention the scratch is NaN but for
  // the kept att and lse (in place, or in their own buffer outside it).
  Result run(Recompute mode, Kept kept = Kept::in_scratch) {
    Backend& be = f_.be;
    const int64_t C = f_.cfg.hidden_size;
    LayerActs acts = bind_layer_acts(f_.cfg, T_, DType::f32, scratch_->data(), bytes_, tile_);
    float* x = static_cast<float*>(xs_->data());
    const size_t n = size_t(T_ * C);
    Mat x_in(x, DType::f32, T_, C), x_out(x + n, DType::f32, T_, C), dx(x + 2 * n, DType::f32, T_, C);
    write(be, x, x0_);
    layer_forward(be, be.default_stream(), f_.cfg, f_.model->layer_weights(0), acts, *in_, x_in, x_out);
    const size_t lse_bytes = size_t(f_.cfg.num_attention_heads * T_) * 4;
    const std::vector<float> att = read(be, acts.att.data, acts.att.bytes()), lse = read(be, acts.lse, lse_bytes);
    std::unique_ptr<Buffer> outside;
    if (mode == Recompute::all_but_attention) {
      write(be, scratch_->data(), std::vector<float>(bytes_ / 4, std::numeric_limits<float>::quiet_NaN()));
      if (kept == Kept::outside) {
        outside = be.alloc(acts.att.bytes() + lse_bytes, "kept attention");
        acts.att = Mat(outside->data(), DType::f32, T_, acts.att.cols);
        acts.lse = reinterpret_cast<float*>(static_cast<char*>(outside->data()) + acts.att.bytes());
      }
      if (kept != Kept::dropped) {
        write(be, acts.att.data, att);
        write(be, acts.lse, lse);
      }
    }
    write(be, f_.model->unit_grads_device(1), g0_);
    write(be, dx.data, dy_);
    AttentionCalls counting(be);
    layer_backward(counting, be.default_stream(), f_.cfg, f_.model->layer_weights(0), f_.model->layer_grads(0),
                   acts, *in_, x_in, dx, dx, mode);
    Result r;
    r.dx = read(be, dx.data, n * 4);
    r.grads = read(be, f_.model->unit_grads_device(1), g0_.size() * 4);
    r.attention_forwards = counting.forwards;
    EXPECT_EQ(read(be, x, n * 4), x0_) << "x_in changed";
    return r;
  }

 private:
  Fixture f_;
  int64_t tile_;
  DeviceBatch db_;
  Batch b_;
  const BatchInputs* in_ = nullptr;
  int64_t T_ = 0;
  std::vector<float> x0_, dy_, g0_;
  size_t bytes_ = 0;
  std::unique_ptr<Buffer> scratch_, xs_;
};

TEST(KeptAttention, GivesTheRecomputedBitsWithoutTheAttentionForward) {
  for (Arch arch : {Arch::llama, Arch::mistral, Arch::qwen2, Arch::qwen3}) {
    for (int64_t tile : {0, 5}) {
      SCOPED_TRACE(cat(arch_name(arch), " mlp tile ", tile));
      KeptAttentionLayer layer(arch, tile);
      const Result ref = layer.run(Recompute::all);
      EXPECT_EQ(ref.attention_forwards, 1);
      for (Kept kept : {Kept::in_scratch, Kept::outside}) {
        SCOPED_TRACE(kept == Kept::outside ? "kept outside the scratch" : "kept in the scratch");
        const Result r = layer.run(Recompute::all_but_attention, kept);
        EXPECT_EQ(r.attention_forwards, 0);
        EXPECT_EQ(r.dx, ref.dx);
        EXPECT_EQ(r.grads, ref.grads);
      }
      // Kept activations: the scratch as the forward left it.
      const Result none = layer.run(Recompute::none);
      EXPECT_EQ(none.attention_forwards, 0);
      EXPECT_EQ(none.dx, ref.dx);
      EXPECT_EQ(none.grads, ref.grads);
    }
  }
}

// The poison reaches the result: without the kept values the backward reads NaN, so the
// bitwise matches above show that it read the kept att and lse and recomputed the rest.
TEST(KeptAttention, APoisonedAttentionShowsInTheResult) {
  KeptAttentionLayer layer(Arch::qwen3, 0);
  const Result r = layer.run(Recompute::all_but_attention, Kept::dropped);
  EXPECT_EQ(r.attention_forwards, 0);
  EXPECT_TRUE(std::any_of(r.dx.begin(), r.dx.end(), [](float v) { return std::isnan(v); }));
}

}  // namespace
}  // namespace sf::test
