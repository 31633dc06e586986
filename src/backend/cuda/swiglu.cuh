// Launchers for SwiGLU (kernels in swiglu.cu), bf16 in and out, math in f32.
//   forward : out (overwrite) = silu(gate) * up, silu(g) = g / (1 + exp(-g))
//   backward: dgate = dout * up * sig * (1 + g * (1 - sig)), dup = dout * silu(g) (overwrite);
//             every element is read before it is written, so dgate/dup may alias gate/up/dout.
// gate and up are usually strided column blocks of the fused [T, 2F] gate_up output.
#pragma once
#include <cuda_runtime.h>

#include "backend/backend.h"

namespace sf::cuda {

void launch_swiglu_forward(cudaStream_t s, Mat out, Mat gate, Mat up);
void launch_swiglu_backward(cudaStream_t s, Mat dgate, Mat dup, Mat dout, Mat gate, Mat up);

}  // namespace sf::cuda
