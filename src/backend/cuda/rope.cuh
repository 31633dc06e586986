// Launchers for rotary position embedding (kernels in rope.cu), Hugging Face rotate_half
// convention, in place on bf16 x[T, H*D] (may be a strided column block of the qkv output):
// for head h and i < D/2, angle = float(pos[t]) * inv_freq[i],
//   forward : (x_i, x_{i+D/2}) -> (x_i c - x_{i+D/2} s, x_{i+D/2} c + x_i s)
//   backward: rotation by -angle (the transpose).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"

namespace sf::cuda {

void launch_rope(cudaStream_t s, Mat x, int n_heads, int head_dim, const int32_t* pos,
                 const float* inv_freq, bool backward);

}  // namespace sf::cuda
