// Mat: a non-owning 2-D row-major view of backend memory with a row stride, so that the
// q/k/v (or gate/up) column blocks of one fused projection output are views, not copies.
#pragma once
#include <cstdint>

#include "core/dtype.h"
#include "core/error.h"

namespace sf {

struct Mat {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t ld = 0;  // elements between the starts of consecutive rows (>= cols)

  Mat() = default;
  Mat(void* d, DType t, int64_t r, int64_t c, int64_t ld_ = -1)
      : data(d), dtype(t), rows(r), cols(c), ld(ld_ < 0 ? c : ld_) {}

  bool empty() const { return data == nullptr; }
  bool contiguous() const { return ld == cols; }
  int64_t numel() const { return rows * cols; }
  size_t elem_size() const { return dtype_size(dtype); }
  size_t bytes() const { return size_t(numel()) * elem_size(); }  // contiguous size

  template <class T>
  T* as() const { return static_cast<T*>(data); }
  void* ptr(int64_t r, int64_t c) const {
    return static_cast<char*>(data) + (r * ld + c) * int64_t(elem_size());
  }
  // Rows [r0, r0+n) of this view.
  Mat row_block(int64_t r0, int64_t n) const { return Mat(ptr(r0, 0), dtype, n, cols, ld); }
  // Columns [c0, c0+n) of this view (keeps the row stride).
  Mat col_block(int64_t c0, int64_t n) const { return Mat(ptr(0, c0), dtype, rows, n, ld); }
  // Reinterpret a contiguous view as another row count (e.g. [T, H*D] as [T*H, D]).
  Mat reshaped(int64_t r, int64_t c) const {
    SF_CHECK(contiguous() && r * c == numel(), "reshape of a strided or mis-sized Mat");
    return Mat(data, dtype, r, c);
  }
};

}  // namespace sf
