// HostBackend::attention_decode against attention_forward: the decode of a whole sequence at
// once, and of each token alone over the cache of the ones before it, give attention_forward's
// rows bit for bit (the same arithmetic, in the same order), for GQA and plain MHA shapes and
// a strided cache.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "backend/host/host_backend.h"
#include "test_util.h"

namespace sf {
namespace {

struct DecodeCase {
  int heads, kv_heads, head_dim;
  int64_t T;
};

class HostAttentionDecode : public ::testing::TestWithParam<DecodeCase> {};

TEST_P(HostAttentionDecode, EqualsTheForwardRowsExactly) {
  const DecodeCase c = GetParam();
  SCOPED_TRACE(testing::Message() << "heads " << c.heads << "/" << c.kv_heads << " D "
                                  << c.head_dim << " T " << c.T);
  HostBackend be;
  Stream& s = be.default_stream();
  const int64_t Q = int64_t(c.heads) * c.head_dim, KV = int64_t(c.kv_heads) * c.head_dim;
  std::vector<float> q = test::random_vec(size_t(c.T * Q), 1);
  // The cache is a column block of a wider buffer (row stride 3 KV), with rows past T.
  const int64_t cache_rows = c.T + 5, ld = 3 * KV;
  std::vector<float> kbuf = test::random_vec(size_t(cache_rows * ld), 2);
  std::vector<float> vbuf = test::random_vec(size_t(cache_rows * ld), 3);
  const Mat k(kbuf.data() + KV, DType::f32, cache_rows, KV, ld);
  const Mat v(vbuf.data() + KV, DType::f32, cache_rows, KV, ld);
  // attention_forward wants contiguous k, v of exactly T rows.
  std::vector<float> kc(size_t(c.T * KV)), vc(size_t(c.T * KV));
  for (int64_t t = 0; t < c.T; ++t) {
    std::memcpy(&kc[size_t(t * KV)], k.ptr(t, 0), size_t(KV) * 4);
    std::memcpy(&vc[size_t(t * KV)], v.ptr(t, 0), size_t(KV) * 4);
  }
  AttentionShape sh{c.heads, c.kv_heads, c.head_dim, 0.37f, 1, int(c.T)};
  const int32_t cu[2] = {0, int32_t(c.T)};
  std::vector<float> ref(size_t(c.T * Q)), lse(size_t(c.heads * c.T));
  be.attention_forward(s, Mat(ref.data(), DType::f32, c.T, Q), lse.data(),
                       Mat(q.data(), DType::f32, c.T, Q), Mat(kc.data(), DType::f32, c.T, KV),
                       Mat(vc.data(), DType::f32, c.T, KV), sh, cu);

  std::vector<float> all(size_t(c.T * Q), -7.f);
  be.attention_decode(s, Mat(all.data(), DType::f32, c.T, Q), Mat(q.data(), DType::f32, c.T, Q),
                      k, v, sh, c.T);
  EXPECT_EQ(0, std::memcmp(all.data(), ref.data(), all.size() * 4)) << "whole sequence";

  for (int64_t i = 0; i < c.T; ++i) {
    std::vector<float> row(size_t(Q) + 2, -7.f);  // + 2 guard elements
    be.attention_decode(s, Mat(row.data(), DType::f32, 1, Q),
                        Mat(q.data() + i * Q, DType::f32, 1, Q), k, v, sh, i + 1);
    EXPECT_EQ(0, std::memcmp(row.data(), &ref[size_t(i * Q)], size_t(Q) * 4)) << "token " << i;
    EXPECT_EQ(row[size_t(Q)], -7.f) << "guard after the output row";
  }
  // Two new tokens at an offset: rows T-2, T-1 of the forward.
  std::vector<float> two(size_t(2 * Q));
  be.attention_decode(s, Mat(two.data(), DType::f32, 2, Q),
                      Mat(q.data() + (c.T - 2) * Q, DType::f32, 2, Q), k, v, sh, c.T);
  EXPECT_EQ(0, std::memcmp(two.data(), &ref[size_t((c.T - 2) * Q)], two.size() * 4));
}

INSTANTIATE_TEST_SUITE_P(Shapes, HostAttentionDecode,
                         ::testing::Values(DecodeCase{4, 2, 16, 13}, DecodeCase{3, 3, 8, 22},
                                           DecodeCase{6, 1, 32, 9}));

TEST(HostAttentionDecodeChecks, RefusesAKvLenPastTheCache) {
  HostBackend be;
  std::vector<float> q(16), k(4 * 16), v(4 * 16), out(16);
  AttentionShape sh{2, 2, 8, 1.f, 1, 1};
  EXPECT_THROW(be.attention_decode(be.default_stream(), Mat(out.data(), DType::f32, 1, 16),
                                   Mat(q.data(), DType::f32, 1, 16),
                                   Mat(k.data(), DType::f32, 4, 16),
                                   Mat(v.data(), DType::f32, 4, 16), sh, 5),
               Error);
}

}  // namespace
}  // namespace sf
