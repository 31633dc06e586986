// Launchers for elementwise ops, reductions and the GPU AdamW step (kernels in elementwise.cu).
// Every launcher enqueues on `s`, checks the launch and opens an NVTX range.
//   cast          dst (overwrite) = src converted (f32 / bf16 / f16, any pair)
//   axpy          dst (accumulate) += alpha * src (dst f32 or bf16; src f32 / bf16 / f16)
//   scale         x (overwrite) = beta * x (beta == 0 writes zeros, NaN-safe)
//   sum_squares   *out (accumulate) += sum of x^2; deterministic two-stage reduction
//   bias_add      x[T,N] (in place) += bias[1,N] (bf16)
//   bias_backward dbias[1,N] (f32, accumulate) += column sums of dy[T,N]; deterministic
//   colsum_finish dst[c] (accumulate) += sum over s of partial[s, c], in a fixed order
//   adamw         param/m/v updated in place, weights_out (bf16, overwrite) when non-null
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/backend.h"
#include "backend/cuda/workspace.h"

namespace sf::cuda {

void launch_cast(cudaStream_t s, Mat dst, Mat src);
void launch_axpy(cudaStream_t s, Mat dst, Mat src, float alpha);
void launch_scale(cudaStream_t s, Mat x, float beta);
void launch_sum_squares(cudaStream_t s, float* out, Mat x, const Workspace& ws);
void launch_bias_add(cudaStream_t s, Mat x, Mat bias);
void launch_bias_backward(cudaStream_t s, Mat dbias, Mat dy, const Workspace& ws);
void launch_colsum_finish(cudaStream_t s, float* dst, const float* partial, int splits,
                          int64_t cols);
void launch_adamw(cudaStream_t s, float* param, float* m, float* v, const float* grad,
                  void* weights_out, int64_t n, const AdamWStep& step);

}  // namespace sf::cuda
