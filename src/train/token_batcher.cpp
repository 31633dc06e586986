#include "train/token_batcher.h"

#include "core/error.h"

namespace sf {

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

}  // namespace sf
