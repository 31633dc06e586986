// HostBackend::gemm through OpenBLAS cblas_sgemm, plus the shared argument checks.
// Contract (backend.h): c = alpha * op(a) @ op(b) + beta * c, row-major, every Mat with its
// own row stride ld. c is overwritten when beta == 0 (BLAS semantics: c is then not read, so
// NaN/garbage in c does not propagate), accumulated otherwise.
// Determinism: c is cut into fixed tiles (kTileM x kTileN, independent of the thread count),
// each tile is one single-threaded cblas_sgemm call, and host_pool() runs the tiles. OpenBLAS's
// own threading is switched off because its multi-threaded driver blocks the inner dimension
// differently from its single-threaded one (results changed between SF_NUM_THREADS=1 and 2);
// with fixed tiles every element of c is the same sequence of operations whatever the thread
// count. Packing overhead of the tiling is (kTileM + kTileN) / (2 kTileM kTileN) < 1%.
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

namespace {
constexpr int64_t kTileM = 128, kTileN = 512;
}  // namespace

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
  static std::once_flag single_thread_once;
  std::call_once(single_thread_once, [] { openblas_set_num_threads(1); });
  // BLAS wants ld >= the row length even for a single row.
  auto ld = [](const Mat& m) { return int(std::max<int64_t>(std::max<int64_t>(m.ld, m.cols), 1)); };
  const int lda = ld(a), ldb = ld(b), ldc = ld(c);
  const auto cta = ta == Trans::yes ? CblasTrans : CblasNoTrans;
  const auto ctb = tb == Trans::yes ? CblasTrans : CblasNoTrans;
  const float* ap = a.as<const float>();
  const float* bp = b.as<const float>();
  const int64_t tiles_m = (M + kTileM - 1) / kTileM, tiles_n = (N + kTileN - 1) / kTileN;
  host_pool().run_tasks(tiles_m * tiles_n, [&](int64_t tile) {
    const int64_t i0 = (tile / tiles_n) * kTileM, j0 = (tile % tiles_n) * kTileN;
    const int64_t m = std::min(kTileM, M - i0), n = std::min(kTileN, N - j0);
    // Rows i0.. of op(a) and columns j0.. of op(b), as pointers into the stored matrices.
    const float* at = ta == Trans::no ? ap + i0 * a.ld : ap + i0;
    const float* bt = tb == Trans::no ? bp + j0 : bp + j0 * b.ld;
    cblas_sgemm(CblasRowMajor, cta, ctb, int(m), int(n), int(K), alpha, at, lda, bt, ldb, beta,
                static_cast<float*>(c.ptr(i0, j0)), ldc);
  });
}

}  // namespace sf
