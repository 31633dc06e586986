// cuBLASLt GEMM with row-major semantics (contract in gemm_lt.h).
//
// Deriving the cuBLASLt call. cuBLASLt is column-major. A row-major [R, C] matrix with row
// stride ld is, byte for byte, a column-major [C, R] matrix with leading dimension ld, i.e.
// its transpose. We want row-major C[M, N] = op(a)[M, K] @ op(b)[K, N]. Transposing both sides:
//   C^T[N, M] = op(b)^T[N, K] @ op(a)^T[K, M]
// and C^T is exactly c's memory read column-major. So cuBLASLt's first operand ("A") is b's
// memory and its second ("B") is a's memory:
//   - b's memory read column-major is b^T. If tb == no we need op(b)^T = b^T: OP_N.
//     If tb == yes we need op(b)^T = b = (b^T)^T: OP_T. So transa = tb.
//   - likewise transb = ta.
//   - layouts describe the stored matrices: "A" = [b.cols rows, b.rows cols, ld b.ld],
//     "B" = [a.cols, a.rows, a.ld], "C"/"D" = [c.cols, c.rows, c.ld];
//   - cuBLASLt's (m, n, k) = (N, M, K).
#include "backend/cuda/gemm_lt.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "backend/cuda/cuda_check.h"

namespace sf::cuda {

struct GemmLt::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  ~Plan() {
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

size_t GemmLt::KeyHash::operator()(const Key& k) const {
  size_t h = 1469598103934665603ull;
  auto mix = [&](int64_t v) { h = (h ^ uint64_t(v)) * 1099511628211ull; };
  for (int64_t v : {k.m, k.n, k.k, k.lda, k.ldb, k.ldc}) mix(v);
  for (int v : {k.ta, k.tb, k.c_dtype, k.align_a, k.align_b, k.align_c}) mix(v);
  return h;
}

GemmLt::GemmLt(bool tune) : tune_(tune) { CUBLAS_CHECK(cublasLtCreate(&handle_)); }

GemmLt::~GemmLt() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

size_t GemmLt::cached_plans() const {
  std::lock_guard<std::mutex> lock(mu_);
  return plans_.size();
}

namespace {

// Largest power of two (<= 256) dividing the address: tells the heuristic which kernels may
// use wide loads (q/k/v column blocks are not always 256-byte aligned).
int pointer_alignment(const void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && u % uintptr_t(a) != 0) a /= 2;
  return a;
}

}  // namespace

std::unique_ptr<GemmLt::Plan> GemmLt::make_plan(const Key& key) {
  auto plan = std::make_unique<Plan>();
  const cudaDataType_t ct = key.c_dtype == int(DType::f32) ? CUDA_R_32F : CUDA_R_16BF;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t opa = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt A = our b
  const cublasOperation_t opb = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt B = our a
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &opa,
                                              sizeof(opa)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &opb,
                                              sizeof(opb)));
  // Stored shapes: "A" is b's memory, [N or K rows] as derived above.
  const uint64_t a_rows = key.tb ? uint64_t(key.k) : uint64_t(key.n);
  const uint64_t a_cols = key.tb ? uint64_t(key.n) : uint64_t(key.k);
  const uint64_t b_rows = key.ta ? uint64_t(key.m) : uint64_t(key.k);
  const uint64_t b_cols = key.ta ? uint64_t(key.k) : uint64_t(key.m);
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->la, CUDA_R_16BF, a_rows, a_cols, key.ldb));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lb, CUDA_R_16BF, b_rows, b_cols, key.lda));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lc, ct, uint64_t(key.n), uint64_t(key.m),
                                          key.ldc));
  return plan;
}

std::vector<cublasLtMatmulHeuristicResult_t> GemmLt::candidates(const Key& key, const Plan& plan,
                                                                size_t workspace_bytes,
                                                                int max_count) {
  cublasLtMatmulPreference_t pref = nullptr;
  CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const uint32_t al_a = uint32_t(key.align_b), al_b = uint32_t(key.align_a),
                 al_c = uint32_t(key.align_c);
  cublasStatus_t st = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                              &al_a, sizeof(al_a));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                              &al_b, sizeof(al_b));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                              &al_c, sizeof(al_c));
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                              &al_c, sizeof(al_c));
  std::vector<cublasLtMatmulHeuristicResult_t> results(size_t(std::max(max_count, 1)));
  int found = 0;
  if (st == CUBLAS_STATUS_SUCCESS)
    st = cublasLtMatmulAlgoGetHeuristic(handle_, plan.desc, plan.la, plan.lb, plan.lc, plan.lc,
                                        pref, int(results.size()), results.data(), &found);
  cublasLtMatmulPreferenceDestroy(pref);
  CUBLAS_CHECK(st);
  if (found == 0)
    SF_FAIL(cuda, "cuBLASLt has no algorithm for gemm m=", key.m, " n=", key.n, " k=", key.k,
            " (ta ", key.ta, ", tb ", key.tb, ", lda ", key.lda, ", ldb ", key.ldb, ", ldc ",
            key.ldc, ", c ", key.c_dtype == int(DType::f32) ? "f32" : "bf16",
            "); make row strides multiples of 8 elements");
  results.resize(size_t(found));
  return results;
}

float GemmLt::time_algo(cudaStream_t s, void* workspace, size_t workspace_bytes, const Plan& plan,
                        const cublasLtMatmulAlgo_t& algo, Mat c, Mat a, Mat b, float alpha,
                        float beta, int reps, float give_up_ms) {
  auto launch = [&] {
    return cublasLtMatmul(handle_, plan.desc, &alpha, b.data, plan.la, a.data, plan.lb, &beta,
                          c.data, plan.lc, c.data, plan.lc, &algo, workspace, workspace_bytes, s);
  };
  if (launch() != CUBLAS_STATUS_SUCCESS) return INFINITY;  // warm-up; a candidate may refuse
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  // A candidate far slower than the best so far is dropped after one timed run.
  for (int r = 0; r < reps && (r == 0 || ms[0] < give_up_ms); ++r) {
    CUDA_CHECK(cudaEventRecord(e0, s));
    CUBLAS_CHECK(launch());
    CUDA_CHECK(cudaEventRecord(e1, s));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
    ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

namespace {

// Byte range [first, last) a matrix's elements span.
std::pair<uintptr_t, uintptr_t> span(const Mat& m) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(m.data);
  const int64_t rows = std::max<int64_t>(m.rows, 1);
  return {p, p + uintptr_t(((rows - 1) * std::max(m.ld, m.cols) + m.cols) *
                           int64_t(dtype_size(m.dtype)))};
}
bool overlap(const Mat& x, const Mat& y) {
  const auto [x0, x1] = span(x);
  const auto [y0, y1] = span(y);
  return x0 < y1 && y0 < x1;
}

}  // namespace

const GemmLt::Plan& GemmLt::plan_for(const Key& key, cudaStream_t s, void* workspace,
                                     size_t workspace_bytes, Mat c, Mat a, Mat b, float alpha,
                                     float beta) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return *it->second;
  auto plan = make_plan(key);
  // Tuning runs the problem on the caller's buffers, so only where that is harmless: c is
  // overwritten (beta 0) and is not an input.
  const bool tune = tune_ && beta == 0.f && !overlap(c, a) && !overlap(c, b);
  const auto cands = candidates(key, *plan, workspace_bytes, tune ? kTuneCandidates : 1);
  plan->algo = cands.front().algo;
  if (tune && cands.size() > 1) {
    const float first = time_algo(s, workspace, workspace_bytes, *plan, cands[0].algo, c, a, b,
                                  alpha, beta, kTuneReps, INFINITY);
    float best = first;
    for (size_t i = 1; i < cands.size(); ++i) {
      const float t = time_algo(s, workspace, workspace_bytes, *plan, cands[i].algo, c, a, b,
                                alpha, beta, kTuneReps, 1.5f * best);
      // Another kernel only for a clear win: timing noise must not flip the choice run to run.
      if (t < best && t < (1.f - kTuneMinGain) * first) {
        best = t;
        plan->algo = cands[i].algo;
      }
    }
  }
  return *plans_.emplace(key, std::move(plan)).first->second;
}

GemmLt::Key GemmLt::key_of(Mat c, Mat a, Trans ta, Mat b, Trans tb) {
  const int64_t M = c.rows, N = c.cols;
  const int64_t K = ta == Trans::no ? a.cols : a.rows;
  // A single row may carry ld < cols; cuBLASLt wants ld >= the stored row length.
  auto ld = [](const Mat& m) { return std::max<int64_t>(std::max(m.ld, m.cols), 1); };
  return Key{M, N, K, ld(a), ld(b), ld(c), ta == Trans::yes, tb == Trans::yes, int(c.dtype),
             pointer_alignment(a.data), pointer_alignment(b.data), pointer_alignment(c.data)};
}

std::vector<GemmLt::AlgoTime> GemmLt::time_candidates(cudaStream_t s, void* workspace,
                                                      size_t workspace_bytes, Mat c, Mat a,
                                                      Trans ta, Mat b, Trans tb, float alpha,
                                                      float beta, int max_count, int reps) {
  const Key key = key_of(c, a, ta, b, tb);
  const auto plan = make_plan(key);
  const auto cands = candidates(key, *plan, workspace_bytes, max_count);
  std::vector<AlgoTime> out;
  for (size_t i = 0; i < cands.size(); ++i) {
    const float ms = time_algo(s, workspace, workspace_bytes, *plan, cands[i].algo, c, a, b,
                               alpha, beta, reps, out.empty() ? INFINITY : 2 * out.front().ms);
    if (!std::isfinite(ms)) continue;
    int tile = 0, stages = 0, splitk = 0, algo_id = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&cands[i].algo, CUBLASLT_ALGO_CONFIG_ID, &algo_id,
                                         sizeof(algo_id), nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(&cands[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile,
                                         sizeof(tile), nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(&cands[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                         sizeof(stages), nullptr);
    cublasLtMatmulAlgoConfigGetAttribute(&cands[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM,
                                         &splitk, sizeof(splitk), nullptr);
    out.push_back({int(i), ms, algo_id, tile, stages, splitk});
  }
  return out;
}

void GemmLt::run(cudaStream_t s, void* workspace, size_t workspace_bytes, Mat c, Mat a, Trans ta,
                 Mat b, Trans tb, float alpha, float beta) {
  const Key key = key_of(c, a, ta, b, tb);
  const Plan* plan;
  {
    std::lock_guard<std::mutex> lock(mu_);
    plan = &plan_for(key, s, workspace, workspace_bytes, c, a, b, alpha, beta);
  }
  CUBLAS_CHECK(cublasLtMatmul(handle_, plan->desc, &alpha, b.data, plan->la, a.data, plan->lb,
                              &beta, c.data, plan->lc, c.data, plan->lc, &plan->algo, workspace,
                              workspace_bytes, s));
}

}  // namespace sf::cuda
