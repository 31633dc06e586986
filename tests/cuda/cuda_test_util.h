// Helpers for the GPU tests: a device tensor with a host mirror, poisoning, guard columns,
// bf16-rounded random inputs, and error metrics against the host (fp32) reference.
//
// Every device tensor is a [rows, cols] view inside a [rows, ld] allocation. The ld - cols
// columns to the right are guards filled with a sentinel byte pattern; guards_intact() checks
// that no op wrote there. poison() fills the view with NaN bit patterns, so any element an op
// forgets to write shows up as NaN in the comparison.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "backend/cuda/cuda_backend.h"
#include "backend/host/host_backend.h"
#include "core/dtype.h"
#include "test_util.h"

namespace sf::test {

// Skips the test (reported as skipped by ctest) on a machine without a CUDA device.
#define SF_REQUIRE_GPU()                                                   \
  do {                                                                     \
    if (::sf::CudaBackend::device_count() == 0) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

inline CudaBackend& gpu() {
  static CudaBackend be(0);
  return be;
}
inline HostBackend& host() {
  static HostBackend be;
  return be;
}
inline Stream& gs() { return gpu().default_stream(); }
inline Stream& hs() { return host().default_stream(); }

constexpr unsigned char kGuardByte = 0xA5;

// Host -> device copy that has landed when it returns. cudaMemcpy from pageable memory returns
// once the bytes are staged, and its DMA runs on the legacy stream, which the backend's
// non-blocking streams do not wait for: a kernel launched right after could read (or a later
// write be overwritten by) the old bytes. So every test upload waits for the device.
inline cudaError_t upload_bytes(void* dst, const void* src, size_t n) {
  const cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
  return e != cudaSuccess ? e : cudaDeviceSynchronize();
}

// Random values in [lo, hi) rounded to bf16 (exactly representable on both backends).
inline std::vector<float> rand_bf16(size_t n, uint64_t seed, float lo = -1.f, float hi = 1.f) {
  auto v = random_vec(n, seed, lo, hi);
  for (auto& x : v) x = round_bf16(x);
  return v;
}

struct DevMat {
  std::unique_ptr<Buffer> buf;
  Mat m;  // the device view

  DevMat() = default;
  DevMat(DType t, int64_t rows, int64_t cols, int64_t ld = -1) {
    if (ld < 0) ld = cols;
    const size_t bytes = size_t(std::max<int64_t>(rows * ld, 1)) * dtype_size(t);
    buf = gpu().alloc(bytes, "test tensor");
    m = Mat(buf->data(), t, rows, cols, ld);
    std::vector<unsigned char> g(bytes, kGuardByte);
    EXPECT_EQ(upload_bytes(buf->data(), g.data(), bytes), cudaSuccess);
  }
  size_t raw_bytes() const { return size_t(std::max<int64_t>(m.rows * m.ld, 1)) * m.elem_size(); }
  std::vector<unsigned char> raw() const {
    std::vector<unsigned char> r(raw_bytes());
    gs().synchronize();
    EXPECT_EQ(cudaMemcpy(r.data(), buf->data(), r.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return r;
  }
  void set_raw(const std::vector<unsigned char>& r) {
    gs().synchronize();
    EXPECT_EQ(upload_bytes(buf->data(), r.data(), r.size()), cudaSuccess);
  }
  // Writes dense row-major values (rows*cols) into the view, converted to the dtype.
  void upload(const std::vector<float>& v) {
    EXPECT_EQ(int64_t(v.size()), m.rows * m.cols);
    auto r = raw();
    const size_t es = m.elem_size();
    for (int64_t i = 0; i < m.rows; ++i)
      convert_from_f32(v.data() + i * m.cols, r.data() + size_t(i * m.ld) * es, m.dtype,
                       size_t(m.cols));
    set_raw(r);
  }
  std::vector<float> download() const {
    auto r = raw();
    std::vector<float> v(size_t(m.rows * m.cols));
    const size_t es = m.elem_size();
    for (int64_t i = 0; i < m.rows; ++i)
      convert_to_f32(r.data() + size_t(i * m.ld) * es, m.dtype, v.data() + i * m.cols,
                     size_t(m.cols));
    return v;
  }
  void poison() {
    auto r = raw();
    const size_t es = m.elem_size();
    for (int64_t i = 0; i < m.rows; ++i)
      std::memset(r.data() + size_t(i * m.ld) * es, 0xFF, size_t(m.cols) * es);
    set_raw(r);
  }
  bool guards_intact() const {
    auto r = raw();
    const size_t es = m.elem_size();
    for (int64_t i = 0; i < m.rows; ++i)
      for (size_t b = size_t(i * m.ld + m.cols) * es; b < size_t((i + 1) * m.ld) * es; ++b)
        if (r[b] != kGuardByte) return false;
    return true;
  }
};

// A small device array of int32 or f32.
template <class T>
struct DevArray {
  std::unique_ptr<Buffer> buf;
  size_t n = 0;
  explicit DevArray(const std::vector<T>& v) : n(v.size()) {
    buf = gpu().alloc(std::max<size_t>(n, 1) * sizeof(T), "test array");
    EXPECT_EQ(upload_bytes(buf->data(), v.data(), n * sizeof(T)), cudaSuccess);
  }
  T* ptr() const { return static_cast<T*>(buf->data()); }
  std::vector<T> download() const {
    std::vector<T> v(n);
    gs().synchronize();
    cudaMemcpy(v.data(), buf->data(), n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
};

// Host f32 reference tensor (contiguous).
struct HostMat {
  std::vector<float> v;
  Mat m;
  HostMat(int64_t rows, int64_t cols, std::vector<float> init = {}) {
    v = init.empty() ? std::vector<float>(size_t(rows * cols), 0.f) : std::move(init);
    m = Mat(v.data(), DType::f32, rows, cols);
  }
};

struct Err {
  double rel_l2 = 0, max_abs = 0, ref_max = 0;
  int64_t nan = 0, n = 0;
};

inline Err measure(const std::vector<float>& got, const std::vector<float>& ref) {
  Err e;
  e.n = int64_t(ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    if (std::isnan(got[i]) || std::isinf(got[i]) != std::isinf(ref[i])) {
      ++e.nan;
      continue;
    }
    const double d = double(got[i]) - double(ref[i]);
    num += d * d;
    den += double(ref[i]) * ref[i];
    e.max_abs = std::max(e.max_abs, std::abs(d));
    e.ref_max = std::max(e.ref_max, double(std::abs(ref[i])));
  }
  e.rel_l2 = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

// Checks got against ref: no NaN/Inf mismatch, relative L2 error <= tol. Prints one
// "[ERR]" line per check (scripts/gpu.sh check collects them into the report table).
inline void expect_close(const std::string& what, const std::vector<float>& got,
                         const std::vector<float>& ref, double tol) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  const Err e = measure(got, ref);
  std::printf("[ERR] %-52s rel_l2 %.3e  max_abs %.3e  (|ref|max %.3e, n %lld, tol %.0e)\n",
              what.c_str(), e.rel_l2, e.max_abs, e.ref_max, (long long)e.n, tol);
  EXPECT_EQ(e.nan, 0) << what << ": " << e.nan << " NaN/Inf mismatches (unwritten outputs?)";
  EXPECT_LE(e.rel_l2, tol) << what;
}

// Bitwise equality of two f32 vectors (as bit patterns, so NaN never passes).
inline void expect_bitwise(const std::string& what, const std::vector<float>& got,
                           const std::vector<float>& ref) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < ref.size(); ++i)
    if (std::memcmp(&got[i], &ref[i], 4) != 0 || std::isnan(got[i])) {
      if (first < 0) first = int64_t(i);
      ++bad;
    }
  std::printf("[ERR] %-52s bitwise: %lld of %zu differ\n", what.c_str(), (long long)bad,
              ref.size());
  EXPECT_EQ(bad, 0) << what << ": first at " << first << " got "
                    << (first >= 0 ? got[size_t(first)] : 0.f) << " want "
                    << (first >= 0 ? ref[size_t(first)] : 0.f);
}

inline std::vector<float> round_all_bf16(std::vector<float> v) {
  for (auto& x : v) x = round_bf16(x);
  return v;
}

}  // namespace sf::test
