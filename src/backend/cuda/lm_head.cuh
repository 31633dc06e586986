// Kernels of the fused, chunked LM head + cross-entropy (lm_head.cu); CudaBackend::lm_head_loss
// drives them around three cuBLASLt GEMMs per chunk of n = scratch.rows tokens:
//   1. logits[n, V] (f32, in the scratch) = h_chunk @ W^T
//   2. launch_ce_rows: per row, lse = logsumexp(logits); loss = lse - logit[label] (0 for an
//      ignored label, NaN for a label outside [0, V)); when grads are wanted the row's first
//      2V bytes become bf16 dlogits = grad_scale * (softmax - onehot) (zeros for an ignored
//      label), written in place tile by tile behind a barrier; the row's last f32 element
//      (never reached by the bf16 half) holds the row's loss.
//   3. launch_ce_loss_sum: *loss_sum (accumulate) += the n row losses, in order, in double.
//   4. dh_chunk (overwrite) = dlogits @ W; dW (f32, accumulate) += dlogits^T @ h_chunk.
// Extra memory: none beyond the caller's [chunk, V] f32 scratch.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"

namespace sf::cuda {

void launch_ce_rows(cudaStream_t s, Mat logits, const int32_t* labels, float grad_scale,
                    bool want_grad);
void launch_ce_loss_sum(cudaStream_t s, float* loss_sum, Mat logits);
// The bf16 dlogits view that launch_ce_rows leaves in the scratch rows.
inline Mat ce_dlogits_view(const Mat& logits) {
  return Mat(logits.data, DType::bf16, logits.rows, logits.cols, 2 * logits.ld);
}

}  // namespace sf::cuda
