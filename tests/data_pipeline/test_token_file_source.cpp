// The token-file DataSource (data/token_file_source.h): the token batcher's wrap-around, the
// held-out tail, resume, shuffling and the vocabulary check.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "data/data_source.h"
#include "data/token_file_source.h"
#include "dataset_test_util.h"

namespace sf::test {
namespace {

// ---- data --------------------------------------------------------------------------------------

TEST(TokenBatcher, WrapsAroundAndCountsEpochs) {
  TempDir tmp("sf-batcher");
  std::vector<uint32_t> ids(50);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = uint32_t(i);
  write_token_file(tmp.path / "t.bin", ids.data(), 50);
  TokenFile f(tmp.path / "t.bin");
  // Range [5, 45): 40 tokens; rows of 8 need 9 tokens: rows start at 5, 13, 21, 29 (the one at
  // 37 would need token 45, outside the range) -> 4 rows per epoch.
  TokenBatcher b(f, 5, 45, 8);
  EXPECT_EQ(b.rows_per_epoch(), 4);
  Batch x = b.next(3);
  ASSERT_EQ(x.n_tokens(), 24);
  EXPECT_EQ(x.tokens[0], 5);
  EXPECT_EQ(x.labels[0], 6);
  EXPECT_EQ(x.labels[7], 13);  // the last label of a row is the next row's first token
  EXPECT_EQ(x.tokens[8], 13);
  EXPECT_EQ(x.positions[8], 0);
  EXPECT_EQ(x.cu_seqlens, (std::vector<int32_t>{0, 8, 16, 24}));
  EXPECT_EQ(b.epoch(), 0);
  Batch y = b.next(2);  // row at 29, then wrap to 5
  EXPECT_EQ(y.tokens[0], 29);
  EXPECT_EQ(y.labels[7], 37);
  EXPECT_EQ(y.tokens[8], 5);
  EXPECT_EQ(b.epoch(), 1);
  EXPECT_EQ(b.position(), 13);
  // seek restores exactly; positions outside the range are refused.
  TokenBatcher c(f, 5, 45, 8);
  c.seek(b.position(), b.epoch());
  EXPECT_EQ(c.next(4).tokens, b.next(4).tokens);
  EXPECT_THROW(c.seek(45, 0), Error);
  EXPECT_THROW(TokenBatcher(f, 0, 8, 8), Error);  // too short for one row
}

TEST(DataSource, SplitsHeldOutTailAndRestoresItsPosition) {
  TempDir tmp("sf-data");
  auto p = make_tokens(tmp.path / "t.bin", 1000);
  DataRequest r;
  r.path = p;
  r.seq_len = 16;
  r.eval_fraction = 0.1;
  r.eval_batches = 3;
  r.eval_rows = 2;
  r.vocab_size = 53;
  DataSource d = open_data_source(r);
  EXPECT_EQ(d.train_tokens, 900);
  EXPECT_EQ(d.eval_tokens, 100);
  ASSERT_EQ(d.eval.size(), 3u);  // 100 tokens: 6 rows of 16 -> 3 batches of 2
  TokenFile f(p);
  EXPECT_EQ(d.eval[0].tokens[0], int32_t(f[900]));
  Batch a = d.train->next(2);
  EXPECT_EQ(a.tokens[0], int32_t(f[0]));
  auto state = d.train->state();
  Batch b = d.train->next(2);
  DataSource e = open_data_source(r);
  e.train->restore(state);
  EXPECT_EQ(e.train->next(2).tokens, b.tokens);
  EXPECT_TRUE(data_identity_mismatch(d.identity, e.identity).empty());
  // Other content of the same size differs in the fingerprint.
  auto q = make_tokens(tmp.path / "u.bin", 1000, 53, 5);
  r.path = q;
  DataSource g = open_data_source(r);
  EXPECT_NE(data_identity_mismatch(d.identity, g.identity).find("fingerprint"), std::string::npos);
  // Shuffled: every epoch visits each of the 56 rows once, in a new order; restore is exact.
  r.shuffle = true;
  r.seed = 5;
  DataSource sh = open_data_source(r);
  auto row_starts = [&](DataSource& ds, int rows) {
    std::vector<int32_t> v;
    Batch b = ds.train->next(rows);
    for (int i = 0; i < rows; ++i) v.push_back(b.tokens[size_t(i) * 16]);
    return std::make_pair(v, b);
  };
  auto [e0, b0] = row_starts(sh, 56);
  EXPECT_EQ(sh.train->epoch(), 0);
  auto st0 = sh.train->state();
  auto [e1, b1] = row_starts(sh, 56);
  EXPECT_EQ(sh.train->epoch(), 1);
  EXPECT_NE(b0.tokens, b1.tokens);  // another order
  EXPECT_NE(b0.tokens, (Batch{}).tokens);
  auto sorted = [](std::vector<int32_t> t) { std::sort(t.begin(), t.end()); return t; };
  EXPECT_EQ(sorted(b0.tokens), sorted(b1.tokens));  // the same rows
  for (int i = 0; i + 1 < 56; ++i)  // labels are the next token within a row
    EXPECT_EQ(b0.labels[size_t(i) * 16 + 14], b0.tokens[size_t(i) * 16 + 15]);
  DataSource sh2 = open_data_source(r);
  sh2.train->restore(st0);
  EXPECT_EQ(sh2.train->next(56).tokens, b1.tokens);
  sh2.train->restore(sh.train->state());
  EXPECT_EQ(sh2.train->next(3).tokens, sh.train->next(3).tokens);
  r.shuffle = false;

  // Ids beyond the vocabulary are refused, naming the file.
  r.vocab_size = 20;
  try {
    open_data_source(r);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("u.bin"), std::string::npos);
  }
}

}  // namespace
}  // namespace sf::test
