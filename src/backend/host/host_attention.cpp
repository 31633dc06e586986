// HostBackend causal grouped-query attention over packed sequences.
// attention_forward: out [T, Hq*D] overwrite, lse [Hq, T] overwrite (lse may be null when only
// out is wanted). attention_backward: dq, dk, dv overwrite.
// Query head h reads kv head h / (Hq / Hkv). Token t of sequence s (cu_seqlens[s] <= t <
// cu_seqlens[s+1]) attends to the tokens of s up to itself, never across sequences.
//   forward : p_j = softmax_j(scale * q.k_j), out = sum_j p_j v_j, lse = log sum_j exp(scale q.k_j)
//   backward: delta = dout.out; p_j = exp(scale q.k_j - lse); ds_j = p_j (dout.v_j - delta);
//             dq = scale sum_j ds_j k_j; dk_j += scale ds_j q; dv_j += p_j dout.
// fp32 throughout (dot products with eight fixed partial sums, see dot_f), except the softmax
// denominator, which is summed in double.
// Work is split into tasks (sequence, head) for the forward and (sequence, kv head) for the
// backward; each task owns disjoint output rows/columns and runs in a fixed order, so results
// never depend on the thread count. Memory per task: one score row and O(seq_len * D)
// accumulators, never a [T x T] matrix.
#include <cmath>
#include <limits>
#include <vector>

#include "backend/host/host_backend.h"
#include "core/thread_pool.h"

namespace sf {

using namespace host_detail;

namespace {

void check_attention(const Mat& q, const Mat& k, const Mat& v, const AttentionShape& sh,
                     const int32_t* cu, const char* op) {
  SF_CHECK(sh.n_heads > 0 && sh.n_kv_heads > 0 && sh.n_heads % sh.n_kv_heads == 0 &&
               sh.head_dim > 0,
           "host ", op, ": bad shape n_heads ", sh.n_heads, ", n_kv_heads ", sh.n_kv_heads,
           ", head_dim ", sh.head_dim, " (n_heads must be a multiple of n_kv_heads)");
  check_f32(q, op, "q");
  check_f32(k, op, "k");
  check_f32(v, op, "v");
  const int64_t T = q.rows;
  check_shape(q, T, int64_t(sh.n_heads) * sh.head_dim, op, "q");
  check_shape(k, T, int64_t(sh.n_kv_heads) * sh.head_dim, op, "k");
  check_shape(v, T, int64_t(sh.n_kv_heads) * sh.head_dim, op, "v");
  SF_CHECK(sh.n_seqs >= 1 && cu != nullptr, "host ", op, ": need cu_seqlens for n_seqs = ",
           sh.n_seqs);
  SF_CHECK(cu[0] == 0 && cu[sh.n_seqs] == T, "host ", op, ": cu_seqlens must run from 0 to T = ",
           T, ", got ", cu[0], " .. ", cu[sh.n_seqs]);
  for (int s = 0; s < sh.n_seqs; ++s)
    SF_CHECK(cu[s + 1] >= cu[s], "host ", op, ": cu_seqlens decreases at sequence ", s);
}

inline const float* at(const Mat& m, int64_t t, int64_t col) { return frow(m, t) + col; }

}  // namespace

void HostBackend::attention_forward(Stream&, Mat out, float* lse, Mat q, Mat k, Mat v,
                                    const AttentionShape& sh, const int32_t* cu) {
  check_attention(q, k, v, sh, cu, "attention_forward");
  check_f32(out, "attention_forward", "out");
  check_shape(out, q.rows, q.cols, "attention_forward", "out");
  const int64_t T = q.rows, D = sh.head_dim;
  const int rep = sh.n_heads / sh.n_kv_heads;
  const float scale = sh.scale;
  host_pool().run_tasks(int64_t(sh.n_seqs) * sh.n_heads, [&](int64_t task) {
    const int s = int(task / sh.n_heads), h = int(task % sh.n_heads), g = h / rep;
    const int64_t base = cu[s], len = cu[s + 1] - cu[s];
    std::vector<float> sc(static_cast<size_t>(len)), acc(static_cast<size_t>(D));
    for (int64_t i = 0; i < len; ++i) {
      const int64_t t = base + i;
      const float* qr = at(q, t, h * D);
      float m = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j <= i; ++j) {
        sc[size_t(j)] = scale * dot_f(qr, at(k, base + j, g * D), D);
        m = std::max(m, sc[size_t(j)]);
      }
      double l = 0;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = 0; j <= i; ++j) {
        const float p = std::exp(sc[size_t(j)] - m);
        l += p;
        const float* vr = at(v, base + j, g * D);
        for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += p * vr[d];
      }
      const float inv_l = float(1.0 / l);
      float* o = frow(out, t) + h * D;
      for (int64_t d = 0; d < D; ++d) o[d] = acc[size_t(d)] * inv_l;
      if (lse) lse[int64_t(h) * T + t] = float(double(m) + std::log(l));
    }
  });
}

void HostBackend::attention_backward(Stream&, Mat dq, Mat dk, Mat dv, Mat dout, Mat out,
                                     const float* lse, Mat q, Mat k, Mat v,
                                     const AttentionShape& sh, const int32_t* cu) {
  check_attention(q, k, v, sh, cu, "attention_backward");
  for (const Mat* m : {&dq, &dout, &out}) {
    check_f32(*m, "attention_backward", "dq/dout/out");
    check_shape(*m, q.rows, q.cols, "attention_backward", "dq/dout/out");
  }
  for (const Mat* m : {&dk, &dv}) {
    check_f32(*m, "attention_backward", "dk/dv");
    check_shape(*m, k.rows, k.cols, "attention_backward", "dk/dv");
  }
  SF_CHECK(lse != nullptr || q.rows == 0, "host attention_backward: lse is null");
  const int64_t T = q.rows, D = sh.head_dim;
  const int rep = sh.n_heads / sh.n_kv_heads;
  const float scale = sh.scale;
  host_pool().run_tasks(int64_t(sh.n_seqs) * sh.n_kv_heads, [&](int64_t task) {
    const int s = int(task / sh.n_kv_heads), g = int(task % sh.n_kv_heads);
    const int64_t base = cu[s], len = cu[s + 1] - cu[s];
    std::vector<float> dk_acc(static_cast<size_t>(len * D), 0.f);
    std::vector<float> dv_acc(static_cast<size_t>(len * D), 0.f);
    std::vector<float> dq_acc(static_cast<size_t>(D));
    for (int h = g * rep; h < (g + 1) * rep; ++h) {
      for (int64_t i = 0; i < len; ++i) {
        const int64_t t = base + i;
        const float* qr = at(q, t, h * D);
        const float* dor = at(dout, t, h * D);
        const float delta = dot_f(dor, at(out, t, h * D), D);
        const float l = lse[int64_t(h) * T + t];
        std::fill(dq_acc.begin(), dq_acc.end(), 0.f);
        for (int64_t j = 0; j <= i; ++j) {
          const float* kr = at(k, base + j, g * D);
          const float* vr = at(v, base + j, g * D);
          // The forward's score, bit for bit, so p matches the saved lse.
          const float p = std::exp(scale * dot_f(qr, kr, D) - l);
          const float ds = p * (dot_f(dor, vr, D) - delta);
          float* dka = &dk_acc[size_t(j * D)];
          float* dva = &dv_acc[size_t(j * D)];
          for (int64_t d = 0; d < D; ++d) {
            dq_acc[size_t(d)] += ds * kr[d];
            dka[d] += ds * qr[d];
            dva[d] += p * dor[d];
          }
        }
        float* dqr = frow(dq, t) + h * D;
        for (int64_t d = 0; d < D; ++d) dqr[d] = scale * dq_acc[size_t(d)];
      }
    }
    for (int64_t j = 0; j < len; ++j) {
      float* dkr = frow(dk, base + j) + g * D;
      float* dvr = frow(dv, base + j) + g * D;
      for (int64_t d = 0; d < D; ++d) {
        dkr[d] = scale * dk_acc[size_t(j * D + d)];
        dvr[d] = dv_acc[size_t(j * D + d)];
      }
    }
  });
}

}  // namespace sf
