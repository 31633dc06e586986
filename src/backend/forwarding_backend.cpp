#include "backend/forwarding_backend.h"

#include "core/error.h"

namespace sf {

namespace {
std::string shape(const Mat& m) { return cat(m.rows, "x", m.cols); }
}  // namespace

// Every op's arguments are captured by value: a decorator may run the op later.

void ForwardingBackend::fill_zero(Stream& s, void* d, size_t n) {
  run_op(s, "fill_zero", [=](Backend& b, Stream& is) { b.fill_zero(is, d, n); });
}
void ForwardingBackend::gemm(Stream& s, Mat c, Mat a, Trans ta, Mat b_, Trans tb, float alpha,
                             float beta) {
  // c[M,N] = op(a)[M,K] op(b)[K,N]
  const int64_t K = ta == Trans::no ? a.cols : a.rows;
  std::string key = cat("gemm ", c.rows, "x", c.cols, "x", K, ta == Trans::yes ? " aT" : "",
                        tb == Trans::yes ? " bT" : "",
                        c.dtype != a.dtype ? cat(" ", dtype_name(c.dtype), "-out") : "",
                        beta != 0.f ? " +=" : "");
  run_op(s, std::move(key),
         [=](Backend& b, Stream& is) { b.gemm(is, c, a, ta, b_, tb, alpha, beta); });
}
void ForwardingBackend::bias_add(Stream& s, Mat x, Mat bias) {
  run_op(s, "bias_add", [=](Backend& b, Stream& is) { b.bias_add(is, x, bias); });
}
void ForwardingBackend::bias_backward(Stream& s, Mat dbias, Mat dy) {
  run_op(s, "bias_backward", [=](Backend& b, Stream& is) { b.bias_backward(is, dbias, dy); });
}
void ForwardingBackend::embedding_forward(Stream& s, Mat out, const int32_t* ids, Mat table) {
  run_op(s, "embedding_forward",
         [=](Backend& b, Stream& is) { b.embedding_forward(is, out, ids, table); });
}
void ForwardingBackend::embedding_backward(Stream& s, Mat dtable, const int32_t* ids, Mat dout) {
  run_op(s, "embedding_backward",
         [=](Backend& b, Stream& is) { b.embedding_backward(is, dtable, ids, dout); });
}
void ForwardingBackend::rmsnorm_forward(Stream& s, Mat out, float* rstd, Mat x, Mat w, float eps) {
  run_op(s, cat("rmsnorm_forward ", shape(x)),
         [=](Backend& b, Stream& is) { b.rmsnorm_forward(is, out, rstd, x, w, eps); });
}
void ForwardingBackend::add_rmsnorm_forward(Stream& s, Mat sum, Mat out, float* rstd, Mat a,
                                            Mat b_, Mat w, float eps) {
  run_op(s, cat("add_rmsnorm_forward ", shape(a)),
         [=](Backend& b, Stream& is) { b.add_rmsnorm_forward(is, sum, out, rstd, a, b_, w, eps); });
}
void ForwardingBackend::rmsnorm_backward(Stream& s, Mat dx, Mat dw, Mat dout, Mat x, Mat w,
                                         const float* rstd, Mat dres) {
  run_op(s, cat("rmsnorm_backward ", shape(x), dres.empty() ? "" : " +residual"),
         [=](Backend& b, Stream& is) { b.rmsnorm_backward(is, dx, dw, dout, x, w, rstd, dres); });
}
void ForwardingBackend::rope_forward(Stream& s, Mat x, int h, int d, const int32_t* pos,
                                     const float* f) {
  run_op(s, cat("rope_forward ", h, " heads"),
         [=](Backend& b, Stream& is) { b.rope_forward(is, x, h, d, pos, f); });
}
void ForwardingBackend::rope_backward(Stream& s, Mat dx, int h, int d, const int32_t* pos,
                                      const float* f) {
  run_op(s, cat("rope_backward ", h, " heads"),
         [=](Backend& b, Stream& is) { b.rope_backward(is, dx, h, d, pos, f); });
}
void ForwardingBackend::attention_forward(Stream& s, Mat out, float* lse, Mat q, Mat k, Mat v,
                                          const AttentionShape& sh, const int32_t* cu) {
  run_op(s, "attention_forward",
         [=](Backend& b, Stream& is) { b.attention_forward(is, out, lse, q, k, v, sh, cu); });
}
void ForwardingBackend::attention_backward(Stream& s, Mat dq, Mat dk, Mat dv, Mat dout, Mat out,
                                           const float* lse, Mat q, Mat k, Mat v,
                                           const AttentionShape& sh, const int32_t* cu) {
  run_op(s, "attention_backward", [=](Backend& b, Stream& is) {
    b.attention_backward(is, dq, dk, dv, dout, out, lse, q, k, v, sh, cu);
  });
}
void ForwardingBackend::attention_decode(Stream& s, Mat out, Mat q, Mat k_cache, Mat v_cache,
                                         const AttentionShape& sh, int64_t kv_len) {
  run_op(s, cat("attention_decode ", q.rows, " over ", kv_len), [=](Backend& b, Stream& is) {
    b.attention_decode(is, out, q, k_cache, v_cache, sh, kv_len);
  });
}
void ForwardingBackend::swiglu_forward(Stream& s, Mat out, Mat gate, Mat up) {
  run_op(s, "swiglu_forward", [=](Backend& b, Stream& is) { b.swiglu_forward(is, out, gate, up); });
}
void ForwardingBackend::swiglu_backward(Stream& s, Mat dgate, Mat dup, Mat dout, Mat gate, Mat up) {
  run_op(s, "swiglu_backward",
         [=](Backend& b, Stream& is) { b.swiglu_backward(is, dgate, dup, dout, gate, up); });
}
void ForwardingBackend::lm_head_loss(Stream& s, float* loss_sum, Mat dh, Mat dw, Mat h, Mat w,
                                     const int32_t* labels, float grad_scale, Mat scratch) {
  run_op(s, "lm_head_loss", [=](Backend& b, Stream& is) {
    b.lm_head_loss(is, loss_sum, dh, dw, h, w, labels, grad_scale, scratch);
  });
}
void ForwardingBackend::cast(Stream& s, Mat dst, Mat src) {
  run_op(s, cat("cast ", dtype_name(src.dtype), "->", dtype_name(dst.dtype), " ", shape(src)),
         [=](Backend& b, Stream& is) { b.cast(is, dst, src); });
}
void ForwardingBackend::axpy(Stream& s, Mat dst, Mat src, float alpha) {
  run_op(s, cat("axpy ", shape(src)), [=](Backend& b, Stream& is) { b.axpy(is, dst, src, alpha); });
}
void ForwardingBackend::sum_squares(Stream& s, float* out, Mat x) {
  run_op(s, "sum_squares", [=](Backend& b, Stream& is) { b.sum_squares(is, out, x); });
}
void ForwardingBackend::adamw(Stream& s, float* param, float* m, float* v, const float* grad,
                              void* w_out, int64_t n, const AdamWStep& step) {
  run_op(s, "adamw",
         [=](Backend& b, Stream& is) { b.adamw(is, param, m, v, grad, w_out, n, step); });
}
// The op may run later (threaded streams): it keeps its own copy of the ranges (the view's
// layout is the caller's, alive while the state is).
void ForwardingBackend::adamw_state(Stream& s, const UnitStateView& state, int64_t off, int64_t len,
                                    const float* grad, void* weights_out,
                                    std::span<const ParamRange> ranges, const AdamWStep& step) {
  std::vector<ParamRange> r(ranges.begin(), ranges.end());
  run_op(s, "adamw_state", [=, r = std::move(r)](Backend& b, Stream& is) {
    b.adamw_state(is, state, off, len, grad, weights_out, r, step);
  });
}

}  // namespace sf
