// GEMM through cuBLASLt with row-major semantics (the Backend::gemm contract):
//   c = alpha * op(a) @ op(b) + beta * c,  a, b bf16;  c bf16 or f32;  fp32 accumulation.
// One handle per GemmLt. Descriptors, layouts and the algorithm are cached per problem (shape,
// transposes, strides, dtypes, pointer alignment), so a call allocates nothing; the workspace
// is the caller's (one per stream, allocated once).
//
// The algorithm: cuBLASLt's heuristic ranks candidates, and its first choice is 2-7% slower
// than another of its first eight for several of the layer GEMMs on the H200, timed alone
// (bench_cuda_kernels --only gemm_algos). With tuning on (CudaBackend: SF_GEMM_TUNE=1) the
// first call of a problem that overwrites c (beta 0, c not an input) times those eight on the
// call's own buffers and keeps the fastest, if it is >= 3% faster than the first choice (the
// once-per-problem cost: ~30 runs, synchronising the stream). Problems that accumulate into c
// keep the heuristic's choice: timing would add into c.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"

namespace sf::cuda {

class GemmLt {
 public:
  explicit GemmLt(bool tune = false);
  ~GemmLt();
  GemmLt(const GemmLt&) = delete;
  GemmLt& operator=(const GemmLt&) = delete;

  void run(cudaStream_t s, void* workspace, size_t workspace_bytes, Mat c, Mat a, Trans ta, Mat b,
           Trans tb, float alpha, float beta);
  size_t cached_plans() const;

  // Measurement aid (bench_cuda_kernels' gemm_algos group): times up to max_count of the
  // heuristic's candidates for this problem on the given buffers (c is overwritten, several
  // times: with beta != 0 its contents are garbage afterwards). Index 0 is what run() uses.
  struct AlgoTime {
    int index;   // rank in the heuristic's list
    float ms;    // median of reps
    int algo_id, tile, stages, splitk;
  };
  std::vector<AlgoTime> time_candidates(cudaStream_t s, void* workspace, size_t workspace_bytes,
                                        Mat c, Mat a, Trans ta, Mat b, Trans tb, float alpha,
                                        float beta, int max_count, int reps);

 private:
  struct Key {
    int64_t m, n, k, lda, ldb, ldc;
    int ta, tb, c_dtype, align_a, align_b, align_c;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Plan;
  static Key key_of(Mat c, Mat a, Trans ta, Mat b, Trans tb);
  std::unique_ptr<Plan> make_plan(const Key& key);
  std::vector<cublasLtMatmulHeuristicResult_t> candidates(const Key& key, const Plan& plan,
                                                          size_t workspace_bytes, int max_count);
  const Plan& plan_for(const Key& key, cudaStream_t s, void* workspace, size_t workspace_bytes,
                       Mat c, Mat a, Mat b, float alpha, float beta);
  // Median of reps timed runs after a warm-up (INFINITY if the algorithm refuses); stops after
  // one timed run longer than give_up_ms.
  float time_algo(cudaStream_t s, void* workspace, size_t workspace_bytes, const Plan& plan,
                  const cublasLtMatmulAlgo_t& algo, Mat c, Mat a, Mat b, float alpha, float beta,
                  int reps, float give_up_ms);

  static constexpr int kTuneCandidates = 8, kTuneReps = 3;
  static constexpr float kTuneMinGain = 0.03f;
  bool tune_;

  cublasLtHandle_t handle_ = nullptr;
  mutable std::mutex mu_;
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans_;
};

}  // namespace sf::cuda
