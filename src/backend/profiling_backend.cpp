#include "backend/profiling_backend.h"

#include <algorithm>

#include "core/error.h"

namespace sf {

template <class F>
void ProfilingBackend::timed(Stream& s, std::string key, F&& fn) {
  Pending p{std::move(key), in_.create_timing_event(), in_.create_timing_event()};
  if (p.start) p.start->record(s);
  fn();
  if (p.end) p.end->record(s);
  pending_.push_back(std::move(p));
}

std::vector<ProfilingBackend::Line> ProfilingBackend::take() {
  for (Pending& p : pending_) {
    Line& l = lines_[p.key];
    l.op = p.key;
    ++l.calls;
    if (p.start && p.end) {
      p.end->synchronize();
      l.seconds += std::max(0.0, p.end->seconds_since(*p.start));
    }
  }
  pending_.clear();
  std::vector<Line> out;
  for (auto& [k, l] : lines_) out.push_back(l);
  lines_.clear();
  std::sort(out.begin(), out.end(), [](const Line& a, const Line& b) { return a.seconds > b.seconds; });
  return out;
}

namespace {
std::string shape(const Mat& m) { return cat(m.rows, "x", m.cols); }
}  // namespace

void ProfilingBackend::fill_zero(Stream& s, void* d, size_t n) {
  timed(s, "fill_zero", [&] { in_.fill_zero(s, d, n); });
}
void ProfilingBackend::gemm(Stream& s, Mat c, Mat a, Trans ta, Mat b, Trans tb, float alpha,
                            float beta) {
  // c[M,N] = op(a)[M,K] op(b)[K,N]
  const int64_t K = ta == Trans::no ? a.cols : a.rows;
  std::string key = cat("gemm ", c.rows, "x", c.cols, "x", K, ta == Trans::yes ? " aT" : "",
                        tb == Trans::yes ? " bT" : "", c.dtype != a.dtype ? cat(" ", dtype_name(c.dtype), "-out") : "",
                        beta != 0.f ? " +=" : "");
  timed(s, key, [&] { in_.gemm(s, c, a, ta, b, tb, alpha, beta); });
}
void ProfilingBackend::bias_add(Stream& s, Mat x, Mat bias) {
  timed(s, "bias_add", [&] { in_.bias_add(s, x, bias); });
}
void ProfilingBackend::bias_backward(Stream& s, Mat dbias, Mat dy) {
  timed(s, "bias_backward", [&] { in_.bias_backward(s, dbias, dy); });
}
void ProfilingBackend::embedding_forward(Stream& s, Mat out, const int32_t* ids, Mat table) {
  timed(s, "embedding_forward", [&] { in_.embedding_forward(s, out, ids, table); });
}
void ProfilingBackend::embedding_backward(Stream& s, Mat dtable, const int32_t* ids, Mat dout) {
  timed(s, "embedding_backward", [&] { in_.embedding_backward(s, dtable, ids, dout); });
}
void ProfilingBackend::rmsnorm_forward(Stream& s, Mat out, float* rstd, Mat x, Mat w, float eps) {
  timed(s, cat("rmsnorm_forward ", shape(x)), [&] { in_.rmsnorm_forward(s, out, rstd, x, w, eps); });
}
void ProfilingBackend::add_rmsnorm_forward(Stream& s, Mat sum, Mat out, float* rstd, Mat a, Mat b,
                                           Mat w, float eps) {
  timed(s, cat("add_rmsnorm_forward ", shape(a)),
        [&] { in_.add_rmsnorm_forward(s, sum, out, rstd, a, b, w, eps); });
}
void ProfilingBackend::rmsnorm_backward(Stream& s, Mat dx, Mat dw, Mat dout, Mat x, Mat w,
                                        const float* rstd, Mat dres) {
  timed(s, cat("rmsnorm_backward ", shape(x), dres.empty() ? "" : " +residual"),
        [&] { in_.rmsnorm_backward(s, dx, dw, dout, x, w, rstd, dres); });
}
void ProfilingBackend::rope_forward(Stream& s, Mat x, int h, int d, const int32_t* pos, const float* f) {
  timed(s, cat("rope_forward ", h, " heads"), [&] { in_.rope_forward(s, x, h, d, pos, f); });
}
void ProfilingBackend::rope_backward(Stream& s, Mat dx, int h, int d, const int32_t* pos, const float* f) {
  timed(s, cat("rope_backward ", h, " heads"), [&] { in_.rope_backward(s, dx, h, d, pos, f); });
}
void ProfilingBackend::attention_forward(Stream& s, Mat out, float* lse, Mat q, Mat k, Mat v,
                                         const AttentionShape& sh, const int32_t* cu) {
  timed(s, "attention_forward", [&] { in_.attention_forward(s, out, lse, q, k, v, sh, cu); });
}
void ProfilingBackend::attention_backward(Stream& s, Mat dq, Mat dk, Mat dv, Mat dout, Mat out,
                                          const float* lse, Mat q, Mat k, Mat v,
                                          const AttentionShape& sh, const int32_t* cu) {
  timed(s, "attention_backward",
        [&] { in_.attention_backward(s, dq, dk, dv, dout, out, lse, q, k, v, sh, cu); });
}
void ProfilingBackend::swiglu_forward(Stream& s, Mat out, Mat gate, Mat up) {
  timed(s, "swiglu_forward", [&] { in_.swiglu_forward(s, out, gate, up); });
}
void ProfilingBackend::swiglu_backward(Stream& s, Mat dgate, Mat dup, Mat dout, Mat gate, Mat up) {
  timed(s, "swiglu_backward", [&] { in_.swiglu_backward(s, dgate, dup, dout, gate, up); });
}
void ProfilingBackend::lm_head_loss(Stream& s, float* loss_sum, Mat dh, Mat dw, Mat h, Mat w,
                                    const int32_t* labels, float grad_scale, Mat scratch) {
  timed(s, "lm_head_loss", [&] { in_.lm_head_loss(s, loss_sum, dh, dw, h, w, labels, grad_scale, scratch); });
}
void ProfilingBackend::cast(Stream& s, Mat dst, Mat src) {
  timed(s, cat("cast ", dtype_name(src.dtype), "->", dtype_name(dst.dtype), " ", shape(src)),
        [&] { in_.cast(s, dst, src); });
}
void ProfilingBackend::axpy(Stream& s, Mat dst, Mat src, float alpha) {
  timed(s, cat("axpy ", shape(src)), [&] { in_.axpy(s, dst, src, alpha); });
}
void ProfilingBackend::sum_squares(Stream& s, float* out, Mat x) {
  timed(s, "sum_squares", [&] { in_.sum_squares(s, out, x); });
}
void ProfilingBackend::adamw(Stream& s, float* param, float* m, float* v, const float* grad,
                             void* w_out, int64_t n, const AdamWStep& step) {
  timed(s, "adamw", [&] { in_.adamw(s, param, m, v, grad, w_out, n, step); });
}

}  // namespace sf
