// HostBackend RMSNorm (Hugging Face LlamaRMSNorm semantics, fp32):
//   rstd = 1/sqrt(mean(x^2) + eps), out = w * (x * rstd).
// rmsnorm_forward: out, rstd overwrite. add_rmsnorm_forward: sum = a + b (overwrite, may alias
// a or b), then the same. rmsnorm_backward: dx overwrite (+ dres when given; dx may alias dres,
// dout or x), dw accumulate.
//
// Groups (an additive reading of the contract): w may be [1, D] with x [T, G*D], G >= 1. Each
// D-wide group of a row is normalised on its own and rstd has T*G entries in (t, g) order.
// That is exactly the contract's per-head [T*H, D] view when x is contiguous, and it also
// works for a strided q/k column block of the fused qkv output, which cannot be reshaped.
//
// Mean of squares and the backward dot product are accumulated in double; dw is parallel over
// columns with rows in order, so nothing depends on the thread count. A call's double partial
// of dw is rounded to f32 before it is added: chunks summed into one accumulator give the bits
// of the same partials summed anywhere else in f32 in that order (data parallel's ranks).
#include <cmath>
#include <vector>

#include "backend/host/host_backend.h"
#include "core/thread_pool.h"

namespace sf {

using namespace host_detail;

namespace {

// Number of D-wide groups per row of x, D = w.cols.
int64_t norm_groups(const Mat& x, const Mat& w, const char* op) {
  SF_CHECK(w.rows == 1 && w.cols > 0 && x.cols % w.cols == 0, "host ", op, ": weight is [",
           w.rows, ", ", w.cols, "], x is [", x.rows, ", ", x.cols,
           "]; x.cols must be a multiple of weight.cols");
  return x.cols / w.cols;
}

// Normalises one D-wide group; returns rstd.
inline float norm_group(float* out, const float* x, const float* w, int64_t D, float eps) {
  const float var = float(dot_d(x, x, D) / double(D));
  const float r = 1.f / std::sqrt(var + eps);
  for (int64_t c = 0; c < D; ++c) out[c] = w[c] * (x[c] * r);
  return r;
}

}  // namespace

void HostBackend::rmsnorm_forward(Stream&, Mat out, float* rstd, Mat x, Mat w, float eps) {
  check_f32(out, "rmsnorm_forward", "out");
  check_f32(x, "rmsnorm_forward", "x");
  check_f32(w, "rmsnorm_forward", "weight");
  check_shape(out, x.rows, x.cols, "rmsnorm_forward", "out");
  const int64_t G = norm_groups(x, w, "rmsnorm_forward"), D = w.cols;
  const float* wp = w.as<const float>();
  host_pool().parallel_for(x.rows, [&](int64_t r0, int64_t r1) {
    for (int64_t t = r0; t < r1; ++t)
      for (int64_t g = 0; g < G; ++g) {
        const float r = norm_group(frow(out, t) + g * D, frow(x, t) + g * D, wp, D, eps);
        if (rstd) rstd[t * G + g] = r;
      }
  }, row_grain(x.cols));
}

void HostBackend::add_rmsnorm_forward(Stream&, Mat sum, Mat out, float* rstd, Mat a, Mat b,
                                      Mat w, float eps) {
  check_f32(sum, "add_rmsnorm_forward", "sum");
  check_f32(out, "add_rmsnorm_forward", "out");
  check_f32(a, "add_rmsnorm_forward", "a");
  check_f32(b, "add_rmsnorm_forward", "b");
  check_f32(w, "add_rmsnorm_forward", "weight");
  check_shape(b, a.rows, a.cols, "add_rmsnorm_forward", "b");
  check_shape(sum, a.rows, a.cols, "add_rmsnorm_forward", "sum");
  check_shape(out, a.rows, a.cols, "add_rmsnorm_forward", "out");
  const int64_t G = norm_groups(a, w, "add_rmsnorm_forward"), D = w.cols;
  const float* wp = w.as<const float>();
  host_pool().parallel_for(a.rows, [&](int64_t r0, int64_t r1) {
    for (int64_t t = r0; t < r1; ++t) {
      const float* ar = frow(a, t);
      const float* br = frow(b, t);
      float* sr = frow(sum, t);
      for (int64_t c = 0; c < a.cols; ++c) sr[c] = ar[c] + br[c];
      for (int64_t g = 0; g < G; ++g) {
        const float r = norm_group(frow(out, t) + g * D, sr + g * D, wp, D, eps);
        if (rstd) rstd[t * G + g] = r;
      }
    }
  }, row_grain(a.cols));
}

// With xhat = x * r: dx_j = r * (w_j dout_j - xhat_j * mean_i(dout_i w_i xhat_i)) (+ dres_j),
// dw_j += sum over rows (and groups) of dout_j * xhat_j.
void HostBackend::rmsnorm_backward(Stream&, Mat dx, Mat dw, Mat dout, Mat x, Mat w,
                                   const float* rstd, Mat dres) {
  check_f32(dx, "rmsnorm_backward", "dx");
  check_f32(dout, "rmsnorm_backward", "dout");
  check_f32(x, "rmsnorm_backward", "x");
  check_f32(w, "rmsnorm_backward", "weight");
  check_shape(dx, x.rows, x.cols, "rmsnorm_backward", "dx");
  check_shape(dout, x.rows, x.cols, "rmsnorm_backward", "dout");
  SF_CHECK(rstd != nullptr || x.rows == 0, "host rmsnorm_backward: rstd is null");
  const int64_t G = norm_groups(x, w, "rmsnorm_backward"), D = w.cols, T = x.rows;
  if (!dres.empty()) {
    check_f32(dres, "rmsnorm_backward", "dres");
    check_shape(dres, x.rows, x.cols, "rmsnorm_backward", "dres");
  }
  const float* wp = w.as<const float>();

  // dw first, so that dx may alias dout or x as well as dres.
  if (!dw.empty()) {
    check_f32(dw, "rmsnorm_backward", "dw");
    check_shape(dw, 1, D, "rmsnorm_backward", "dw");
    float* dwp = dw.as<float>();
    host_pool().parallel_for(D, [&](int64_t c0, int64_t c1) {
      std::vector<double> acc(size_t(c1 - c0), 0.0);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t g = 0; g < G; ++g) {
          const float r = rstd[t * G + g];
          const float* xr = frow(x, t) + g * D;
          const float* dr = frow(dout, t) + g * D;
          for (int64_t c = c0; c < c1; ++c) acc[size_t(c - c0)] += double(dr[c]) * (xr[c] * r);
        }
      for (int64_t c = c0; c < c1; ++c) dwp[c] += float(acc[size_t(c - c0)]);
    }, std::max<int64_t>(16, 16384 / std::max<int64_t>(1, T * G)));
  }

  host_pool().parallel_for(T, [&](int64_t r0, int64_t r1) {
    for (int64_t t = r0; t < r1; ++t)
      for (int64_t g = 0; g < G; ++g) {
        const float r = rstd[t * G + g];
        const float* xr = frow(x, t) + g * D;
        const float* dr = frow(dout, t) + g * D;
        const float* rr = dres.empty() ? nullptr : frow(dres, t) + g * D;
        float* o = frow(dx, t) + g * D;
        double s = 0;
        for (int64_t c = 0; c < D; ++c) s += double(dr[c]) * wp[c] * (xr[c] * r);
        const float mean = float(s / double(D));
        for (int64_t c = 0; c < D; ++c) {
          const float xhat = xr[c] * r;
          float v = r * (wp[c] * dr[c] - xhat * mean);
          if (rr) v += rr[c];
          o[c] = v;
        }
      }
  }, row_grain(x.cols));
}

}  // namespace sf
