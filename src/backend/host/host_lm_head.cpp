// HostBackend fused LM head + cross-entropy, chunked over tokens.
// For tokens [t0, t0+n), n = scratch.rows: logits = h W^T into scratch (gemm), then per row a
// stable logsumexp (max in f32, exp(z - max) in f32, their sum in double). loss_t = lse - logit[label] for labels
// != -100. loss_sum (accumulate) += the sum of all per-token losses, added in double in token
// order and rounded to f32 once, so it does not depend on the chunk size or thread count.
// Gradients (scaled by grad_scale, L = sum_t loss_t): the scratch row becomes
// grad_scale * (softmax - onehot(label)) (all zero for an ignored label), then
//   dh rows (overwrite) = row @ W   and   dw (f32, accumulate) += rows^T @ h   (gemm).
// Chunking changes only the fp32 rounding of dw's accumulation across chunks.
#include <cmath>
#include <vector>

#include "backend/host/host_backend.h"
#include "core/thread_pool.h"

namespace sf {

using namespace host_detail;

void HostBackend::lm_head_loss(Stream& s, float* loss_sum, Mat dh, Mat dw, Mat h, Mat w,
                               const int32_t* labels, float grad_scale, Mat scratch) {
  constexpr int32_t kIgnore = -100;
  check_f32(h, "lm_head_loss", "h");
  check_f32(w, "lm_head_loss", "w");
  check_f32(scratch, "lm_head_loss", "scratch");
  const int64_t T = h.rows, C = h.cols, V = w.rows;
  SF_CHECK(w.cols == C, "host lm_head_loss: w is [", V, ", ", w.cols, "], h has ", C,
           " columns");
  SF_CHECK(scratch.cols == V && scratch.rows >= 1, "host lm_head_loss: scratch is [",
           scratch.rows, ", ", scratch.cols, "], expected [chunk >= 1, vocab ", V, "]");
  SF_CHECK(loss_sum != nullptr, "host lm_head_loss: loss_sum is null");
  SF_CHECK(labels != nullptr || T == 0, "host lm_head_loss: labels is null");
  const bool want_dh = !dh.empty(), want_dw = !dw.empty(), want_grad = want_dh || want_dw;
  if (want_dh) {
    check_f32(dh, "lm_head_loss", "dh");
    check_shape(dh, T, C, "lm_head_loss", "dh");
  }
  if (want_dw) {
    check_f32(dw, "lm_head_loss", "dw");
    check_shape(dw, V, C, "lm_head_loss", "dw");
  }
  for (int64_t t = 0; t < T; ++t)
    SF_CHECK(labels[t] == kIgnore || (labels[t] >= 0 && labels[t] < V), "host lm_head_loss: label ",
             labels[t], " at token ", t, " is outside the vocabulary (", V, ")");

  std::vector<double> token_loss(size_t(T), 0.0);
  const int64_t chunk = scratch.rows;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t n = std::min(chunk, T - t0);
    Mat logits = scratch.row_block(0, n);
    Mat hc = h.row_block(t0, n);
    gemm(s, logits, hc, Trans::no, w, Trans::yes, 1.f, 0.f);
    host_pool().parallel_for(n, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* z = frow(logits, r);
        const int32_t label = labels[t0 + r];
        const bool ignored = label == kIgnore;
        float m = z[0];
        for (int64_t j = 1; j < V; ++j) m = std::max(m, z[j]);
        const double zl = ignored ? 0.0 : double(z[label]);
        double se = 0;
        if (want_grad && !ignored) {
          for (int64_t j = 0; j < V; ++j) {  // keep exp(z - m) for the softmax below
            const float e = std::exp(z[j] - m);
            z[j] = e;
            se += e;
          }
        } else {
          for (int64_t j = 0; j < V; ++j) se += std::exp(z[j] - m);
        }
        const double lse = double(m) + std::log(se);
        if (!ignored) token_loss[size_t(t0 + r)] = lse - zl;
        if (!want_grad) continue;
        if (ignored) {
          for (int64_t j = 0; j < V; ++j) z[j] = 0.f;
          continue;
        }
        const float f = float(double(grad_scale) / se);
        for (int64_t j = 0; j < V; ++j) z[j] *= f;
        // p_label - 1 in double: no cancellation when p_label is close to 1.
        z[label] = float(double(grad_scale) * (std::exp(zl - lse) - 1.0));
      }
    }, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, V)));
    if (want_dh) gemm(s, dh.row_block(t0, n), logits, Trans::no, w, Trans::no, 1.f, 0.f);
    if (want_dw) gemm(s, dw, logits, Trans::yes, hc, Trans::no, 1.f, 1.f);
  }
  double total = 0;
  for (double l : token_loss) total += l;
  *loss_sum = float(double(*loss_sum) + total);
}

}  // namespace sf
