// HostBackend attention_decode: causal GQA of the q_len newest tokens of one sequence over its
// KV cache (backend.h has the contract). out [q_len, Hq*D] overwrite.
// The arithmetic is attention_forward's, step for step (fp32 scores with dot_f, the max
// subtracted, the denominator summed in double), so decoding a sequence through the cache
// gives the same bits as the training forward over the whole sequence: the KV-cache tests
// can then compare the two exactly on the host.
// Tasks are (new token, head), each owning one output row block: no dependence on threads.
#include <cmath>
#include <limits>
#include <vector>

#include "backend/host/host_backend.h"
#include "core/thread_pool.h"

namespace sf {

using namespace host_detail;

namespace {

void check_decode(const Mat& out, const Mat& q, const Mat& k, const Mat& v,
                  const AttentionShape& sh, int64_t kv_len) {
  const char* op = "attention_decode";
  SF_CHECK(sh.n_heads > 0 && sh.n_kv_heads > 0 && sh.n_heads % sh.n_kv_heads == 0 &&
               sh.head_dim > 0,
           "host ", op, ": bad shape n_heads ", sh.n_heads, ", n_kv_heads ", sh.n_kv_heads,
           ", head_dim ", sh.head_dim, " (n_heads must be a multiple of n_kv_heads)");
  for (const Mat* m : {&out, &q, &k, &v}) check_f32(*m, op, "out/q/k_cache/v_cache");
  const int64_t qd = int64_t(sh.n_heads) * sh.head_dim, kvd = int64_t(sh.n_kv_heads) * sh.head_dim;
  check_shape(q, q.rows, qd, op, "q");
  check_shape(out, q.rows, qd, op, "out");
  SF_CHECK(k.cols == kvd && v.cols == kvd, "host ", op, ": k_cache/v_cache must have ", kvd,
           " columns, got ", k.cols, " and ", v.cols);
  SF_CHECK(kv_len >= q.rows && kv_len <= k.rows && kv_len <= v.rows, "host ", op, ": kv_len ",
           kv_len, " must hold the ", q.rows, " new tokens and fit the cache of ",
           std::min(k.rows, v.rows), " rows");
}

}  // namespace

void HostBackend::attention_decode(Stream&, Mat out, Mat q, Mat k, Mat v,
                                   const AttentionShape& sh, int64_t kv_len) {
  check_decode(out, q, k, v, sh, kv_len);
  const int64_t n_new = q.rows, D = sh.head_dim, past = kv_len - n_new;
  const int rep = sh.n_heads / sh.n_kv_heads;
  const float scale = sh.scale;
  host_pool().run_tasks(n_new * sh.n_heads, [&](int64_t task) {
    const int64_t i = task / sh.n_heads;
    const int h = int(task % sh.n_heads), g = h / rep;
    const int64_t len = past + i + 1;  // cache rows this token sees
    std::vector<float> sc(static_cast<size_t>(len)), acc(static_cast<size_t>(D), 0.f);
    const float* qr = frow(q, i) + h * D;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < len; ++j) {
      sc[size_t(j)] = scale * dot_f(qr, frow(k, j) + g * D, D);
      m = std::max(m, sc[size_t(j)]);
    }
    double l = 0;
    for (int64_t j = 0; j < len; ++j) {
      const float p = std::exp(sc[size_t(j)] - m);
      l += p;
      const float* vr = frow(v, j) + g * D;
      for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += p * vr[d];
    }
    const float inv_l = float(1.0 / l);
    float* o = frow(out, i) + h * D;
    for (int64_t d = 0; d < D; ++d) o[d] = acc[size_t(d)] * inv_l;
  });
}

}  // namespace sf
