// RoPE forward/backward (contract in rope.cuh). One thread per (token, VW-wide chunk of the
// first half, block of up to 8 heads): the VW sin/cos pairs are computed once (precise sincosf,
// angles reach thousands of radians) and reused for every head of the block.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/rope.cuh"

namespace sf::cuda {
namespace {

constexpr int kHeadsPerThread = 8;

template <int VW>
__global__ void rope_kernel(bf16* x, int64_t ld, int64_t rows, int n_heads, int head_dim,
                            const int32_t* pos, const float* inv_freq, float sign) {
  const int half = head_dim / 2;
  const int chunks = half / VW;
  const int head_blocks = (n_heads + kHeadsPerThread - 1) / kHeadsPerThread;
  const int64_t per_row = int64_t(chunks) * head_blocks;
  const int64_t n = rows * per_row;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / per_row;
    const int rem = int(i - t * per_row);
    const int hb = rem / chunks, c = (rem - hb * chunks) * VW;
    const float p = float(pos[t]);
    float cs[VW], sn[VW];
#pragma unroll
    for (int k = 0; k < VW; ++k) {
      sincosf(p * inv_freq[c + k], &sn[k], &cs[k]);
      sn[k] *= sign;
    }
    const int h1 = min(n_heads, (hb + 1) * kHeadsPerThread);
    for (int h = hb * kHeadsPerThread; h < h1; ++h) {
      bf16* x1 = x + t * ld + int64_t(h) * head_dim + c;
      bf16* x2 = x1 + half;
      float a[VW], b[VW];
      loadv<VW>(x1, a);
      loadv<VW>(x2, b);
#pragma unroll
      for (int k = 0; k < VW; ++k) {
        const float u = a[k], v = b[k];
        a[k] = u * cs[k] - v * sn[k];
        b[k] = v * cs[k] + u * sn[k];
      }
      storev<VW>(x1, a);
      storev<VW>(x2, b);
    }
  }
}

}  // namespace

void launch_rope(cudaStream_t s, Mat x, int n_heads, int head_dim, const int32_t* pos,
                 const float* inv_freq, bool backward) {
  NVTX_RANGE(backward ? "rope_backward" : "rope_forward");
  const char* op = backward ? "rope_backward" : "rope_forward";
  check_mat(x, DType::bf16, -1, int64_t(n_heads) * head_dim, op, "x");
  SF_CHECK(n_heads > 0 && head_dim > 0 && head_dim % 2 == 0, "cuda ", op, ": n_heads ", n_heads,
           ", head_dim ", head_dim, " (head_dim must be even)");
  SF_CHECK((pos && inv_freq) || x.rows == 0, "cuda ", op, ": null positions or inv_freq");
  if (x.rows == 0) return;
  const int half = head_dim / 2;
  const bool vec = half % 8 == 0 && vec8_ok(x);
  const int head_blocks = (n_heads + kHeadsPerThread - 1) / kHeadsPerThread;
  const int64_t work = x.rows * head_blocks * (vec ? half / 8 : half);
  const float sign = backward ? -1.f : 1.f;
  if (vec)
    rope_kernel<8><<<grid_for(work, 256), 256, 0, s>>>(x.as<bf16>(), x.ld, x.rows, n_heads,
                                                       head_dim, pos, inv_freq, sign);
  else
    rope_kernel<1><<<grid_for(work, 256), 256, 0, s>>>(x.as<bf16>(), x.ld, x.rows, n_heads,
                                                       head_dim, pos, inv_freq, sign);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sf::cuda
