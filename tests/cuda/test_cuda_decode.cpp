// The generation path on the GPU against the host:
//  - attention_decode (bf16) against the host's (fp32) on the same bf16 inputs: one new token
//    and several at an offset, GQA and MHA, head_dim 64 and 128, a strided cache, guards;
//  - the Decoder on a small random llama (head_dim 64, the CUDA attention's size) on CUDA
//    against the host decoder with the same bf16-rounded weights, token by token;
//  - streamed weights (two slots, a copy stream) give the resident logits bitwise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "cuda_test_util.h"
#include "generate/decoder.h"
#include "model/model_init.h"

namespace sf {
namespace {

using namespace sf::test;

struct DecodeCase {
  int heads, kv_heads, head_dim;
  int64_t q_len, kv_len;
};

void run_decode_case(const DecodeCase& c) {
  SCOPED_TRACE(testing::Message() << "heads " << c.heads << "/" << c.kv_heads << " D "
                                  << c.head_dim << " q_len " << c.q_len << " kv_len " << c.kv_len);
  const int64_t Q = int64_t(c.heads) * c.head_dim, KV = int64_t(c.kv_heads) * c.head_dim;
  const int64_t rows = c.kv_len + 3;  // cache rows past kv_len are never read
  const auto q = rand_bf16(size_t(c.q_len * Q), 1, -2.f, 2.f);
  const auto k = rand_bf16(size_t(rows * KV), 2, -2.f, 2.f), v = rand_bf16(size_t(rows * KV), 3);
  AttentionShape sh{c.heads, c.kv_heads, c.head_dim, 1.f / std::sqrt(float(c.head_dim)), 1, 1};
  HostMat hq(c.q_len, Q, q), hk(rows, KV, k), hv(rows, KV, v), hout(c.q_len, Q);
  host().attention_decode(hs(), hout.m, hq.m, hk.m, hv.m, sh, c.kv_len);
  DevMat dq(DType::bf16, c.q_len, Q), dk(DType::bf16, rows, KV, KV + 8),
      dv(DType::bf16, rows, KV, KV + 8), dout(DType::bf16, c.q_len, Q, Q + 8);
  dq.upload(q);
  dk.upload(k);
  dv.upload(v);
  dout.poison();
  gpu().attention_decode(gs(), dout.m, dq.m, dk.m, dv.m, sh, c.kv_len);
  const auto got = dout.download();
  // Outputs are convex combinations of values in [-1, 1]: the bf16 rounding of the output
  // (2^-9 relative) plus fp32 sums in another order stay below 8e-3.
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_FALSE(std::isnan(got[i])) << "element " << i << " not written";
    worst = std::max(worst, double(std::abs(got[i] - hout.v[i])));
  }
  EXPECT_LE(worst, 8e-3);
  EXPECT_TRUE(dout.guards_intact());
}

TEST(CudaAttentionDecode, MatchesTheHost) {
  SF_REQUIRE_GPU();
  for (const DecodeCase& c : {DecodeCase{8, 2, 64, 1, 1}, DecodeCase{8, 2, 64, 1, 333},
                              DecodeCase{4, 4, 128, 1, 1000}, DecodeCase{32, 8, 128, 7, 77},
                              DecodeCase{9, 3, 64, 22, 65}})
    run_decode_case(c);
}

ModelConfig small_llama() {
  ModelConfig c = tiny_config(Arch::llama);
  c.hidden_size = 256;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.intermediate_size = 320;
  c.vocab_size = 301;
  return c;
}

std::vector<std::vector<float>> bf16_params(const ModelConfig& c) {
  InitOptions init;
  init.matrix_std = 0.05f;
  auto p = init_params(ModelLayout::build(c), 5, init);
  for (auto& u : p)
    for (auto& x : u) x = round_bf16(x);
  return p;
}

TEST(CudaDecoder, FollowsTheHostDecoderTokenByToken) {
  SF_REQUIRE_GPU();
  const ModelConfig cfg = small_llama();
  const auto params = bf16_params(cfg);
  DecoderOptions opt;
  opt.max_context = 64;
  opt.chunk_tokens = 16;
  Decoder h(host(), cfg, opt), g(gpu(), cfg, opt);
  for (int u = 0; u < h.n_units(); ++u) {
    h.set_unit_weights(u, params[size_t(u)].data());
    g.set_unit_weights(u, params[size_t(u)].data());
  }
  std::vector<int32_t> seq;
  for (int i = 0; i < 40; ++i) seq.push_back(int32_t((i * 37 + 11) % cfg.vocab_size));
  auto compare = [&](std::span<const float> a, std::span<const float> b, const char* what) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, double(std::abs(a[i] - b[i])));
      scale = std::max(scale, double(std::abs(a[i])));
    }
    // bf16 activations through two layers: a few percent of the largest logit.
    EXPECT_LE(worst, 0.03 * scale + 1e-3) << what;
  };
  std::vector<float> hl;
  {
    auto a = h.append(std::span(seq).first(20));
    hl.assign(a.begin(), a.end());
  }
  compare(hl, g.append(std::span(seq).first(20)), "prefill of 20 (2 chunks)");
  for (size_t i = 20; i < seq.size(); ++i) {
    auto a = h.append(std::span(seq).subspan(i, 1));
    hl.assign(a.begin(), a.end());
    compare(hl, g.append(std::span(seq).subspan(i, 1)), "decode step");
  }
}

TEST(CudaDecoder, StreamedWeightsGiveTheResidentLogitsBitwise) {
  SF_REQUIRE_GPU();
  const ModelConfig cfg = small_llama();
  const auto params = bf16_params(cfg);
  DecoderOptions opt;
  opt.max_context = 48;
  Decoder resident(gpu(), cfg, opt);
  opt.placement = WeightPlacement::placement_streamed;
  Decoder streamed(gpu(), cfg, opt);
  for (int u = 0; u < resident.n_units(); ++u) {
    resident.set_unit_weights(u, params[size_t(u)].data());
    streamed.set_unit_weights(u, params[size_t(u)].data());
  }
  std::vector<int32_t> seq;
  for (int i = 0; i < 30; ++i) seq.push_back(int32_t((i * 53 + 7) % cfg.vocab_size));
  for (size_t i = 0; i < seq.size(); ++i) {
    std::vector<float> a;
    {
      auto r = resident.append(std::span(seq).subspan(i, 1));
      a.assign(r.begin(), r.end());
    }
    auto b = streamed.append(std::span(seq).subspan(i, 1));
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4)) << "token " << i;
  }
}

}  // namespace
}  // namespace sf
