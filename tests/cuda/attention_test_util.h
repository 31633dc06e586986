// Shared by the attention GPU tests (our kernels, cuDNN's): a case of packed sequences, its
// name, and a column block of a dense matrix (q, k, v out of a fused qkv).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
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

// A case's packed layout: cu_seqlens, tokens, the q and kv widths and the fused qkv width
// (q | k | v), and its AttentionShape (scale 1 / sqrt(D)).
struct AttnLayout {
  std::vector<int32_t> cu;
  int64_t T, qd, kvd, W;
  AttentionShape sh;
};
inline AttnLayout attn_layout(const AttnCase& c) {
  AttnLayout l;
  l.cu = {0};
  for (int n : c.lens) l.cu.push_back(l.cu.back() + n);
  l.T = l.cu.back();
  l.qd = int64_t(c.Hq) * c.D;
  l.kvd = int64_t(c.Hkv) * c.D;
  l.W = l.qd + 2 * l.kvd;
  l.sh.n_heads = c.Hq;
  l.sh.n_kv_heads = c.Hkv;
  l.sh.head_dim = c.D;
  l.sh.scale = 1.f / std::sqrt(float(c.D));
  l.sh.n_seqs = int(c.lens.size());
  l.sh.max_seqlen = *std::max_element(c.lens.begin(), c.lens.end());
  return l;
}

// Columns [c0, c0 + n) of a dense [T, W] matrix.
inline std::vector<float> cols(const std::vector<float>& m, int64_t T, int64_t W, int64_t c0, int64_t n) {
  std::vector<float> r(size_t(T * n));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < n; ++j) r[size_t(t * n + j)] = m[size_t(t * W + c0 + j)];
  return r;
}

}  // namespace sf::test
