// The DataSource (data/data_source.h) of a pre-tokenized TokenFile (data/token_file.h): its tail
// held out for evaluation, its head cut into fixed-length rows, in order or shuffled per epoch.
//
// TokenBatcher cuts fixed-length training rows from a range of a TokenFile, in order (llm.c
// style): row r covers tokens [p, p + seq_len + 1): inputs are the first seq_len, labels the
// last seq_len. The next row starts seq_len later, so every token is predicted once per epoch.
// The position is part of the resume state.
#pragma once
#include <cstdint>

#include "data/data_source.h"
#include "data/token_file.h"
#include "model/batch.h"

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

// open_data_source() for a token file (not a JSONL dataset): refuses a JSON format or an
// eval_file, holds out round-down(eval_fraction * tokens) (none when that is under one row), and
// streams rows in order (TokenBatcher; state {"position","epoch"}) or, with r.shuffle, in a
// seeded permutation per epoch (state {"epoch","row","shuffle_seed"}). Error(input) naming the
// file on a token id outside r.vocab_size or too few tokens for one row.
DataSource open_token_file_source(const DataRequest& r);

}  // namespace sf
