// One batch of training tokens, flattened: T tokens made of packed sequences.
// Sequence s covers tokens [cu_seqlens[s], cu_seqlens[s+1]); positions restart at 0 in each
// sequence, and attention never crosses a sequence boundary. labels are already shifted:
// labels[t] is the token to predict at t, or kIgnoreLabel (-100) for no loss.
#pragma once
#include <cstdint>
#include <algorithm>
#include <vector>

#include "core/error.h"

namespace sf {

constexpr int32_t kIgnoreLabel = -100;

struct Batch {
  std::vector<int32_t> tokens;      // [T]
  std::vector<int32_t> labels;      // [T]
  std::vector<int32_t> positions;   // [T]
  std::vector<int32_t> cu_seqlens;  // [n_seqs + 1], cu_seqlens[0] = 0, back() = T

  int64_t n_tokens() const { return int64_t(tokens.size()); }
  int n_seqs() const { return int(cu_seqlens.size()) - 1; }
  int max_seqlen() const {
    int m = 0;
    for (size_t i = 0; i + 1 < cu_seqlens.size(); ++i)
      m = std::max(m, cu_seqlens[i + 1] - cu_seqlens[i]);
    return m;
  }
  int64_t n_valid_labels() const {
    int64_t n = 0;
    for (auto l : labels) n += l != kIgnoreLabel;
    return n;
  }
  // Rows of equal length `seq_len` cut from a token stream: labels are the next token,
  // the last position of each row has no label.
  static Batch from_rows(const std::vector<std::vector<int32_t>>& rows) {
    Batch b;
    b.cu_seqlens.push_back(0);
    for (auto& r : rows) {
      for (size_t i = 0; i < r.size(); ++i) {
        b.tokens.push_back(r[i]);
        b.labels.push_back(i + 1 < r.size() ? r[i + 1] : kIgnoreLabel);
        b.positions.push_back(int32_t(i));
      }
      b.cu_seqlens.push_back(int32_t(b.tokens.size()));
    }
    return b;
  }
  void validate(int64_t vocab_size) const {
    SF_CHECK(labels.size() == tokens.size() && positions.size() == tokens.size(),
             "batch arrays disagree in length");
    SF_CHECK(!cu_seqlens.empty() && cu_seqlens.front() == 0 && cu_seqlens.back() == n_tokens(),
             "batch cu_seqlens must run from 0 to the token count");
    for (auto t : tokens)
      SF_REQUIRE(t >= 0 && t < vocab_size, "token id ", t, " is outside the vocabulary (size ",
                 vocab_size, "); the data was tokenized for another model");
    for (auto l : labels)
      SF_REQUIRE(l == kIgnoreLabel || (l >= 0 && l < vocab_size), "label ", l,
                 " is outside the vocabulary (size ", vocab_size, ")");
  }
};

}  // namespace sf
