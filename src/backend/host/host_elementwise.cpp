// HostBackend elementwise ops, reductions and the optimizer step:
//   bias_add (x overwritten in place), bias_backward (dbias accumulate),
//   embedding_forward (overwrite), embedding_backward (dtable accumulate),
//   cast (overwrite), axpy (accumulate), sum_squares (accumulate), adamw (param/m/v updated
//   in place, weights_out overwritten).
// Determinism: every reduction is independent of the thread count. Column sums
// (bias_backward, embedding_backward) are parallel over columns with rows added in row order;
// sum_squares adds fixed 4096-element blocks in double, then the blocks in order.
#include <cmath>
#include <vector>

#include "backend/host/host_backend.h"
#include "core/thread_pool.h"

namespace sf {

using namespace host_detail;

namespace {

bool is_float_type(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

// Row r of m (any float dtype) as f32: a pointer into m when m is f32, else converted into tmp.
const float* row_as_f32(const Mat& m, int64_t r, std::vector<float>& tmp) {
  if (m.dtype == DType::f32) return frow(m, r);
  tmp.resize(size_t(m.cols));
  convert_to_f32(m.ptr(r, 0), m.dtype, tmp.data(), size_t(m.cols));
  return tmp.data();
}

void check_float_mat(const Mat& m, const char* op, const char* arg) {
  SF_CHECK(is_float_type(m.dtype), "host ", op, ": ", arg, " must be f32, bf16 or f16, got ",
           dtype_name(m.dtype));
  SF_CHECK(m.rows >= 0 && m.cols >= 0 && (m.ld >= m.cols || m.rows <= 1), "host ", op, ": ",
           arg, " has a bad shape");
  SF_CHECK(m.data != nullptr || m.numel() == 0, "host ", op, ": ", arg, " has no data");
}

// Column-parallel grain: enough columns per range to keep one cache line per row.
constexpr int64_t kColGrain = 16;

}  // namespace

void HostBackend::bias_add(Stream&, Mat x, Mat bias) {
  check_f32(x, "bias_add", "x");
  check_f32(bias, "bias_add", "bias");
  check_shape(bias, 1, x.cols, "bias_add", "bias");
  const float* b = bias.as<const float>();
  host_pool().parallel_for(x.rows, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* xr = frow(x, r);
      for (int64_t c = 0; c < x.cols; ++c) xr[c] += b[c];
    }
  }, row_grain(x.cols));
}

void HostBackend::bias_backward(Stream&, Mat dbias, Mat dy) {
  check_f32(dbias, "bias_backward", "dbias");
  check_f32(dy, "bias_backward", "dy");
  check_shape(dbias, 1, dy.cols, "bias_backward", "dbias");
  float* db = dbias.as<float>();
  host_pool().parallel_for(dy.cols, [&](int64_t c0, int64_t c1) {
    std::vector<double> acc(size_t(c1 - c0), 0.0);
    for (int64_t r = 0; r < dy.rows; ++r) {
      const float* y = frow(dy, r);
      for (int64_t c = c0; c < c1; ++c) acc[size_t(c - c0)] += y[c];
    }
    for (int64_t c = c0; c < c1; ++c) db[c] = float(double(db[c]) + acc[size_t(c - c0)]);
  }, std::max(kColGrain, int64_t(16384) / std::max<int64_t>(1, dy.rows)));
}

void HostBackend::embedding_forward(Stream&, Mat out, const int32_t* ids, Mat table) {
  check_f32(out, "embedding_forward", "out");
  check_f32(table, "embedding_forward", "table");
  SF_CHECK(out.cols == table.cols, "host embedding_forward: out has ", out.cols,
           " columns, table ", table.cols);
  SF_CHECK(ids != nullptr || out.rows == 0, "host embedding_forward: ids is null");
  host_pool().parallel_for(out.rows, [&](int64_t r0, int64_t r1) {
    for (int64_t t = r0; t < r1; ++t) {
      const int64_t id = ids[t];
      SF_CHECK(id >= 0 && id < table.rows, "host embedding_forward: token id ", id,
               " at position ", t, " is outside the table (", table.rows, " rows)");
      const float* src = frow(table, id);
      float* dst = frow(out, t);
      for (int64_t c = 0; c < out.cols; ++c) dst[c] = src[c];
    }
  }, row_grain(out.cols));
}

void HostBackend::embedding_backward(Stream&, Mat dtable, const int32_t* ids, Mat dout) {
  check_f32(dtable, "embedding_backward", "dtable");
  check_f32(dout, "embedding_backward", "dout");
  SF_CHECK(dout.cols == dtable.cols, "host embedding_backward: dout has ", dout.cols,
           " columns, dtable ", dtable.cols);
  SF_CHECK(ids != nullptr || dout.rows == 0, "host embedding_backward: ids is null");
  for (int64_t t = 0; t < dout.rows; ++t)
    SF_CHECK(ids[t] < dtable.rows, "host embedding_backward: token id ", ids[t], " at position ",
             t, " is outside the table (", dtable.rows, " rows)");
  // Parallel over columns, tokens in order: repeated ids add up in the same order always.
  host_pool().parallel_for(dout.cols, [&](int64_t c0, int64_t c1) {
    for (int64_t t = 0; t < dout.rows; ++t) {
      if (ids[t] < 0) continue;  // skipped (a block of the table's rows)
      const float* g = frow(dout, t);
      float* d = frow(dtable, ids[t]);
      for (int64_t c = c0; c < c1; ++c) d[c] += g[c];
    }
  }, std::max(kColGrain, int64_t(16384) / std::max<int64_t>(1, dout.rows)));
}

void HostBackend::cast(Stream&, Mat dst, Mat src) {
  check_float_mat(dst, "cast", "dst");
  check_float_mat(src, "cast", "src");
  check_shape(dst, src.rows, src.cols, "cast", "dst");
  host_pool().parallel_for(src.rows, [&](int64_t r0, int64_t r1) {
    std::vector<float> tmp;
    for (int64_t r = r0; r < r1; ++r) {
      const float* s = row_as_f32(src, r, tmp);
      convert_from_f32(s, dst.ptr(r, 0), dst.dtype, size_t(src.cols));
    }
  }, row_grain(src.cols));
}

void HostBackend::axpy(Stream&, Mat dst, Mat src, float alpha) {
  check_f32(dst, "axpy", "dst");
  check_float_mat(src, "axpy", "src");
  check_shape(dst, src.rows, src.cols, "axpy", "dst");
  host_pool().parallel_for(src.rows, [&](int64_t r0, int64_t r1) {
    std::vector<float> tmp;
    for (int64_t r = r0; r < r1; ++r) {
      const float* s = row_as_f32(src, r, tmp);
      float* d = frow(dst, r);
      for (int64_t c = 0; c < src.cols; ++c) d[c] += alpha * s[c];
    }
  }, row_grain(src.cols));
}

void HostBackend::sum_squares(Stream&, float* out, Mat x) {
  check_float_mat(x, "sum_squares", "x");
  SF_CHECK(out != nullptr, "host sum_squares: out is null");
  if (x.numel() == 0) return;
  // Fixed blocks (row, 4096-column slice): the partition never depends on the thread count.
  constexpr int64_t kBlock = 4096;
  const int64_t per_row = (x.cols + kBlock - 1) / kBlock;
  const int64_t n_blocks = x.rows * per_row;
  std::vector<double> partial(size_t(n_blocks), 0.0);
  host_pool().parallel_for(n_blocks, [&](int64_t b0, int64_t b1) {
    std::vector<float> tmp;
    int64_t cached_row = -1;
    const float* row = nullptr;
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r = b / per_row, c0 = (b % per_row) * kBlock;
      const int64_t c1 = std::min(x.cols, c0 + kBlock);
      if (r != cached_row) {
        row = row_as_f32(x, r, tmp);
        cached_row = r;
      }
      partial[size_t(b)] = dot_d(row + c0, row + c0, c1 - c0);
    }
  }, std::max<int64_t>(1, 4 * kBlock / std::min(x.cols, kBlock)));
  double total = 0;
  for (double p : partial) total += p;
  *out = float(double(*out) + total);
}

void HostBackend::adamw(Stream&, float* param, float* m, float* v, const float* grad,
                        void* weights_out, int64_t n, const AdamWStep& st) {
  SF_CHECK(n >= 0 && (n == 0 || (param && m && v && grad)), "host adamw: null buffer for ", n,
           " parameters");
  SF_CHECK(st.step >= 1, "host adamw: step must be >= 1 (1-based), got ", st.step);
  // Bias corrections in double, then used as float: mirrors torch.optim.AdamW (and optim/).
  const double bc1 = 1.0 - std::pow(double(st.beta1), double(st.step));
  const double bc2 = 1.0 - std::pow(double(st.beta2), double(st.step));
  const float step_size = float(double(st.lr) / bc1);
  const float bc2_sqrt = float(std::sqrt(bc2));
  const float beta1 = st.beta1, beta2 = st.beta2, eps = st.eps, gs = st.grad_scale;
  const float decay = 1.f - st.lr * st.weight_decay;
  float* wout = static_cast<float*>(weights_out);  // compute dtype on the host is f32
  host_pool().parallel_for(n, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      // Keep exactly this order of operations (see the brief / optim module).
      const float g = grad[i] * gs;
      const float mi = beta1 * m[i] + (1.f - beta1) * g;
      const float vi = beta2 * v[i] + (1.f - beta2) * g * g;
      float p = param[i] * decay;
      const float denom = std::sqrt(vi) / bc2_sqrt + eps;
      p = p - step_size * mi / denom;
      m[i] = mi;
      v[i] = vi;
      param[i] = p;
      if (wout) wout[i] = p;
    }
  }, 8192);
}

}  // namespace sf
