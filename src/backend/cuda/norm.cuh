// Launchers for RMSNorm (kernels in norm.cu), bf16 activations, f32 statistics.
// Groups: w is [1, D] and x is [T, G*D] (G >= 1); every D-wide group of a row is normalised on
// its own and rstd holds T*G entries in (t, g) order. G == 1 is a plain row norm; G == heads
// is Qwen3's per-head q/k norm, also on a strided column block of the fused qkv output.
//   rmsnorm_forward      out (overwrite) = w * (x * rstd); rstd (overwrite, may be null)
//   add_rmsnorm_forward  sum (overwrite, bf16, may alias a or b) = a + b, then out = norm(sum)
//   rmsnorm_backward     dx (overwrite; may alias dout, x or dres) = norm'^T dout (+ dres);
//                        dw (f32, accumulate, may be empty) += sum over rows of dout * x * rstd,
//                        deterministic (per-block partials in the workspace, ordered finish)
#pragma once
#include <cuda_runtime.h>

#include "backend/backend.h"
#include "backend/cuda/workspace.h"

namespace sf::cuda {

void launch_rmsnorm_forward(cudaStream_t s, Mat out, float* rstd, Mat x, Mat w, float eps);
void launch_add_rmsnorm_forward(cudaStream_t s, Mat sum, Mat out, float* rstd, Mat a, Mat b,
                                Mat w, float eps);
void launch_rmsnorm_backward(cudaStream_t s, Mat dx, Mat dw, Mat dout, Mat x, Mat w,
                             const float* rstd, Mat dres, const Workspace& ws);

}  // namespace sf::cuda
