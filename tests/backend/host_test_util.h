// Helpers for the host backend tests: strided f32 matrices with sentinel padding, naive
// references and a central finite-difference gradient checker.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "backend/host/host_backend.h"
#include "test_util.h"

namespace sf::test {

// Value written into the padding columns (ld > cols) of every test matrix; ops must never
// write there, and any read of it would show up as a wrong result.
constexpr float kPad = 12345.f;

// A row-major f32 matrix owning its storage, with row stride ld >= cols.
struct HMat {
  std::vector<float> buf;
  int64_t rows = 0, cols = 0, ld = 0;
  HMat() = default;
  HMat(int64_t r, int64_t c, int64_t ld_ = -1) : rows(r), cols(c), ld(ld_ < 0 ? c : ld_) {
    buf.assign(size_t(std::max<int64_t>(1, rows * ld)), kPad);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) at(i, j) = 0.f;
  }
  // Seeded uniform values in [lo, hi) (never all zero).
  static HMat random(int64_t r, int64_t c, uint64_t seed, int64_t ld_ = -1, float lo = -1.f,
                     float hi = 1.f) {
    HMat m(r, c, ld_);
    auto v = random_vec(size_t(r * c), seed, lo, hi);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) m.at(i, j) = v[size_t(i * c + j)];
    return m;
  }
  float& at(int64_t i, int64_t j) { return buf[size_t(i * ld + j)]; }
  float at(int64_t i, int64_t j) const { return buf[size_t(i * ld + j)]; }
  Mat mat() { return Mat(buf.data(), DType::f32, rows, cols, ld); }
  void fill(float v) {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) at(i, j) = v;
  }
  // True when every padding element still holds kPad.
  bool padding_intact() const {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = cols; j < ld; ++j)
        if (at(i, j) != kPad) return false;
    return true;
  }
};

// Copy the elements of a Mat view (any layout) into a dense vector.
inline std::vector<float> dense(Mat m) {
  std::vector<float> v(size_t(m.numel()));
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j) v[size_t(i * m.cols + j)] = *static_cast<float*>(m.ptr(i, j));
  return v;
}
inline float& el(Mat m, int64_t i, int64_t j) { return *static_cast<float*>(m.ptr(i, j)); }

// sum_ij m[i,j] * w[i,j] in double: the scalar "loss" whose gradient w.r.t. m is w.
inline double weighted_sum(Mat m, Mat w) {
  double s = 0;
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j) s += double(el(m, i, j)) * el(w, i, j);
  return s;
}

inline float max_abs(Mat m) {
  float r = 0;
  for (int64_t i = 0; i < m.rows; ++i)
    for (int64_t j = 0; j < m.cols; ++j) r = std::max(r, std::fabs(el(m, i, j)));
  return r;
}

// Central finite differences of loss() w.r.t. every element of x, compared with grad:
// |fd - grad| <= atol + rtol * |fd|. The step actually taken is float(v+h) - float(v-h), so the
// quotient has no representation error from rounding the perturbed input.
inline void expect_grad_fd(Mat x, Mat grad, const std::function<double()>& loss, double h,
                           double atol, double rtol, const char* what) {
  ASSERT_EQ(x.rows, grad.rows);
  ASSERT_EQ(x.cols, grad.cols);
  int failures = 0;
  for (int64_t i = 0; i < x.rows; ++i)
    for (int64_t j = 0; j < x.cols; ++j) {
      float& xv = el(x, i, j);
      const float v = xv;
      const float xp = float(double(v) + h), xm = float(double(v) - h);
      xv = xp;
      const double lp = loss();
      xv = xm;
      const double lm = loss();
      xv = v;
      const double fd = (lp - lm) / (double(xp) - double(xm));
      const double g = el(grad, i, j);
      if (std::fabs(fd - g) > atol + rtol * std::fabs(fd) && failures++ < 8)
        ADD_FAILURE() << what << "[" << i << ", " << j << "]: analytic " << g << ", finite difference "
                      << fd;
    }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " mismatching elements";
}

inline HostBackend& host() {
  static HostBackend be;
  return be;
}
inline Stream& stream() { return host().default_stream(); }

}  // namespace sf::test
