// Shared by the attention GPU tests (our kernels, cuDNN's): a case of packed sequences, its
// name, and a column block of a dense matrix (q, k, v out of a fused qkv).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

namespace sf::test {

struct AttnCase {
  int Hq, Hkv, D;
  std::vector<int32_t> lens;  // packed sequences
};

inline std::string attn_case_name(const char* what, const AttnCase& c) {
  std::string s = cat(what, " Hq", c.Hq, " Hkv", c.Hkv, " D", c.D, " seqs");
  for (int l : c.lens) s += cat(" ", l);
  return s;
}

// Columns [c0, c0 + n) of a dense [T, W] matrix.
inline std::vector<float> cols(const std::vector<float>& m, int64_t T, int64_t W, int64_t c0, int64_t n) {
  std::vector<float> r(size_t(T * n));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < n; ++j) r[size_t(t * n + j)] = m[size_t(t * W + c0 + j)];
  return r;
}

}  // namespace sf::test
