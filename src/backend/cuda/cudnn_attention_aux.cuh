// Small kernels around the cuDNN attention graph (cudnn_attention.cpp): the per-call inputs
// cuDNN reads for packed sequences, and the conversion between cuDNN's padded softmax
// statistics and our lse layout. All read cu_seqlens on the device (no host sync).
//   meta:          seq_len[B] (overwrite) = cu[b+1] - cu[b] for b < n_seqs, 0 for the bucket's
//                  padding; offsets[j][B+1] (int64, overwrite) = cu[min(b, n_seqs)] * ld[j],
//                  the element offset of sequence b's first row in tensor j.
//   stats_to_lse:  lse[h, cu[b] + s] (overwrite) = stats[b, h, s] for s < len(b).
//   lse_to_stats:  stats[b, h, s] (overwrite, the whole [B, H, S]) = lse[h, cu[b] + s] for
//                  s < len(b), b < n_seqs; 0 in the padding (finite: masked rows stay finite).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace sf::cuda {

constexpr int kCudnnMaxRaggedTensors = 8;

void launch_cudnn_attention_meta(cudaStream_t s, const int32_t* cu, int n_seqs, int B,
                                 int32_t* seq_len, int64_t* offsets, const int64_t* lds,
                                 int n_tensors);
void launch_cudnn_stats_to_lse(cudaStream_t s, float* lse, const float* stats,
                               const int32_t* cu, int n_seqs, int H, int S, int64_t T);
void launch_cudnn_lse_to_stats(cudaStream_t s, float* stats, const float* lse,
                               const int32_t* cu, int n_seqs, int B, int H, int S, int64_t T);

}  // namespace sf::cuda
