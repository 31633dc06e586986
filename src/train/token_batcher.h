// Cuts fixed-length training rows from a range of a TokenFile, in order (llm.c style):
// row r covers tokens [p, p + seq_len + 1): inputs are the first seq_len, labels the last
// seq_len. The next row starts seq_len later, so every token is predicted once per epoch.
// The position is part of the resume state.
#pragma once
#include <cstdint>

#include "model/batch.h"
#include "train/token_file.h"

namespace sf {

class TokenBatcher {
 public:
  TokenBatcher(const TokenFile& f, int64_t begin, int64_t end, int seq_len);
  Batch next(int n_rows);  // wraps to `begin` (and counts an epoch) at the end of the range
  int64_t position() const { return pos_; }
  int64_t epoch() const { return epoch_; }
  void seek(int64_t position, int64_t epoch);
  int64_t rows_per_epoch() const { return (end_ - begin_ - 1) / seq_len_; }

 private:
  const TokenFile& f_;
  int64_t begin_, end_;
  int seq_len_;
  int64_t pos_, epoch_ = 0;
};

}  // namespace sf
