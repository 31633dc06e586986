// HostBackend::gemm through OpenBLAS cblas_sgemm, plus the shared argument checks.
// Contract (backend.h): c = alpha * op(a) @ op(b) + beta * c, row-major, every Mat with its
// own row stride ld. c is overwritten when beta == 0 (BLAS semantics: c is then not read, so
// NaN/garbage in c does not propagate), accumulated otherwise.
// Determinism: OpenBLAS splits sgemm over threads along M/N, never along K, so each element of
// c is the same dot-product sequence whatever the thread count. OpenBLAS gets as many threads as
// host_pool() (SF_NUM_THREADS), set once.
#include <cblas.h>

#include <climits>
#include <mutex>

#include "backend/host/host_backend.h"
#include "core/thread_pool.h"

namespace sf {

namespace host_detail {

void check_f32(const Mat& m, const char* op, const char* arg) {
  SF_CHECK(m.dtype == DType::f32, "host ", op, ": ", arg, " must be f32 (the host compute dtype), got ",
           dtype_name(m.dtype));
  SF_CHECK(m.rows >= 0 && m.cols >= 0 && (m.ld >= m.cols || m.rows <= 1), "host ", op, ": ", arg,
           " has a bad shape [", m.rows, ", ", m.cols, "] ld ", m.ld);
  SF_CHECK(m.data != nullptr || m.numel() == 0, "host ", op, ": ", arg, " has no data");
}

void check_shape(const Mat& m, int64_t rows, int64_t cols, const char* op, const char* arg) {
  SF_CHECK(m.rows == rows && m.cols == cols, "host ", op, ": ", arg, " is [", m.rows, ", ",
           m.cols, "], expected [", rows, ", ", cols, "]");
}

}  // namespace host_detail

using namespace host_detail;

void HostBackend::gemm(Stream&, Mat c, Mat a, Trans ta, Mat b, Trans tb, float alpha,
                       float beta) {
  check_f32(a, "gemm", "a");
  check_f32(b, "gemm", "b");
  check_f32(c, "gemm", "c");
  const int64_t M = ta == Trans::no ? a.rows : a.cols;
  const int64_t K = ta == Trans::no ? a.cols : a.rows;
  const int64_t Kb = tb == Trans::no ? b.rows : b.cols;
  const int64_t N = tb == Trans::no ? b.cols : b.rows;
  SF_CHECK(K == Kb && c.rows == M && c.cols == N, "host gemm: op(a) is [", M, ", ", K,
           "], op(b) is [", Kb, ", ", N, "], c is [", c.rows, ", ", c.cols, "]");
  if (M == 0 || N == 0) return;
  if (K == 0) {  // empty product: c = beta * c (BLAS would do the same; made explicit)
    for (int64_t r = 0; r < M; ++r) {
      float* cr = frow(c, r);
      for (int64_t j = 0; j < N; ++j) cr[j] = beta == 0.f ? 0.f : beta * cr[j];
    }
    return;
  }
  SF_CHECK(M < INT_MAX && N < INT_MAX && K < INT_MAX && a.ld < INT_MAX && b.ld < INT_MAX &&
               c.ld < INT_MAX,
           "host gemm: dimensions exceed the 32-bit BLAS interface");
  static std::once_flag threads_once;
  std::call_once(threads_once, [] { openblas_set_num_threads(host_pool().size()); });
  // BLAS wants ld >= the row length even for a single row.
  auto ld = [](const Mat& m) { return int(std::max<int64_t>(std::max<int64_t>(m.ld, m.cols), 1)); };
  cblas_sgemm(CblasRowMajor, ta == Trans::yes ? CblasTrans : CblasNoTrans,
              tb == Trans::yes ? CblasTrans : CblasNoTrans, int(M), int(N), int(K), alpha,
              a.as<const float>(), ld(a), b.as<const float>(), ld(b), beta, c.as<float>(), ld(c));
}

}  // namespace sf
