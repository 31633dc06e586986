#include "data/token_file_source.h"

#include <algorithm>
#include <memory>
#include <sstream>

#include "core/error.h"
#include "data/data_file_kind.h"

namespace sf {

namespace fs = std::filesystem;

TokenBatcher::TokenBatcher(const TokenFile& f, int64_t begin, int64_t end, int seq_len)
    : f_(f), begin_(begin), end_(end), seq_len_(seq_len), pos_(begin) {
  SF_REQUIRE(seq_len > 0, "--seq-len must be positive");
  SF_REQUIRE(end - begin >= seq_len + 1, f.path().string(), ": ", end - begin,
             " tokens are too few for one row of --seq-len ", seq_len,
             "; use a shorter --seq-len or more data");
}

Batch TokenBatcher::next(int n_rows) {
  Batch b;
  b.cu_seqlens.push_back(0);
  for (int r = 0; r < n_rows; ++r) {
    if (pos_ + seq_len_ + 1 > end_) {
      pos_ = begin_;
      ++epoch_;
    }
    for (int i = 0; i < seq_len_; ++i) {
      b.tokens.push_back(int32_t(f_[pos_ + i]));
      b.labels.push_back(int32_t(f_[pos_ + i + 1]));
      b.positions.push_back(i);
    }
    b.cu_seqlens.push_back(int32_t(b.tokens.size()));
    pos_ += seq_len_;
  }
  return b;
}

void TokenBatcher::seek(int64_t position, int64_t epoch) {
  SF_REQUIRE(position >= begin_ && position < end_, "resume position ", position,
             " is outside the data range [", begin_, ", ", end_,
             "); the checkpoint was made with other data");
  pos_ = position;
  epoch_ = epoch;
}

namespace {

// FNV-1a over the token count and up to 2^20 tokens spread evenly over the file: cheap on a
// multi-GB file, and any other data (re-tokenized, reordered, cut) almost surely differs.
std::string token_fingerprint(const TokenFile& f) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t x) {
    for (int i = 0; i < 8; ++i) {
      h ^= (x >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  const int64_t n = f.size();
  mix(uint64_t(n));
  const int64_t samples = std::min<int64_t>(n, int64_t(1) << 20);
  for (int64_t i = 0; i < samples; ++i) mix(f[samples == n ? i : i * (n / samples)]);
  std::ostringstream os;
  os << std::hex << h;
  return os.str();
}

class TokenStream final : public TrainStream {
 public:
  TokenStream(std::shared_ptr<const TokenFile> f, int64_t end, int seq_len)
      : f_(std::move(f)), b_(*f_, 0, end, seq_len), seq_len_(seq_len) {}

  Batch next(int n_rows) override { return b_.next(n_rows); }
  int64_t epoch() const override { return b_.epoch(); }
  double epoch_fraction() const override {
    return double(b_.position() / seq_len_) / double(std::max<int64_t>(1, b_.rows_per_epoch()));
  }
  nlohmann::json state() const override {
    return {{"position", b_.position()}, {"epoch", b_.epoch()}};
  }
  int64_t rows_left_in_epoch() const override {
    return b_.rows_per_epoch() - b_.position() / seq_len_;
  }
  void restore(const nlohmann::json& s) override {
    SF_REQUIRE(s.is_object() && s.contains("position") && s.contains("epoch"),
               "the checkpoint's data state ", s.dump(), " lacks position/epoch");
    b_.seek(s.at("position").get<int64_t>(), s.at("epoch").get<int64_t>());
  }

 private:
  std::shared_ptr<const TokenFile> f_;  // outlives b_, which holds a reference
  TokenBatcher b_;
  int seq_len_;
};

// The rows of TokenStream (row r covers tokens [r * seq_len, r * seq_len + seq_len + 1)) in a
// fresh seeded permutation every epoch (Fisher-Yates with SplitMix64 seeded by seed and
// epoch), so that a few hundred steps already see the whole file. State: epoch and the index
// into the epoch's permutation.
class ShuffledTokenStream final : public TrainStream {
 public:
  ShuffledTokenStream(std::shared_ptr<const TokenFile> f, int64_t end, int seq_len, uint64_t seed)
      : f_(std::move(f)), seq_len_(seq_len), n_rows_((end - 1) / seq_len), seed_(seed) {
    shuffle();
  }

  Batch next(int n_rows) override {
    Batch b;
    b.cu_seqlens.push_back(0);
    for (int r = 0; r < n_rows; ++r) {
      if (row_ == n_rows_) {
        ++epoch_;
        row_ = 0;
        shuffle();
      }
      const int64_t p = order_[size_t(row_++)] * seq_len_;
      for (int i = 0; i < seq_len_; ++i) {
        b.tokens.push_back(int32_t((*f_)[p + i]));
        b.labels.push_back(int32_t((*f_)[p + i + 1]));
        b.positions.push_back(i);
      }
      b.cu_seqlens.push_back(int32_t(b.tokens.size()));
    }
    return b;
  }
  int64_t epoch() const override { return epoch_; }
  double epoch_fraction() const override { return double(row_) / double(n_rows_); }
  int64_t rows_left_in_epoch() const override { return n_rows_ - row_; }
  nlohmann::json state() const override {
    return {{"epoch", epoch_}, {"row", row_}, {"shuffle_seed", seed_}};
  }
  void restore(const nlohmann::json& s) override {
    SF_REQUIRE(s.is_object() && s.contains("epoch") && s.contains("row"),
               "the checkpoint's data state ", s.dump(), " lacks epoch/row");
    const int64_t row = s.at("row").get<int64_t>();
    SF_REQUIRE(row >= 0 && row <= n_rows_, "the checkpoint's data row ", row,
               " is outside this data's ", n_rows_, " rows; the checkpoint was made with other data");
    epoch_ = s.at("epoch").get<int64_t>();
    row_ = row;
    shuffle();
  }

 private:
  void shuffle() {
    order_.resize(size_t(n_rows_));
    for (int64_t i = 0; i < n_rows_; ++i) order_[size_t(i)] = i;
    uint64_t st = seed_ ^ (0x9e3779b97f4a7c15ull * uint64_t(epoch_ + 1));
    auto next = [&st] {
      uint64_t z = (st += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      return z ^ (z >> 31);
    };
    for (int64_t i = n_rows_ - 1; i > 0; --i)
      std::swap(order_[size_t(i)], order_[size_t(next() % uint64_t(i + 1))]);
  }

  std::shared_ptr<const TokenFile> f_;
  int seq_len_;
  int64_t n_rows_;
  uint64_t seed_;
  int64_t epoch_ = 0, row_ = 0;
  std::vector<int64_t> order_;
};

}  // namespace

DataSource open_token_file_source(const DataRequest& r) {
  {
    SF_REQUIRE(r.format == "auto" || r.format == "tokens", "--data-format ", r.format,
               " does not read a token file (", r.path.string(), "); use auto or tokens");
    SF_REQUIRE(r.eval_file.empty(), "--eval-file ", r.eval_file.string(),
               " needs a JSONL training dataset; a token file (", r.path.string(),
               ") holds out its tail instead (--eval-fraction)");
  }
  auto f = std::make_shared<const TokenFile>(r.path);
  SF_REQUIRE(r.vocab_size <= 0 || int64_t(f->max_id()) < r.vocab_size, r.path.string(),
             ": holds token id ", f->max_id(), " but the model's vocab_size is ", r.vocab_size,
             "; the tokens were made with another tokenizer",
             has_llmc_header(r.path) ? "" : " (or this raw file is not token ids at all)");
  const int64_t n = f->size();
  int64_t n_eval = int64_t(double(n) * r.eval_fraction);
  if (n_eval > 0 && n_eval < r.seq_len + 1) n_eval = 0;  // too little to evaluate on
  SF_REQUIRE(n - n_eval >= r.seq_len + 1, r.path.string(), ": ", n - n_eval,
             " training tokens are too few for one row of --seq-len ", r.seq_len,
             "; use a shorter --seq-len, a smaller --eval-fraction or more data");

  DataSource d;
  d.train_tokens = n - n_eval;
  d.eval_tokens = n_eval;
  if (n_eval > 0) {
    TokenBatcher eb(*f, n - n_eval, n, r.seq_len);
    const int64_t avail = eb.rows_per_epoch();
    const int rows = int(std::min<int64_t>(std::max(1, r.eval_rows), avail));
    const int64_t nb = std::max<int64_t>(1, std::min<int64_t>(r.eval_batches, avail / rows));
    for (int64_t i = 0; i < nb; ++i) d.eval.push_back(eb.next(rows));
  }
  std::error_code ec;
  fs::path abs = fs::absolute(r.path, ec);
  d.identity = {{"kind", "tokens"},
                {"path", (ec ? r.path : abs).lexically_normal().string()},
                {"file_bytes", uint64_t(fs::file_size(r.path))},
                {"tokens", n},
                {"fingerprint", token_fingerprint(*f)},
                {"train_tokens", d.train_tokens},
                {"eval_tokens", d.eval_tokens},
                {"seq_len", r.seq_len}};
  std::ostringstream os;
  os << r.path.string() << ": " << d.train_tokens << " training tokens, " << n_eval
     << " held out";
  d.description = os.str();
  if (r.shuffle)
    d.train = std::make_unique<ShuffledTokenStream>(f, n - n_eval, r.seq_len, r.seed);
  else
    d.train = std::make_unique<TokenStream>(f, n - n_eval, r.seq_len);
  return d;
}

}  // namespace sf
