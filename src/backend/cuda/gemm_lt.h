// GEMM through cuBLASLt with row-major semantics (the Backend::gemm contract):
//   c = alpha * op(a) @ op(b) + beta * c,  a, b bf16;  c bf16 or f32;  fp32 accumulation.
// One handle per GemmLt. Descriptors, layouts and the heuristic's algorithm are cached per
// problem (shape, transposes, strides, dtypes, pointer alignment), so a call allocates
// nothing; the workspace is the caller's (one per stream, allocated once).
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
  GemmLt();
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
  const Plan& plan_for(const Key& key, size_t workspace_bytes);

  cublasLtHandle_t handle_ = nullptr;
  mutable std::mutex mu_;
  std::unordered_map<Key, std::unique_ptr<Plan>, KeyHash> plans_;
};

}  // namespace sf::cuda
