// Elementwise ops, reductions and the GPU AdamW step (contracts in elementwise.cuh).
// Strided Mats are walked as (row, column) pairs; when every operand is contiguous the view
// is flattened to one row so no division is needed. 8-wide (128-bit for bf16) accesses are used
// when columns, row strides and base pointers allow, a scalar path otherwise. Widening casts
// to f32 of one contiguous run (the common case) use 4-element units instead, with a scalar
// head and tail around the aligned body.
// Reductions are deterministic: per-block partials into the stream's workspace, then one
// ordered pass; results depend only on the shape and the device's multiprocessor count.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/elementwise.cuh"

namespace sf::cuda {
namespace {

// (row, first column) of vector chunk i in a [rows, cols] view walked VW columns at a time.
struct RowCol {
  int64_t r, c;
};
__device__ __forceinline__ RowCol chunk_pos(int64_t i, int64_t cpr, int VW) {
  if (cpr < (int64_t(1) << 31) && i < (int64_t(1) << 32)) {  // 32-bit division is much cheaper
    const uint32_t r = uint32_t(i) / uint32_t(cpr);
    return {int64_t(r), (i - int64_t(r) * cpr) * VW};
  }
  const int64_t r = i / cpr;
  return {r, (i - r * cpr) * VW};
}

// ---- kernels ------------------------------------------------------------------------------

// Two chunks per iteration, both loads issued before the stores: a 16-byte bf16 load per
// thread alone does not keep enough bytes in flight to saturate HBM.
template <int VW, class TD, class TS>
__global__ void cast_kernel(TD* dst, int64_t ldd, const TS* src, int64_t lds, int64_t rows,
                            int64_t cols) {
  const int64_t cpr = cols / VW, n = rows * cpr, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += 2 * stride) {
    const bool second = i + stride < n;
    const RowCol p = chunk_pos(i, cpr, VW);
    const RowCol q = second ? chunk_pos(i + stride, cpr, VW) : p;
    float v[VW], u[VW];
    loadv<VW>(src + p.r * lds + p.c, v);
    if (second) loadv<VW>(src + q.r * lds + q.c, u);
    storev<VW>(dst + p.r * ldd + p.c, v);
    if (second) storev<VW>(dst + q.r * ldd + q.c, u);
  }
}

// 2-byte floats (bf16 / f16) -> f32 on one contiguous run, src 8-byte and dst 16-byte
// aligned. A unit is 4 elements: an 8-byte load and a 16-byte store, so each warp access is
// one contiguous span (store8's two float4s at a 32-byte stride would write every sector
// half at a time, twice the store transactions). U units per thread are loaded before any is
// stored; the output is write-once data far larger than L2, hence the streaming hints.
template <class TS, int U>
__global__ void __launch_bounds__(256)
    cast_widen_kernel(float* __restrict__ dst, const TS* __restrict__ src, int64_t units) {
  const int64_t tile = int64_t(blockDim.x) * U;
  const uint2* in = reinterpret_cast<const uint2*>(src);
  float4* out = reinterpret_cast<float4*>(dst);
  for (int64_t base = int64_t(blockIdx.x) * tile + threadIdx.x; base < units;
       base += int64_t(gridDim.x) * tile) {
    uint2 v[U];
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int64_t u = base + int64_t(k) * blockDim.x;
      v[k] = u < units ? __ldcs(in + u) : make_uint2(0u, 0u);
    }
#pragma unroll
    for (int k = 0; k < U; ++k) {
      const int64_t u = base + int64_t(k) * blockDim.x;
      if (u >= units) continue;
      const TS* h = reinterpret_cast<const TS*>(&v[k]);
      __stcs(out + u, make_float4(to_f32(h[0]), to_f32(h[1]), to_f32(h[2]), to_f32(h[3])));
    }
  }
}

template <int VW, class TD, class TS>
__global__ void axpy_kernel(TD* dst, int64_t ldd, const TS* src, int64_t lds, int64_t rows,
                            int64_t cols, float alpha) {
  const int64_t cpr = cols / VW, n = rows * cpr;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const RowCol p = chunk_pos(i, cpr, VW);
    float a[VW], d[VW];
    loadv<VW>(src + p.r * lds + p.c, a);
    loadv<VW>(dst + p.r * ldd + p.c, d);
    // Unfused multiply then add: the same two roundings as the host reference.
#pragma unroll
    for (int k = 0; k < VW; ++k) d[k] = __fadd_rn(d[k], __fmul_rn(alpha, a[k]));
    storev<VW>(dst + p.r * ldd + p.c, d);
  }
}

template <int VW, class T>
__global__ void scale_kernel(T* x, int64_t ld, int64_t rows, int64_t cols, float beta) {
  const int64_t cpr = cols / VW, n = rows * cpr;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const RowCol p = chunk_pos(i, cpr, VW);
    float v[VW];
    if (beta == 0.f) {
#pragma unroll
      for (int k = 0; k < VW; ++k) v[k] = 0.f;
    } else {
      loadv<VW>(x + p.r * ld + p.c, v);
#pragma unroll
      for (int k = 0; k < VW; ++k) v[k] *= beta;
    }
    storev<VW>(x + p.r * ld + p.c, v);
  }
}

// One f32 partial sum of squares per block.
template <int VW, class T>
__global__ void sum_squares_partial_kernel(float* partial, const T* x, int64_t ld, int64_t rows,
                                           int64_t cols) {
  __shared__ float red[32];
  const int64_t cpr = cols / VW, n = rows * cpr;
  float acc = 0.f;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const RowCol p = chunk_pos(i, cpr, VW);
    float v[VW];
    loadv<VW>(x + p.r * ld + p.c, v);
#pragma unroll
    for (int k = 0; k < VW; ++k) acc += v[k] * v[k];
  }
  acc = block_sum(acc, red);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// One block: out += sum of the partials, added in double in a fixed tree order.
__global__ void sum_partials_kernel(float* out, const float* partial, int n) {
  __shared__ double red[32];
  double acc = 0.0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) acc += double(partial[i]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0.0;
    for (int w = 0; w < int(blockDim.x >> 5); ++w) t += red[w];
    *out = float(double(*out) + t);
  }
}

template <int VW>
__global__ void bias_add_kernel(bf16* x, int64_t ld, const bf16* bias, int64_t rows,
                                int64_t cols) {
  const int64_t cpr = cols / VW, n = rows * cpr;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const RowCol p = chunk_pos(i, cpr, VW);
    float v[VW], b[VW];
    loadv<VW>(x + p.r * ld + p.c, v);
    loadv<VW>(bias + p.c, b);
#pragma unroll
    for (int k = 0; k < VW; ++k) v[k] += b[k];
    storev<VW>(x + p.r * ld + p.c, v);
  }
}

// Column sums of y[rows, cols] over row split blockIdx.y: block (32, 8) covers 32*VW columns;
// partial[split, c] (overwrite).
template <int VW, class T>
__global__ void colsum_partial_kernel(float* partial, const T* y, int64_t ld, int64_t rows,
                                      int64_t cols, int64_t rows_per_split) {
  __shared__ float red[8][32 * VW];
  const int64_t c = (int64_t(blockIdx.x) * 32 + threadIdx.x) * VW;
  const int64_t r0 = int64_t(blockIdx.y) * rows_per_split;
  const int64_t r1 = min(rows, r0 + rows_per_split);
  float acc[VW];
#pragma unroll
  for (int k = 0; k < VW; ++k) acc[k] = 0.f;
  if (c < cols)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) {
      float v[VW];
      loadv<VW>(y + r * ld + c, v);
#pragma unroll
      for (int k = 0; k < VW; ++k) acc[k] += v[k];
    }
#pragma unroll
  for (int k = 0; k < VW; ++k) red[threadIdx.y][threadIdx.x * VW + k] = acc[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
#pragma unroll
    for (int k = 0; k < VW; ++k) {
      float s = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) s += red[j][threadIdx.x * VW + k];
      partial[int64_t(blockIdx.y) * cols + c + k] = s;
    }
  }
}

// Block (32, kFinishRows): 32 columns; thread row y sums splits y, y + kFinishRows, ... in
// order, then row 0 adds the kFinishRows sums in order (a fixed order: deterministic). Many
// threads per column keep enough loads in flight when splits is in the hundreds.
constexpr int kFinishRows = 16;
__global__ void __launch_bounds__(32 * kFinishRows)
    colsum_finish_kernel(float* dst, const float* partial, int splits, int64_t cols) {
  __shared__ float red[kFinishRows][33];
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.f;
  if (c < cols) {
    int k = threadIdx.y;
    for (; k + 3 * kFinishRows < splits; k += 4 * kFinishRows) {  // 4 loads in flight
      const float a = partial[int64_t(k) * cols + c];
      const float b = partial[int64_t(k + kFinishRows) * cols + c];
      const float d = partial[int64_t(k + 2 * kFinishRows) * cols + c];
      const float e = partial[int64_t(k + 3 * kFinishRows) * cols + c];
      s += a;
      s += b;
      s += d;
      s += e;
    }
    for (; k < splits; k += kFinishRows) s += partial[int64_t(k) * cols + c];
  }
  red[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0.f;
#pragma unroll
    for (int y = 0; y < kFinishRows; ++y) t += red[y][threadIdx.x];
    dst[c] += t;
  }
}

struct AdamWArgs {
  float beta1, beta2, one_minus_beta1, one_minus_beta2, eps, grad_scale, decay, step_size,
      bc2_sqrt;
};

// Exactly the reference formula, operation by operation; the _rn intrinsics are never fused
// into FMAs, so the result is bitwise equal to a plain fp32 host loop.
__device__ __forceinline__ float adamw_one(float& p, float& m, float& v, float grad,
                                           const AdamWArgs& a) {
  const float g = __fmul_rn(grad, a.grad_scale);
  m = __fadd_rn(__fmul_rn(a.beta1, m), __fmul_rn(a.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(a.beta2, v), __fmul_rn(__fmul_rn(a.one_minus_beta2, g), g));
  const float pd = __fmul_rn(p, a.decay);
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), a.bc2_sqrt), a.eps);
  p = __fsub_rn(pd, __fdiv_rn(__fmul_rn(a.step_size, m), denom));
  return p;
}

// VW = 4: float4 accesses (all pointers 16-byte aligned, weights_out 8-byte aligned).
template <int VW>
__global__ void adamw_kernel(float* param, float* m, float* v, const float* grad, bf16* wout,
                             int64_t n_chunks, AdamWArgs a) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n_chunks;
       i += int64_t(gridDim.x) * blockDim.x) {
    if constexpr (VW == 4) {
      float4 p = reinterpret_cast<float4*>(param)[i];
      float4 mm = reinterpret_cast<float4*>(m)[i];
      float4 vv = reinterpret_cast<float4*>(v)[i];
      const float4 g = reinterpret_cast<const float4*>(grad)[i];
      adamw_one(p.x, mm.x, vv.x, g.x, a);
      adamw_one(p.y, mm.y, vv.y, g.y, a);
      adamw_one(p.z, mm.z, vv.z, g.z, a);
      adamw_one(p.w, mm.w, vv.w, g.w, a);
      reinterpret_cast<float4*>(param)[i] = p;
      reinterpret_cast<float4*>(m)[i] = mm;
      reinterpret_cast<float4*>(v)[i] = vv;
      if (wout) {
        uint2 u;
        reinterpret_cast<__nv_bfloat162*>(&u)[0] = __floats2bfloat162_rn(p.x, p.y);
        reinterpret_cast<__nv_bfloat162*>(&u)[1] = __floats2bfloat162_rn(p.z, p.w);
        reinterpret_cast<uint2*>(wout)[i] = u;
      }
    } else {
      float p = param[i], mm = m[i], vv = v[i];
      adamw_one(p, mm, vv, grad[i], a);
      param[i] = p;
      m[i] = mm;
      v[i] = vv;
      if (wout) wout[i] = __float2bfloat16_rn(p);
    }
  }
}

// ---- host helpers ---------------------------------------------------------------------------

constexpr int kThreads = 256;

// Both views contiguous: walk them as one row (no per-element division).
void flatten2(Mat& a, Mat& b) {
  if (a.contiguous() && b.contiguous() && a.numel() > 0) {
    a = Mat(a.data, a.dtype, 1, a.numel());
    b = Mat(b.data, b.dtype, 1, b.numel());
  }
}

bool aligned(const void* p, size_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; }

// One row of 2-byte floats -> f32 through cast_widen_kernel: a scalar head up to the first
// 16-byte aligned dst element, the aligned units, a scalar tail of < 4. False (nothing
// launched) when src and dst cannot be aligned together; the caller then takes the generic path.
bool cast_widen(cudaStream_t s, const Mat& dst, const Mat& src) {
  const int64_t n = src.cols;
  float* d = dst.as<float>();
  if (!aligned(d, 4) || !aligned(src.data, 2)) return false;
  const int64_t head = std::min<int64_t>(
      n, int64_t((16 - reinterpret_cast<uintptr_t>(d) % 16) % 16 / 4));
  const char* s0 = static_cast<const char*>(src.data);
  const size_t es = src.elem_size();
  if (!aligned(s0 + size_t(head) * es, 8)) return false;
  const int64_t units = (n - head) / 4, body_end = head + 4 * units;
  bool ok = true;
  dispatch_float(src.dtype, "cast", "src", [&](auto ts) {
    using TS = decltype(ts);
    if constexpr (std::is_same_v<TS, float>) {
      ok = false;  // not a widening cast (the caller never asks)
    } else {
      const TS* sp = src.as<const TS>();
      auto scalar = [&](int64_t from, int64_t to) {  // elements [from, to) one at a time
        if (to <= from) return;
        cast_kernel<1><<<grid_for(to - from, kThreads), kThreads, 0, s>>>(
            d + from, to - from, sp + from, to - from, 1, to - from);
        CUDA_CHECK_LAUNCH();
      };
      scalar(0, head);
      if (units > 0) {
        constexpr int U = 4;
        const int64_t tiles = (units + int64_t(kThreads) * U - 1) / (int64_t(kThreads) * U);
        const unsigned grid = unsigned(std::min<int64_t>(tiles, int64_t(sm_count()) * 8));
        cast_widen_kernel<TS, U><<<grid, kThreads, 0, s>>>(d + head, sp + head, units);
        CUDA_CHECK_LAUNCH();
      }
      scalar(body_end, n);
    }
  });
  return ok;
}

}  // namespace

// ---- launchers ------------------------------------------------------------------------------

void launch_cast(cudaStream_t s, Mat dst, Mat src) {
  NVTX_RANGE("cast");
  SF_CHECK(dst.rows == src.rows && dst.cols == src.cols, "cuda cast: dst is [", dst.rows, ", ",
           dst.cols, "], src [", src.rows, ", ", src.cols, "]");
  check_mat(dst, dst.dtype, -1, -1, "cast", "dst");
  check_mat(src, src.dtype, -1, -1, "cast", "src");
  if (src.numel() == 0) return;
  flatten2(dst, src);
  const bool widen = dst.dtype == DType::f32 && src.dtype != DType::f32 && dst.rows == 1;
  if (widen && cast_widen(s, dst, src)) return;
  const bool vec = vec8_ok(dst) && vec8_ok(src);
  dispatch_float(dst.dtype, "cast", "dst", [&](auto td) {
    dispatch_float(src.dtype, "cast", "src", [&](auto ts) {
      using TD = decltype(td);
      using TS = decltype(ts);
      if (vec)
        cast_kernel<8><<<grid_for(src.numel() / 8, kThreads), kThreads, 0, s>>>(
            dst.as<TD>(), dst.ld, src.as<const TS>(), src.ld, src.rows, src.cols);
      else
        cast_kernel<1><<<grid_for(src.numel(), kThreads), kThreads, 0, s>>>(
            dst.as<TD>(), dst.ld, src.as<const TS>(), src.ld, src.rows, src.cols);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void launch_axpy(cudaStream_t s, Mat dst, Mat src, float alpha) {
  NVTX_RANGE("axpy");
  SF_CHECK(dst.dtype == DType::f32 || dst.dtype == DType::bf16,
           "cuda axpy: dst must be f32 or bf16, got ", dtype_name(dst.dtype));
  SF_CHECK(dst.rows == src.rows && dst.cols == src.cols, "cuda axpy: dst is [", dst.rows, ", ",
           dst.cols, "], src [", src.rows, ", ", src.cols, "]");
  check_mat(dst, dst.dtype, -1, -1, "axpy", "dst");
  check_mat(src, src.dtype, -1, -1, "axpy", "src");
  if (src.numel() == 0) return;
  flatten2(dst, src);
  const bool vec = vec8_ok(dst) && vec8_ok(src);
  dispatch_float(dst.dtype, "axpy", "dst", [&](auto td) {
    dispatch_float(src.dtype, "axpy", "src", [&](auto ts) {
      using TD = decltype(td);
      using TS = decltype(ts);
      if constexpr (!std::is_same_v<TD, __half>) {
        if (vec)
          axpy_kernel<8><<<grid_for(src.numel() / 8, kThreads), kThreads, 0, s>>>(
              dst.as<TD>(), dst.ld, src.as<const TS>(), src.ld, src.rows, src.cols, alpha);
        else
          axpy_kernel<1><<<grid_for(src.numel(), kThreads), kThreads, 0, s>>>(
              dst.as<TD>(), dst.ld, src.as<const TS>(), src.ld, src.rows, src.cols, alpha);
        CUDA_CHECK_LAUNCH();
      }
    });
  });
}

void launch_scale(cudaStream_t s, Mat x, float beta) {
  NVTX_RANGE("scale");
  check_mat(x, x.dtype, -1, -1, "scale", "x");
  if (x.numel() == 0) return;
  if (x.contiguous()) x = Mat(x.data, x.dtype, 1, x.numel());
  dispatch_float(x.dtype, "scale", "x", [&](auto tx) {
    using T = decltype(tx);
    if (vec8_ok(x))
      scale_kernel<8><<<grid_for(x.numel() / 8, kThreads), kThreads, 0, s>>>(
          x.as<T>(), x.ld, x.rows, x.cols, beta);
    else
      scale_kernel<1><<<grid_for(x.numel(), kThreads), kThreads, 0, s>>>(x.as<T>(), x.ld,
                                                                         x.rows, x.cols, beta);
    CUDA_CHECK_LAUNCH();
  });
}

void launch_sum_squares(cudaStream_t s, float* out, Mat x, const Workspace& ws) {
  NVTX_RANGE("sum_squares");
  SF_CHECK(out != nullptr, "cuda sum_squares: out is null");
  check_mat(x, x.dtype, -1, -1, "sum_squares", "x");
  if (x.numel() == 0) return;
  if (x.contiguous()) x = Mat(x.data, x.dtype, 1, x.numel());
  const bool vec = vec8_ok(x);
  const int64_t work = vec ? x.numel() / 8 : x.numel();
  const unsigned max_blocks = unsigned(std::min<size_t>(ws.reduce_bytes / sizeof(float), 4096));
  SF_CHECK(max_blocks >= 1, "cuda sum_squares: no reduction workspace");
  const unsigned blocks = std::min(grid_for(work, kThreads), max_blocks);
  float* partial = static_cast<float*>(ws.reduce);
  dispatch_float(x.dtype, "sum_squares", "x", [&](auto tx) {
    using T = decltype(tx);
    if (vec)
      sum_squares_partial_kernel<8><<<blocks, kThreads, 0, s>>>(partial, x.as<const T>(), x.ld,
                                                                 x.rows, x.cols);
    else
      sum_squares_partial_kernel<1><<<blocks, kThreads, 0, s>>>(partial, x.as<const T>(), x.ld,
                                                                 x.rows, x.cols);
    CUDA_CHECK_LAUNCH();
  });
  sum_partials_kernel<<<1, 256, 0, s>>>(out, partial, int(blocks));
  CUDA_CHECK_LAUNCH();
}

void launch_bias_add(cudaStream_t s, Mat x, Mat bias) {
  NVTX_RANGE("bias_add");
  check_mat(x, DType::bf16, -1, -1, "bias_add", "x");
  check_mat(bias, DType::bf16, 1, x.cols, "bias_add", "bias");
  if (x.numel() == 0) return;
  if (vec8_ok(x) && vec8_ok(bias))
    bias_add_kernel<8><<<grid_for(x.numel() / 8, kThreads), kThreads, 0, s>>>(
        x.as<bf16>(), x.ld, bias.as<const bf16>(), x.rows, x.cols);
  else
    bias_add_kernel<1><<<grid_for(x.numel(), kThreads), kThreads, 0, s>>>(
        x.as<bf16>(), x.ld, bias.as<const bf16>(), x.rows, x.cols);
  CUDA_CHECK_LAUNCH();
}

void launch_colsum_finish(cudaStream_t s, float* dst, const float* partial, int splits,
                          int64_t cols) {
  if (cols == 0) return;
  SF_REQUIRE((cols + 31) / 32 < (int64_t(1) << 31), "cuda colsum_finish: ", cols,
             " columns are too many");
  const dim3 block{32, unsigned(kFinishRows)};
  colsum_finish_kernel<<<unsigned((cols + 31) / 32), block, 0, s>>>(dst, partial, splits, cols);
  CUDA_CHECK_LAUNCH();
}

void launch_bias_backward(cudaStream_t s, Mat dbias, Mat dy, const Workspace& ws) {
  NVTX_RANGE("bias_backward");
  check_mat(dbias, DType::f32, 1, dy.cols, "bias_backward", "dbias");
  check_mat(dy, dy.dtype, -1, -1, "bias_backward", "dy");
  if (dy.numel() == 0) return;
  const bool vec = vec8_ok(dy);
  const int VW = vec ? 8 : 1;
  const int64_t col_blocks = (dy.cols + 32 * VW - 1) / (32 * VW);
  // Enough row splits to fill the device twice, bounded by the rows and by the workspace.
  int64_t splits = std::max<int64_t>(1, (2 * sm_count() + col_blocks - 1) / col_blocks);
  splits = std::min<int64_t>(splits, (dy.rows + 7) / 8);
  splits = std::min<int64_t>(splits, int64_t(ws.reduce_bytes / (sizeof(float) * dy.cols)));
  SF_REQUIRE(splits >= 1, "cuda bias_backward: ", dy.cols,
             " columns exceed the reduction workspace");
  const int64_t rps = (dy.rows + splits - 1) / splits;
  splits = (dy.rows + rps - 1) / rps;
  float* partial = static_cast<float*>(ws.reduce);
  const dim3 grid{unsigned(col_blocks), unsigned(splits)}, block{32, 8};
  dispatch_float(dy.dtype, "bias_backward", "dy", [&](auto ty) {
    using T = decltype(ty);
    if (vec)
      colsum_partial_kernel<8><<<grid, block, 0, s>>>(partial, dy.as<const T>(), dy.ld, dy.rows,
                                                      dy.cols, rps);
    else
      colsum_partial_kernel<1><<<grid, block, 0, s>>>(partial, dy.as<const T>(), dy.ld, dy.rows,
                                                      dy.cols, rps);
    CUDA_CHECK_LAUNCH();
  });
  launch_colsum_finish(s, dbias.as<float>(), partial, int(splits), dy.cols);
}

void launch_adamw(cudaStream_t s, float* param, float* m, float* v, const float* grad,
                  void* weights_out, int64_t n, const AdamWStep& st) {
  NVTX_RANGE("adamw");
  SF_CHECK(n >= 0 && (n == 0 || (param && m && v && grad)), "cuda adamw: null buffer for ", n,
           " parameters");
  SF_CHECK(st.step >= 1, "cuda adamw: step must be >= 1 (1-based), got ", st.step);
  if (n == 0) return;
  // Bias corrections in double on the host, then used as float (torch.optim.AdamW's order).
  const double bc1 = 1.0 - std::pow(double(st.beta1), double(st.step));
  const double bc2 = 1.0 - std::pow(double(st.beta2), double(st.step));
  AdamWArgs a;
  a.beta1 = st.beta1;
  a.beta2 = st.beta2;
  a.one_minus_beta1 = 1.f - st.beta1;
  a.one_minus_beta2 = 1.f - st.beta2;
  a.eps = st.eps;
  a.grad_scale = st.grad_scale;
  a.decay = 1.f - st.lr * st.weight_decay;
  a.step_size = float(double(st.lr) / bc1);
  a.bc2_sqrt = float(std::sqrt(bc2));
  bf16* wout = static_cast<bf16*>(weights_out);
  const bool vec = aligned(param, 16) && aligned(m, 16) && aligned(v, 16) && aligned(grad, 16) &&
                   (!wout || aligned(wout, 8));
  int64_t done = 0;
  if (vec && n >= 4) {
    const int64_t chunks = n / 4;
    adamw_kernel<4><<<grid_for(chunks, kThreads), kThreads, 0, s>>>(param, m, v, grad, wout,
                                                                     chunks, a);
    CUDA_CHECK_LAUNCH();
    done = chunks * 4;
  }
  if (done < n) {  // the scalar path: unaligned buffers, or the tail of fewer than 4
    adamw_kernel<1><<<grid_for(n - done, kThreads), kThreads, 0, s>>>(
        param + done, m + done, v + done, grad + done, wout ? wout + done : nullptr, n - done, a);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace sf::cuda
