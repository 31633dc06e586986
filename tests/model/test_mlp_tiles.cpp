// The MLP tiled over tokens (LayerActs::mlp_tile) against the untiled layer, on the host
// backend: forward, backward with recompute and with kept activations, every architecture
// (qwen2's qkv bias, qwen3's qk_norm), packed sequences, T not a multiple of the tile, tiles
// down to one token; then whole ReferenceModel steps; then the scratch sizes.
//
// What is bitwise and why. The host GEMM (host_gemm.cpp) cuts c into fixed 128-row blocks,
// one single-threaded cblas_sgemm each. Inside a call, OpenBLAS's result for a row depends
// on where the row falls in its kernel's row blocking (checked with OpenBLAS 0.3.21: rows of
// a 5-row call differ in the last bit from the same rows of a 23-row call), so a tile that
// is not a multiple of 128 rows changes the rounding of gate_up, sw, dsw, dxn2 and x_out:
// those are compared within fp32 tolerances. A tile that IS a multiple of 128 issues the
// very same cblas calls for the same rows as the untiled chunk (kMlpTileTokens = 16384 is):
// x_out, dx_in and every weight gradient but the MLP's are then bitwise equal. The MLP's
// weight gradients (w_down, w_gate_up) sum over tokens (K = tokens): tile by tile they are
// added in another order, so they agree to fp32 rounding only, whatever the tile.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "core/error.h"
#include "model/device_batch.h"
#include "model/model_test_util.h"
#include "model/recipes.h"
#include "test_util.h"

namespace sf::test {
namespace {

const Arch kArchs[] = {Arch::llama, Arch::mistral, Arch::qwen2, Arch::qwen3};

bool is_mlp_weight(ParamKind k) { return k == ParamKind::w_down || k == ParamKind::w_gate_up; }

// max |a - b| <= rel * max |b| over n values (the tolerances are argued where rel is chosen).
void expect_close(const float* a, const float* b, int64_t n, double rel, const std::string& what) {
  float max_ref = 0;
  for (int64_t i = 0; i < n; ++i) max_ref = std::max(max_ref, std::fabs(b[i]));
  const double tol = rel * max_ref + 1e-30;  // 1e-30: an all-zero reference
  for (int64_t i = 0; i < n; ++i)
    ASSERT_LE(std::fabs(double(a[i]) - double(b[i])), tol)
        << what << " at " << i << ": " << a[i] << " vs " << b[i] << " (max " << max_ref << ")";
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, double rel,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  expect_close(a.data(), b.data(), int64_t(a.size()), rel, what);
}

// Tolerances. A reordered fp32 sum or dot product of n terms moves by at most ~n 2^-24 of
// the sum of its |terms|; here n <= 64 tokens for the MLP weight gradients (K = tokens) and
// n <= 2F = 80 for the rows of a differently blocked GEMM, i.e. <= 5e-6, and with these
// random O(1) inputs the sums of |terms| stay within a few times the largest result.
// kMlpGradRel: the MLP weight gradients, reordered over tokens only: 2x that bound.
// kRowsRel: everything downstream of differently rounded rows, which the norms, attention
// and GEMMs of up to two layers carry with an O(1) gain: 6x. (Worst seen: 9e-7 for both.)
constexpr double kMlpGradRel = 1e-5, kRowsRel = 3e-5;

enum class GradMatch {
  bitwise_but_mlp,  // the same rows bits: only the MLP weight gradients reorder their sums
  close,            // every gradient within kRowsRel (rows rounded differently upstream)
};

// Gradients of `unit` (flat, ModelLayout order), slot by slot, against the untiled run.
void expect_grads_match(const Unit& unit, const std::vector<float>& tiled,
                        const std::vector<float>& ref, GradMatch match, const std::string& what) {
  for (const ParamSlot& p : unit.params) {
    const float* a = tiled.data() + p.offset;
    const float* b = ref.data() + p.offset;
    const std::string name = cat(what, ": ", param_kind_name(p.kind));
    if (match == GradMatch::close) {
      expect_close(a, b, p.numel(), kRowsRel, name);
    } else if (is_mlp_weight(p.kind)) {
      expect_close(a, b, p.numel(), kMlpGradRel, name);
    } else {
      for (int64_t i = 0; i < p.numel(); ++i) ASSERT_EQ(a[i], b[i]) << name << " at " << i;
    }
  }
}

std::vector<float> read(Backend& be, const void* p, size_t n) {
  std::vector<float> v(n);
  be.copy_to_host(be.default_stream(), v.data(), p, n * 4);
  be.default_stream().synchronize();
  return v;
}

struct LayerRun {
  std::vector<float> x_out, dx, grads, dx_kept, grads_kept;
};

// One decoder layer (layer 0 of f's model) over `in`, its scratch bound with mlp_tile_tokens
// in a buffer of exactly the tiled size, NaN-poisoned (a read of a slot nothing wrote
// shows), followed by guard bytes that must stay untouched. The gradients start from `g0`
// (non-zero: they must accumulate). Returns forward, recompute backward and kept-activation
// backward results.
LayerRun run_layer(Fixture& f, const BatchInputs& in, int64_t mlp_tile_tokens,
                   const std::vector<float>& x0, const std::vector<float>& dy,
                   const std::vector<float>& g0) {
  Backend& be = f.be;
  Stream& s = be.default_stream();
  const ModelConfig& c = f.cfg;
  const int64_t T = in.n_tokens, C = c.hidden_size;
  const DType cd = be.compute_dtype();
  const size_t bytes = layer_acts_bytes(c, T, cd, mlp_tile_tokens), guard = 4096;
  auto buf = be.alloc(bytes + guard, "acts");
  std::vector<float> poison((bytes + guard) / 4, std::numeric_limits<float>::quiet_NaN());
  for (size_t i = bytes / 4; i < poison.size(); ++i) poison[i] = float(i % 97);
  be.copy_to_device(s, buf->data(), poison.data(), poison.size() * 4);
  const LayerActs acts = bind_layer_acts(c, T, cd, buf->data(), bytes, mlp_tile_tokens);
  EXPECT_EQ(acts.mlp_tile, mlp_tile_tokens == 0 ? T : std::min(T, mlp_tile_tokens));

  const size_t n = size_t(T * C);
  auto xb = be.alloc(3 * n * 4, "x, x_out, dx");
  float* x = static_cast<float*>(xb->data());
  Mat x_in(x, DType::f32, T, C), x_out(x + n, DType::f32, T, C), dx(x + 2 * n, DType::f32, T, C);
  be.copy_to_device(s, x, x0.data(), n * 4);
  const LayerWeights w = f.model->layer_weights(0);
  const LayerGrads g = f.model->layer_grads(0);
  float* gdev = f.model->unit_grads_device(1);
  auto backward = [&](bool recompute) {
    be.copy_to_device(s, gdev, g0.data(), g0.size() * 4);
    be.copy_to_device(s, dx.data, dy.data(), n * 4);
    layer_backward(be, s, c, w, g, acts, in, x_in, dx, dx, recompute);
  };

  LayerRun r;
  layer_forward(be, s, c, w, acts, in, x_in, x_out);
  r.x_out = read(be, x_out.data, n);
  backward(true);
  r.dx = read(be, dx.data, n);
  r.grads = read(be, gdev, g0.size());
  layer_forward(be, s, c, w, acts, in, x_in, x_out);
  backward(false);
  r.dx_kept = read(be, dx.data, n);
  r.grads_kept = read(be, gdev, g0.size());
  EXPECT_EQ(read(be, x, n), x0) << "x_in changed";
  const std::vector<float> after = read(be, buf->data(), poison.size());
  for (size_t i = bytes / 4; i < poison.size(); ++i)
    EXPECT_EQ(after[i], poison[i]) << "guard word " << i - bytes / 4 << " after the scratch";
  return r;
}

// A packed batch of sequences of these lengths, uploaded, and random x_in, dy and prior
// gradients for layer 0.
struct LayerCase {
  Fixture f;
  Batch b;
  DeviceBatch db;
  const BatchInputs& in;
  std::vector<float> x0, dy, g0;
  LayerCase(Arch arch, const std::vector<int>& lens)
      : f(tiny_config(arch), 512, 5, gradcheck_init()),
        b(make_batch(f.cfg, lens)),
        db(f.be, f.be.default_stream(), f.cfg, 512),
        in(db.upload(f.be.default_stream(), b)),
        x0(random_vec(size_t(b.n_tokens() * f.cfg.hidden_size), 1)),
        dy(random_vec(x0.size(), 2)),
        g0(random_vec(size_t(f.model->layout().layer(0).numel), 3)) {}
  static Batch make_batch(const ModelConfig& c, const std::vector<int>& lens) {
    std::mt19937_64 rng(11);
    std::vector<std::vector<int32_t>> seqs;
    for (int n : lens) seqs.push_back(random_tokens(n, c.vocab_size, rng));
    return pack(seqs);
  }
  LayerRun run(int64_t tile) { return run_layer(f, in, tile, x0, dy, g0); }
  const Unit& unit() const { return f.model->layout().layer(0); }
};

// Tiles of 1 (single-row GEMMs), 5 and 8 (T = 23 is a multiple of neither) and 22 (a
// one-token last tile) against the untiled layer, within the tolerances; 23 and 64 (one
// tile) must be the untiled layer exactly, gradients included. Kept activations give the
// recompute's bits for every tile.
TEST(MlpTiles, SmallTilesMatchTheUntiledLayer) {
  for (Arch arch : kArchs) {
    SCOPED_TRACE(arch_name(arch));
    LayerCase lc(arch, {9, 7, 7});
    ASSERT_EQ(lc.b.n_tokens(), 23);
    const LayerRun ref = lc.run(0);
    EXPECT_EQ(ref.dx_kept, ref.dx);
    EXPECT_EQ(ref.grads_kept, ref.grads);
    for (int64_t tile : {1, 5, 8, 22, 23, 64}) {
      SCOPED_TRACE(cat("tile ", tile));
      const LayerRun r = lc.run(tile);
      EXPECT_EQ(r.dx_kept, r.dx);
      EXPECT_EQ(r.grads_kept, r.grads);
      if (tile >= 23) {
        EXPECT_EQ(r.x_out, ref.x_out);
        EXPECT_EQ(r.dx, ref.dx);
        EXPECT_EQ(r.grads, ref.grads) << "one tile is the untiled layer";
        continue;
      }
      // Rows rounded differently from the first GEMM on (see the file comment).
      expect_close(r.x_out, ref.x_out, kRowsRel, "x_out");
      expect_close(r.dx, ref.dx, kRowsRel, "dx_in");
      expect_grads_match(lc.unit(), r.grads, ref.grads, GradMatch::close, "gradients");
    }
  }
}

// Tiles of 128 and 256 rows (the host GEMM's row block) over T = 300 (3 sequences, not a
// multiple of either): the GEMMs see the same rows in the same calls, so x_out, dx_in and
// all but the MLP's weight gradients are bitwise those of the untiled layer.
TEST(MlpTiles, TilesOfWholeHostGemmBlocksAreBitwise) {
  for (Arch arch : kArchs) {
    SCOPED_TRACE(arch_name(arch));
    LayerCase lc(arch, {130, 100, 70});
    const LayerRun ref = lc.run(0);
    for (int64_t tile : {128, 256}) {
      SCOPED_TRACE(cat("tile ", tile));
      const LayerRun r = lc.run(tile);
      EXPECT_EQ(r.x_out, ref.x_out);
      EXPECT_EQ(r.dx, ref.dx);
      EXPECT_EQ(r.dx_kept, r.dx);
      EXPECT_EQ(r.grads_kept, r.grads);
      expect_grads_match(lc.unit(), r.grads, ref.grads, GradMatch::bitwise_but_mlp, "gradients");
    }
  }
}

// Whole-model steps (packed sequences, gradient accumulation over two calls), with and
// without kept activations, tied and untied: a tile of 4 within the tolerances (the loss
// within kRowsRel too: a sum of per-token losses of differently rounded rows), a tile of
// 128 over 200 tokens with the same loss bits and bitwise gradients but the MLP weights'.
TEST(MlpTiles, ReferenceModelStepMatchesTheUntiledModel) {
  for (auto [arch, tied] : {std::pair{Arch::llama, false}, std::pair{Arch::qwen2, false},
                            std::pair{Arch::qwen3, true}}) {
    for (bool keep : {false, true}) {
      for (int64_t tile : {4, 128}) {
        SCOPED_TRACE(cat(arch_name(arch), tied ? " tied" : "", keep ? " kept" : "", " tile ", tile));
        const bool aligned = tile == 128;
        Fixture ref(tiny_config(arch, tied), 200, 8, gradcheck_init(), keep, 0);
        Fixture tiled(tiny_config(arch, tied), 200, 8, gradcheck_init(), keep, tile);
        std::mt19937_64 rng(3);
        const int64_t V = ref.cfg.vocab_size;
        const int n = aligned ? 100 : 15;
        Batch b1 = pack({random_tokens(n, V, rng), random_tokens(n - 6, V, rng)}, {2, 17});
        Batch b2 = pack({random_tokens(2 * n, V, rng)});
        for (const Batch* b : {&b1, &b2}) {
          const double la = tiled.model->forward_backward(*b, 0.5f);
          const double lb = ref.model->forward_backward(*b, 0.5f);
          if (aligned) {
            EXPECT_EQ(la, lb);
          } else {
            EXPECT_NEAR(la, lb, kRowsRel * lb);
          }
        }
        const auto ga = tiled.grads(), gb = ref.grads();
        for (int u = 0; u < ref.model->n_units(); ++u)
          expect_grads_match(ref.model->layout().units[size_t(u)], ga[size_t(u)], gb[size_t(u)],
                             aligned ? GradMatch::bitwise_but_mlp : GradMatch::close,
                             cat("unit ", u));
      }
    }
  }
}

// Slots G and S shrink to max(their [T, .] users, the tile's); everything else is unchanged;
// 0 or a tile >= T is the untiled table; a buffer for T tokens binds fewer tokens with the
// same tile; a negative tile and a buffer too small for the tile are refused.
TEST(MlpTiles, ScratchTables) {
  for (Arch arch : kArchs) {
    SCOPED_TRACE(arch_name(arch));
    const ModelConfig c = tiny_config(arch);
    const int64_t T = 40;
    const auto untiled = layer_acts_table(c, T, DType::f32);
    EXPECT_EQ(layer_acts_bytes(c, T, DType::f32, T), layer_acts_bytes(c, T, DType::f32));
    EXPECT_EQ(layer_acts_bytes(c, T, DType::f32, 1000), layer_acts_bytes(c, T, DType::f32));
    const auto tiled = layer_acts_table(c, T, DType::f32, 6);
    ASSERT_EQ(tiled.size(), untiled.size());
    const int64_t Q = c.q_dim(), F = c.intermediate_size;
    const int64_t wide = std::max(c.hidden_size, Q + 2 * c.kv_dim());
    for (size_t i = 0; i < tiled.size(); ++i) {
      const std::string& name = tiled[i].name;
      size_t want = untiled[i].bytes;
      if (name.rfind("G:", 0) == 0) want = size_t(std::max(T * wide, 6 * 2 * F)) * 4;
      if (name.rfind("S:", 0) == 0) want = size_t(std::max(T * Q, 6 * F)) * 4;
      EXPECT_EQ(tiled[i].bytes, want) << name;
    }
    EXPECT_LT(layer_acts_bytes(c, T, DType::f32, 6), layer_acts_bytes(c, T, DType::f32));
    std::vector<char> buf(layer_acts_bytes(c, T, DType::f32, 6));
    EXPECT_EQ(bind_layer_acts(c, 17, DType::f32, buf.data(), buf.size(), 6).mlp_tile, 6);
    EXPECT_EQ(bind_layer_acts(c, 4, DType::f32, buf.data(), buf.size(), 6).mlp_tile, 4);
    EXPECT_THROW(bind_layer_acts(c, T, DType::f32, buf.data(), buf.size(), 0), Error);
    EXPECT_THROW(bind_layer_acts(c, T, DType::f32, buf.data(), buf.size(), T - 1), Error);
    EXPECT_THROW(layer_acts_bytes(c, T, DType::f32, -1), Error);
  }
  // 8B at 1 x 131072 with 16K-token tiles: slot G is [T, Q + 2KV] (6144 > C = 4096 > the
  // tile's 16384 * 2F / T = 3584), slot S [T, Q] (4096 > 16384 * F / T = 1792); per token
  // R + N + QKV + A + G + S = 4096 * 2 + 6144 + 4096 + 6144 + 4096 elements instead of the
  // untiled ... + 28672 + 14336 (7 + 3.5 GiB less of bf16).
  ModelConfig big = tiny_config(Arch::llama);
  big.hidden_size = 4096;
  big.num_attention_heads = 32;
  big.num_key_value_heads = 8;
  big.head_dim = 128;
  big.intermediate_size = 14336;
  const size_t T = 131072;
  const size_t stats = (2 + 32) * T * 4;
  EXPECT_EQ(layer_acts_bytes(big, int64_t(T), DType::bf16, 16384),
            (4096 * 2 + 6144 + 4096 + 6144 + 4096) * T * 2 + stats);
  EXPECT_EQ(layer_acts_bytes(big, int64_t(T), DType::bf16),
            (4096 * 2 + 6144 + 4096 + 28672 + 14336) * T * 2 + stats);
}

}  // namespace
}  // namespace sf::test
