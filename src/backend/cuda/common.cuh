// Device helpers shared by the CUDA op files: bf16 <-> f32 conversion, 8-wide vector loads
// and stores (one 128-bit access for bf16, two for f32), warp/block reductions, and the host
// side checks every launcher uses (dtype, shape, vectorisability of a strided Mat).
// Included only by .cu files (nvcc).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/tensor.h"

namespace sf::cuda {

using bf16 = __nv_bfloat16;

// ---- scalar conversions -------------------------------------------------------------------
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }

// ---- 8-element vectors (callers guarantee 16-byte alignment) --------------------------------
__device__ __forceinline__ void load8(const float* p, float (&v)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(p);
  const float4 b = *reinterpret_cast<const float4*>(p + 4);
  v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
  v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ void load8(const bf16* p, float (&v)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(h[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void load8(const __half* p, float (&v)[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(h[i]);
    v[2 * i] = f.x;
    v[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void store8(float* p, const float (&v)[8]) {
  *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  *reinterpret_cast<float4*>(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void store8(bf16* p, const float (&v)[8]) {
  uint4 u;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = u;
}
__device__ __forceinline__ void store8(__half* p, const float (&v)[8]) {
  uint4 u;
  __half2* h = reinterpret_cast<__half2*>(&u);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = u;
}

// VW-wide load/store: VW == 8 uses the vector path, VW == 1 a scalar element.
template <int VW, class T>
__device__ __forceinline__ void loadv(const T* p, float (&v)[VW]) {
  if constexpr (VW == 8) load8(p, v);
  else v[0] = to_f32(p[0]);
}
template <int VW, class T>
__device__ __forceinline__ void storev(T* p, const float (&v)[VW]) {
  if constexpr (VW == 8) store8(p, v);
  else p[0] = from_f32<T>(v[0]);
}

// ---- reductions ---------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
// Sum over the whole block (blockDim.x a multiple of 32, <= 1024); every thread gets the
// result. `red` is 32 floats of shared memory; the call ends with red free for reuse.
__device__ __forceinline__ float block_sum(float x, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  x = warp_sum(x);
  if (lane == 0) red[warp] = x;
  __syncthreads();
  float t = lane < nw ? red[lane] : 0.f;
  t = warp_sum(t);
  __syncthreads();
  return t;
}

// ---- host-side helpers ----------------------------------------------------------------------
// True when every row of m can be read as 8-element 16-byte-aligned vectors.
inline bool vec8_ok(const Mat& m) {
  const bool ld_ok = m.rows <= 1 || (m.ld * int64_t(m.elem_size())) % 16 == 0;
  return m.cols % 8 == 0 && ld_ok && reinterpret_cast<uintptr_t>(m.data) % 16 == 0;
}

// Calls f(T{}) with T the element type of dtype t (f32, bf16 or f16); anything else is a bug
// in the caller.
template <class F>
void dispatch_float(DType t, const char* op, const char* arg, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::bf16: f(bf16{}); return;
    case DType::f16: f(__half{}); return;
    default:
      SF_CHECK(false, "cuda ", op, ": ", arg, " must be f32, bf16 or f16, got ", dtype_name(t));
  }
}

// SF_CHECKs that m has dtype t and shape [rows, cols] (negative: any), naming op and arg.
inline void check_mat(const Mat& m, DType t, int64_t rows, int64_t cols, const char* op,
                      const char* arg) {
  SF_CHECK(m.dtype == t, "cuda ", op, ": ", arg, " must be ", dtype_name(t), ", got ",
           dtype_name(m.dtype));
  SF_CHECK((rows < 0 || m.rows == rows) && (cols < 0 || m.cols == cols), "cuda ", op, ": ", arg,
           " is [", m.rows, ", ", m.cols, "], expected [", rows, ", ", cols, "]");
  SF_CHECK(m.rows >= 0 && m.cols >= 0 && (m.rows <= 1 || m.ld >= m.cols), "cuda ", op, ": ", arg,
           " has a bad row stride ", m.ld, " for ", m.cols, " columns");
  SF_CHECK(m.data != nullptr || m.numel() == 0, "cuda ", op, ": ", arg, " has no data");
}

// Multiprocessor count of the current device (cached per device).
int sm_count();

// Grid size for a grid-stride loop over n work items of `threads` threads each: enough blocks
// to fill the device several times over, never more than the work needs.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t need = (n + threads - 1) / threads;
  const int64_t cap = int64_t(sm_count()) * 16;
  return unsigned(need < 1 ? 1 : (need < cap ? need : cap));
}

}  // namespace sf::cuda
