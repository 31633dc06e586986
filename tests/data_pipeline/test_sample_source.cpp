// open_dataset_source: the trainer's DataSource over a JSONL dataset (stream, JSON resume
// state through the TrainStream interface, eval batches, identity checked on resume).
#include <gtest/gtest.h>

#include "core/error.h"
#include "data/sample_source.h"
#include "dataset_test_util.h"

namespace sf {
namespace {

TEST(DatasetSource, JsonlThroughTheTrainerInterface) {
  auto tok = test::vector_tokenizer("llama");
  test::TempDir dir("sf-dsrc");
  std::string lines;
  for (int i = 0; i < 60; ++i)
    lines += "{\"prompt\": \"Q" + std::to_string(i) + ":\", \"completion\": \" answer " +
             std::to_string(i * 3) + "\"}\n";
  const auto f = dir.path / "d.jsonl";
  test::write_file(f, lines);
  EXPECT_TRUE(is_dataset_file(f));
  EXPECT_FALSE(is_dataset_file(dir.path / "d.bin"));
  EXPECT_TRUE(is_dataset_file(dir.path / "d.txt", "messages"));
  DataRequest r;
  r.path = f;
  r.seq_len = 32;
  r.eval_fraction = 0.1;
  r.eval_batches = 2;
  r.eval_rows = 2;
  r.vocab_size = tok->vocab_size();
  r.seed = 5;
  DatasetSourceOptions o;
  DataSource a = open_dataset_source(r, &*tok, o);
  EXPECT_FALSE(a.eval.empty());
  EXPECT_LE(a.eval.size(), 2u);
  EXPECT_GT(a.train_tokens, 0);
  EXPECT_NE(a.description.find("prompt_completion"), std::string::npos) << a.description;
  for (int i = 0; i < 5; ++i) a.train->next(4);
  const nlohmann::json st = a.train->state();
  std::vector<Batch> want;
  for (int i = 0; i < 6; ++i) want.push_back(a.train->next(4));
  DataSource b = open_dataset_source(r, &*tok, o);
  EXPECT_EQ(data_identity_mismatch(a.identity, b.identity), "");
  b.train->restore(st);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(b.train->next(4).tokens, want[size_t(i)].tokens);
  // Other data: the identity says so.
  test::write_file(f, lines + "{\"prompt\": \"extra\", \"completion\": \" line\"}\n");
  DataSource c = open_dataset_source(r, &*tok, o);
  EXPECT_NE(data_identity_mismatch(a.identity, c.identity), "");
  // A vocabulary too small for the data.
  r.vocab_size = 100;
  EXPECT_THROW(open_dataset_source(r, &*tok, o), Error);
}

}  // namespace
}  // namespace sf
