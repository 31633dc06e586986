// The cuDNN attention helper kernels (contracts in cudnn_attention_aux.cuh).
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cudnn_attention_aux.cuh"
#include "core/error.h"

namespace sf::cuda {
namespace {

struct MetaArgs {
  const int32_t* cu;
  int32_t* seq_len;
  int64_t* offsets;
  int64_t ld[kCudnnMaxRaggedTensors];
  int n_seqs, B, n_tensors;
};

// One thread per bucket entry b in [0, B].
__global__ void meta_kernel(MetaArgs a) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b > a.B) return;
  const int bc = b < a.n_seqs ? b : a.n_seqs;
  const int64_t row = a.cu[bc];
  if (b < a.B) a.seq_len[b] = b < a.n_seqs ? a.cu[b + 1] - a.cu[b] : 0;
  for (int j = 0; j < a.n_tensors; ++j) a.offsets[int64_t(j) * (a.B + 1) + b] = row * a.ld[j];
}

// grid (S / 256, sequences, heads).
__global__ void stats_to_lse_kernel(float* lse, const float* stats, const int32_t* cu, int H,
                                    int S, int64_t T) {
  const int b = blockIdx.y, h = blockIdx.z;
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  const int start = cu[b], len = cu[b + 1] - start;
  if (s >= len) return;
  lse[int64_t(h) * T + start + s] = stats[(int64_t(b) * H + h) * S + s];
}

// grid (S / 256, bucket entries, heads).
__global__ void lse_to_stats_kernel(float* stats, const float* lse, const int32_t* cu,
                                    int n_seqs, int H, int S, int64_t T) {
  const int b = blockIdx.y, h = blockIdx.z;
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= S) return;
  float v = 0.f;
  if (b < n_seqs) {
    const int start = cu[b];
    if (s < cu[b + 1] - start) v = lse[int64_t(h) * T + start + s];
  }
  stats[(int64_t(b) * H + h) * S + s] = v;
}

constexpr int kThreads = 256;

}  // namespace

void launch_cudnn_attention_meta(cudaStream_t s, const int32_t* cu, int n_seqs, int B,
                                 int32_t* seq_len, int64_t* offsets, const int64_t* lds,
                                 int n_tensors) {
  SF_CHECK(n_tensors >= 0 && n_tensors <= kCudnnMaxRaggedTensors && n_seqs >= 1 && B >= n_seqs,
           "cudnn attention meta: ", n_tensors, " tensors, ", n_seqs, " sequences, bucket ", B);
  MetaArgs a{};
  a.cu = cu;
  a.seq_len = seq_len;
  a.offsets = offsets;
  for (int j = 0; j < n_tensors; ++j) a.ld[j] = lds[j];
  a.n_seqs = n_seqs;
  a.B = B;
  a.n_tensors = n_tensors;
  meta_kernel<<<unsigned((B + 1 + kThreads - 1) / kThreads), kThreads, 0, s>>>(a);
  CUDA_CHECK_LAUNCH();
}

void launch_cudnn_stats_to_lse(cudaStream_t s, float* lse, const float* stats,
                               const int32_t* cu, int n_seqs, int H, int S, int64_t T) {
  const dim3 grid(unsigned((S + kThreads - 1) / kThreads), unsigned(n_seqs), unsigned(H));
  stats_to_lse_kernel<<<grid, kThreads, 0, s>>>(lse, stats, cu, H, S, T);
  CUDA_CHECK_LAUNCH();
}

void launch_cudnn_lse_to_stats(cudaStream_t s, float* stats, const float* lse,
                               const int32_t* cu, int n_seqs, int B, int H, int S, int64_t T) {
  const dim3 grid(unsigned((S + kThreads - 1) / kThreads), unsigned(B), unsigned(H));
  lse_to_stats_kernel<<<grid, kThreads, 0, s>>>(stats, lse, cu, n_seqs, H, S, T);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sf::cuda
