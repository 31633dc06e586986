// Several --data files (data/mixed_source.h through open_data_source): the FILE:WEIGHT syntax
// and its refusals, rows drawn in proportion to the weights and deterministic with the seed, a
// resume mid-epoch from the stream's JSON state giving the same batches, every file's held-out
// batches, and an identity that covers every file.
#include <gtest/gtest.h>

#include <set>

#include "core/error.h"
#include "data/data_source.h"
#include "dataset_test_util.h"

namespace sf::test {
namespace {

namespace fs = std::filesystem;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// n {"text"} lines whose words say which file they come from ("alpha 3 ...").
fs::path text_file(const fs::path& p, const std::string& word, int n) {
  std::string s;
  for (int i = 0; i < n; ++i)
    s += "{\"text\": \"" + word + " " + std::to_string(i) + " " + word + " again\"}\n";
  write_file(p, s);
  return p;
}

DataRequest mix_request(const std::string& spec, uint64_t seed = 3) {
  DataRequest r;
  r.path = spec;
  r.seq_len = 16;
  r.eval_fraction = 0.1;
  r.eval_batches = 1;
  r.eval_rows = 2;
  r.seed = seed;
  r.shuffle = true;
  r.tokenizer_dir = source_dir() / "tests/data/tokenizers/gpt2";
  r.vocab_size = 50257;
  return r;
}

TEST(MixedSource, WeightSyntax) {
  TempDir tmp("sf-mixw");
  const fs::path a = text_file(tmp.path / "a.jsonl", "alpha", 4);
  auto in = parse_data_inputs(join_data_values({a.string(), "b.jsonl"}));
  ASSERT_EQ(in.size(), 2u);
  EXPECT_EQ(in[0].path, a);
  EXPECT_EQ(in[0].weight, 0);
  in = parse_data_inputs(join_data_values({"a.jsonl:3", "b.jsonl:0.25"}));
  EXPECT_EQ(in[0].path, "a.jsonl");
  EXPECT_EQ(in[0].weight, 3);
  EXPECT_EQ(in[1].weight, 0.25);
  // A file whose own name ends in ":2" is that file.
  const fs::path odd = text_file(tmp.path / "odd:2", "odd", 2);
  EXPECT_EQ(parse_data_inputs(odd.string())[0].path, odd);
  EXPECT_NE(error_of([] { parse_data_inputs(join_data_values({"a.jsonl:0", "b.jsonl:1"})); })
                .find("the mixing weight 0 must be a positive number"), std::string::npos);
  EXPECT_NE(error_of([] { parse_data_inputs(join_data_values({"a.jsonl:2", "b.jsonl"})); })
                .find("give every file a weight"), std::string::npos);
  EXPECT_NE(error_of([] { parse_data_inputs("a.jsonl:2"); }).find("needs two or more --data files"),
            std::string::npos);
}

TEST(MixedSource, ProportionalDeterministicAndResumable) {
  TempDir tmp("sf-mix");
  const fs::path a = text_file(tmp.path / "a.jsonl", "alpha", 40);
  const fs::path b = text_file(tmp.path / "b.jsonl", "beta", 40);
  const fs::path t = make_tokens(tmp.path / "c.bin", 2000, 50);  // ids below 50: not "alpha"
  const std::string spec = join_data_values({a.string() + ":3", b.string() + ":1", t.string() + ":1"});
  DataSource m = open_data_source(mix_request(spec));
  EXPECT_NE(m.description.find("mix of 3 files:\n  60.0% of rows: " + a.string()), std::string::npos)
      << m.description;
  EXPECT_EQ(m.identity["kind"], "mix");
  ASSERT_EQ(m.identity["files"].size(), 3u);
  EXPECT_EQ(m.eval.size(), 3u);  // one held-out batch per file

  // The first batches, then rows one at a time: each from a file in proportion to the weights
  // (400 rows: 240 / 80 / 80 expected).
  std::vector<Batch> first;
  for (int i = 0; i < 10; ++i) first.push_back(m.train->next(4));
  const Tokenizer gpt2 = Tokenizer::load(source_dir() / "tests/data/tokenizers/gpt2");
  const int32_t alpha = gpt2.encode("alpha")[0], beta = gpt2.encode("beta")[0];
  int n_a = 0, n_b = 0, n_t = 0;
  for (int i = 0; i < 400; ++i) {
    const int32_t f = m.train->next(1).tokens[0];
    (f == alpha ? n_a : f == beta ? n_b : n_t)++;
  }
  EXPECT_NEAR(n_a, 240, 40);
  EXPECT_NEAR(n_b, 80, 30);
  EXPECT_NEAR(n_t, 80, 30);

  // The same seed gives the same batches; another seed another order.
  DataSource m2 = open_data_source(mix_request(spec));
  DataSource m3 = open_data_source(mix_request(spec, 4));
  bool differs = false;
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(m2.train->next(4).tokens, first[size_t(i)].tokens) << i;
    differs |= m3.train->next(4).tokens != first[size_t(i)].tokens;
  }
  EXPECT_TRUE(differs);

  // Resume mid-epoch from the JSON state (through a dump, as a checkpoint stores it).
  const std::string state = m2.train->state().dump();
  std::vector<Batch> want;
  for (int i = 0; i < 30; ++i) want.push_back(m2.train->next(4));  // crosses epochs of a and b
  DataSource resumed = open_data_source(mix_request(spec));
  EXPECT_EQ(data_identity_mismatch(m.identity, resumed.identity), "");
  resumed.train->restore(nlohmann::json::parse(state));
  for (int i = 0; i < 30; ++i) {
    const Batch got = resumed.train->next(4);
    EXPECT_EQ(got.tokens, want[size_t(i)].tokens) << i;
    EXPECT_EQ(got.labels, want[size_t(i)].labels) << i;
    EXPECT_EQ(got.cu_seqlens, want[size_t(i)].cu_seqlens) << i;
  }
  EXPECT_GE(m2.train->epoch(), 1);

  // The identity covers every file and the weights; a moved file is fine.
  const std::string other = join_data_values({a.string() + ":3", b.string() + ":2", t.string() + ":1"});
  EXPECT_NE(data_identity_mismatch(m.identity, open_data_source(mix_request(other)).identity), "");
  text_file(b, "beta", 41);
  const std::string why = data_identity_mismatch(m.identity, open_data_source(mix_request(spec)).identity);
  EXPECT_NE(why.find("--data file 2: "), std::string::npos) << why;
  text_file(b, "beta", 40);
  fs::rename(t, tmp.path / "moved.bin");
  const std::string moved = join_data_values({a.string() + ":3", b.string() + ":1",
                                              (tmp.path / "moved.bin").string() + ":1"});
  EXPECT_EQ(data_identity_mismatch(m.identity, open_data_source(mix_request(moved)).identity), "");
  EXPECT_NE(error_of([&] { m.train->restore(nlohmann::json{{"epoch", 0}, {"row", 0}}); })
                .find("is not that of a mix of 3 files"), std::string::npos);
}

TEST(MixedSource, UnweightedFilesWeighTheirTokens) {
  TempDir tmp("sf-mixu");
  const fs::path a = text_file(tmp.path / "a.jsonl", "alpha", 60);
  const fs::path b = text_file(tmp.path / "b.jsonl", "beta", 20);
  DataSource m = open_data_source(mix_request(join_data_values({a.string(), b.string()})));
  // a holds 3x the samples of b (of about the same length): about 75% of the rows.
  const size_t at = m.description.find("\n  ");
  ASSERT_NE(at, std::string::npos) << m.description;
  EXPECT_NEAR(std::stod(m.description.substr(at + 3)), 75.0, 3.0) << m.description;
  EXPECT_NE(m.description.find("% of rows: " + a.string()), std::string::npos) << m.description;
  DataRequest r = mix_request(join_data_values({a.string(), b.string()}));
  r.eval_file = a;
  EXPECT_NE(error_of([&] { open_data_source(r); }).find("--eval-file"), std::string::npos);
}

}  // namespace
}  // namespace sf::test
