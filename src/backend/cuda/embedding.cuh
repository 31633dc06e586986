// Launchers for the token embedding (kernels in embedding.cu).
//   forward : out[T, C] (bf16, overwrite) = table[ids[t], :] (bf16, or f32 rounded to nearest
//             even: a mapped host master is read over PCIe). An id outside [0, V) writes a NaN row (the loss then shows it) instead of reading out of bounds;
//             Batch::validate rejects such ids on the host first.
//   backward: dtable[V, C] (f32, accumulate) [ids[t], :] += dout[t, :] (bf16). Deterministic:
//             the block of the first occurrence of an id adds every occurrence in token order
//             (the host reference's order), so no atomics. Cost O(T^2) id compares (L2-resident).
//             Tokens with an id < 0 are skipped (a scatter into a block of rows).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"

namespace sf::cuda {

void launch_embedding_forward(cudaStream_t s, Mat out, const int32_t* ids, Mat table);
void launch_embedding_backward(cudaStream_t s, Mat dtable, const int32_t* ids, Mat dout);

}  // namespace sf::cuda
