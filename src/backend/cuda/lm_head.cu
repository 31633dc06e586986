// Cross-entropy row kernels of the fused LM head (contract in lm_head.cuh).
#include <cmath>

#include "backend/cuda/common.cuh"
#include "backend/cuda/lm_head.cuh"

namespace sf::cuda {
namespace {

constexpr int kCeThreads = 512;
constexpr int32_t kIgnore = -100;

// Merge two (max, sum of exp(x - max)) pairs.
__device__ __forceinline__ void lse_merge(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  if (mn == -INFINITY) return;  // both empty
  s = (m == -INFINITY ? 0.f : s * __expf(m - mn)) + (m2 == -INFINITY ? 0.f : s2 * __expf(m2 - mn));
  m = mn;
}

// One block per row. VW = 4: float4 reads (V % 4 == 0, 16-byte aligned rows).
template <int VW>
__global__ void __launch_bounds__(kCeThreads)
    ce_rows_kernel(float* logits, int64_t ld, int64_t V, const int32_t* labels, float grad_scale,
                   bool want_grad) {
  __shared__ float red_m[kCeThreads / 32], red_s[kCeThreads / 32];
  __shared__ float row_lse;
  float* z = logits + int64_t(blockIdx.x) * ld;
  const int32_t label = labels[blockIdx.x];

  // Pass 1: online max / sum of exponentials.
  float m = -INFINITY, s = 0.f;
  for (int64_t j = int64_t(threadIdx.x) * VW; j < V; j += int64_t(kCeThreads) * VW) {
    float v[VW];
    if constexpr (VW == 4) {
      const float4 f = *reinterpret_cast<const float4*>(z + j);
      v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
    } else {
      v[0] = z[j];
    }
#pragma unroll
    for (int k = 0; k < VW; ++k) {
      if (v[k] > m) {
        s = s * __expf(m - v[k]) + 1.f;
        m = v[k];
      } else {
        s += __expf(v[k] - m);
      }
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
    lse_merge(m, s, m2, s2);
  }
  if ((threadIdx.x & 31) == 0) {
    red_m[threadIdx.x >> 5] = m;
    red_s[threadIdx.x >> 5] = s;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float bm = red_m[0], bs = red_s[0];
    for (int w = 1; w < kCeThreads / 32; ++w) lse_merge(bm, bs, red_m[w], red_s[w]);
    row_lse = bm + logf(bs);
  }
  __syncthreads();
  const float lse = row_lse;
  const bool ignored = label == kIgnore;
  const bool valid = label >= 0 && label < V;
  // Only thread 0 needs it; read before its first pass-2 barrier, i.e. before any bf16 store.
  const float z_label = threadIdx.x == 0 && valid ? z[label] : 0.f;

  if (want_grad) {
    // Pass 2, tile by tile: the bf16 values of tile k land on f32 elements [k*tile/2,
    // (k+1)*tile/2), all read no later than tile k; the barrier orders those reads first.
    bf16* d = reinterpret_cast<bf16*>(z);
    for (int64_t base = 0; base < V; base += int64_t(kCeThreads) * VW) {
      const int64_t j = base + int64_t(threadIdx.x) * VW;
      float v[VW];
      const bool ok = j < V;
      if (ok) {
        if constexpr (VW == 4) {
          const float4 f = *reinterpret_cast<const float4*>(z + j);
          v[0] = f.x; v[1] = f.y; v[2] = f.z; v[3] = f.w;
        } else {
          v[0] = z[j];
        }
      }
      __syncthreads();
      if (ok) {
#pragma unroll
        for (int k = 0; k < VW; ++k) {
          const float p = __expf(v[k] - lse);
          v[k] = ignored ? 0.f : grad_scale * (j + k == label ? p - 1.f : p);
        }
        if constexpr (VW == 4) {
          uint2 u;
          reinterpret_cast<__nv_bfloat162*>(&u)[0] = __floats2bfloat162_rn(v[0], v[1]);
          reinterpret_cast<__nv_bfloat162*>(&u)[1] = __floats2bfloat162_rn(v[2], v[3]);
          *reinterpret_cast<uint2*>(d + j) = u;
        } else {
          d[j] = __float2bfloat16_rn(v[0]);
        }
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) z[V - 1] = ignored ? 0.f : (valid ? lse - z_label : NAN);
}

// One block: loss_sum += sum of the row losses (element V-1 of each row), in double, each
// thread over a contiguous slice and then the slices in thread order (fixed for a given n).
__global__ void ce_loss_sum_kernel(float* loss_sum, const float* logits, int64_t ld, int64_t V,
                                   int64_t n) {
  __shared__ double part[256];
  const int64_t per = (n + blockDim.x - 1) / blockDim.x;
  const int64_t r0 = threadIdx.x * per, r1 = min(n, r0 + per);
  double acc = 0.0;
  for (int64_t r = r0; r < r1; ++r) acc += double(logits[r * ld + V - 1]);
  part[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int i = 0; i < int(blockDim.x); ++i) t += part[i];
    *loss_sum = float(double(*loss_sum) + t);
  }
}

}  // namespace

void launch_ce_rows(cudaStream_t s, Mat logits, const int32_t* labels, float grad_scale,
                    bool want_grad) {
  NVTX_RANGE("ce_rows");
  check_mat(logits, DType::f32, -1, -1, "lm_head_loss", "scratch");
  SF_CHECK(logits.cols >= 2, "cuda lm_head_loss: vocabulary of ", logits.cols, " is too small");
  if (logits.rows == 0) return;
  const bool vec = logits.cols % 4 == 0 && (logits.rows <= 1 || logits.ld % 4 == 0) &&
                   reinterpret_cast<uintptr_t>(logits.data) % 16 == 0;
  if (vec)
    ce_rows_kernel<4><<<unsigned(logits.rows), kCeThreads, 0, s>>>(
        logits.as<float>(), logits.ld, logits.cols, labels, grad_scale, want_grad);
  else
    ce_rows_kernel<1><<<unsigned(logits.rows), kCeThreads, 0, s>>>(
        logits.as<float>(), logits.ld, logits.cols, labels, grad_scale, want_grad);
  CUDA_CHECK_LAUNCH();
}

void launch_ce_loss_sum(cudaStream_t s, float* loss_sum, Mat logits) {
  NVTX_RANGE("ce_loss_sum");
  if (logits.rows == 0) return;
  ce_loss_sum_kernel<<<1, 256, 0, s>>>(loss_sum, logits.as<const float>(), logits.ld,
                                        logits.cols, logits.rows);
  CUDA_CHECK_LAUNCH();
}

}  // namespace sf::cuda
