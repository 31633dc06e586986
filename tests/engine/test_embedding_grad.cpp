// The sparse embedding gradient gives exactly what a dense [V, C] f32 gradient gives: the
// same scatter sums, the same sum of squares bits, and the same AdamW results row by row
// (touched rows with their gradient, untouched rows with 0), also split in two passes.
#include <gtest/gtest.h>

#include <random>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "engine/embedding_grad.h"
#include "optim/adamw.h"
#include "optim/adamw_undo.h"
#include "optim/grad_norm.h"

using namespace sf;

namespace {

Batch tokens_batch(std::vector<int32_t> ids) {
  return Batch::from_rows({std::move(ids)});
}

struct Setup {
  int64_t V, C;
  std::vector<Batch> chunks;
  std::vector<uint16_t> dx;  // bf16 [T, C] per chunk, concatenated
};

}  // namespace

// C = 40 does not divide the 64K-element sum-of-squares block: rows straddle blocks.
class EmbeddingGradExact : public ::testing::TestWithParam<int64_t> {};

TEST_P(EmbeddingGradExact, MatchesTheDenseGradient) {
  const int64_t C = GetParam(), V = 5000;
  std::mt19937_64 g(11);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  // Two chunks with repeated ids (some across chunks), ids near both ends of the table.
  std::vector<Batch> chunks = {tokens_batch({3, 4999, 17, 3, 1638, 1639, 0}),
                               tokens_batch({17, 2500, 2501, 2502, 4999, 1640})};
  std::vector<float> dense(size_t(V * C), 0.f);
  std::vector<float> storage(size_t(EmbeddingGrad::max_rows(V, 13, false) * C), -7.f);
  EmbeddingGrad eg(V, C, 13, false, storage.data());
  eg.set_rows(chunks);
  eg.zero(nullptr, host_pool());
  EXPECT_EQ(eg.touched_rows(), 10);
  for (const Batch& b : chunks) {
    std::vector<uint16_t> dx(size_t(b.n_tokens() * C));
    for (auto& x : dx) x = f32_to_bf16(u(g));
    eg.scatter(b, dx.data(), DType::bf16, host_pool());
    for (int64_t t = 0; t < b.n_tokens(); ++t)
      for (int64_t c = 0; c < C; ++c)
        dense[size_t(b.tokens[size_t(t)] * C + c)] += bf16_to_f32(dx[size_t(t * C + c)]);
  }
  const ParamRange all{0, V * C, true};
  const double want = sum_squares_ranges(dense.data(), V * C, {&all, 1}, &host_pool());
  const double got = eg.sum_squares(host_pool());
  EXPECT_EQ(got, want) << "bits of the dense sum of squares";

  // AdamW: dense in one pass vs sparse touched + untouched; then a redo with another scale.
  std::vector<float> p(size_t(V * C)), m(size_t(V * C)), v(size_t(V * C));
  for (size_t i = 0; i < p.size(); ++i) p[i] = 0.02f * u(g), m[i] = 1e-3f * u(g), v[i] = 1e-6f * (1.5f + u(g));
  auto p2 = p, m2 = m, v2 = v;
  AdamWStep s;
  s.lr = 1e-3f;
  s.weight_decay = 0.1f;
  s.step = 3;
  s.grad_scale = 1.f;
  std::vector<uint16_t> out1(size_t(V * C)), out2(size_t(V * C));
  adamw_update_ranges(p.data(), m.data(), v.data(), dense.data(), out1.data(), V * C, {&all, 1}, s, &host_pool());
  eg.adamw(EmbeddingGrad::Kind::update, EmbeddingGrad::Rows::untouched, p2.data(), m2.data(), v2.data(),
           out2.data(), true, s, s, host_pool());
  eg.adamw(EmbeddingGrad::Kind::update, EmbeddingGrad::Rows::touched, p2.data(), m2.data(), v2.data(),
           out2.data(), true, s, s, host_pool());
  EXPECT_EQ(p, p2);
  EXPECT_EQ(m, m2);
  EXPECT_EQ(v, v2);
  EXPECT_EQ(out1, out2);

  AdamWStep c = s;
  c.grad_scale = 0.37f;
  adamw_redo_ranges(p.data(), m.data(), v.data(), dense.data(), out1.data(), V * C, {&all, 1}, s, c, &host_pool());
  eg.adamw(EmbeddingGrad::Kind::redo, EmbeddingGrad::Rows::touched, p2.data(), m2.data(), v2.data(),
           out2.data(), true, c, s, host_pool());
  // Untouched rows: a redo with gradient 0 is a no-op up to the undo's rounding; the engine
  // never redoes them (their update does not depend on the coefficient).
  for (int32_t r : chunks[0].tokens)
    for (int64_t k = 0; k < C; ++k) EXPECT_EQ(p[size_t(r * C + k)], p2[size_t(r * C + k)]);
}

INSTANTIATE_TEST_SUITE_P(Widths, EmbeddingGradExact, ::testing::Values(int64_t(64), int64_t(40)));

TEST(EmbeddingGrad, RejectsTokensOutsideTheVocabulary) {
  std::vector<float> storage(64 * 8);
  EmbeddingGrad eg(100, 8, 64, false, storage.data());
  std::vector<Batch> chunks = {tokens_batch({1, 100})};
  EXPECT_THROW(eg.set_rows(chunks), Error);
  // Tied tables (every row touched) check the ids too: the gather relies on it.
  std::vector<float> dense_storage(100 * 8);
  EmbeddingGrad dense(100, 8, 64, true, dense_storage.data());
  EXPECT_THROW(dense.set_rows(chunks), Error);
}
