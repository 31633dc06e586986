// Embedding gather and its deterministic scatter-add (contracts in embedding.cuh).
#include <limits>

#include "backend/cuda/common.cuh"
#include "backend/cuda/embedding.cuh"

namespace sf::cuda {
namespace {

constexpr int kBwdThreads = 256;

// TT: the table's element type (bf16, or f32 rounded once: e.g. a mapped host fp32 master,
// read over PCIe in 16- or 32-byte pieces per thread, 512+ contiguous bytes per warp).
template <int VW, class TT>
__global__ void embedding_forward_kernel(bf16* out, int64_t ldo, const int32_t* ids,
                                         const TT* table, int64_t ldt, int64_t V, int64_t T,
                                         int64_t C) {
  const int64_t cpr = C / VW, n = T * cpr;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i / cpr, c = (i - t * cpr) * VW;
    const int64_t id = ids[t];
    float v[VW];
    if (id >= 0 && id < V) {
      loadv<VW>(table + id * ldt + c, v);
    } else {
#pragma unroll
      for (int k = 0; k < VW; ++k) v[k] = __int_as_float(0x7fc00000);
    }
    storev<VW>(out + t * ldo + c, v);
  }
}

// One block per token t; only the block of the first occurrence of ids[t] does the work.
template <int VW>
__global__ void __launch_bounds__(kBwdThreads)
    embedding_backward_kernel(float* dtable, int64_t ldt, int64_t V, const int32_t* ids,
                              const bf16* dout, int64_t ldo, int T, int C) {
  __shared__ int seen;
  __shared__ int warp_counts[kBwdThreads / 32];
  __shared__ int list[kBwdThreads];
  const int t = blockIdx.x;
  const int id = ids[t];
  if (id < 0 || id >= V) return;
  if (threadIdx.x == 0) seen = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < t; i += kBwdThreads)
    if (ids[i] == id) seen = 1;  // benign race: every writer stores 1
  __syncthreads();
  if (seen) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float* drow = dtable + int64_t(id) * ldt;
  for (int base = t; base < T; base += kBwdThreads) {
    // Compact the matching tokens of [base, base + kBwdThreads) into list, in token order.
    const int i = base + threadIdx.x;
    const bool match = i < T && ids[i] == id;
    const unsigned mask = __ballot_sync(0xffffffffu, match);
    if (lane == 0) warp_counts[warp] = __popc(mask);
    __syncthreads();
    int offset = 0, count = 0;
#pragma unroll
    for (int w = 0; w < kBwdThreads / 32; ++w) {
      offset += w < warp ? warp_counts[w] : 0;
      count += warp_counts[w];
    }
    if (match) list[offset + __popc(mask & ((1u << lane) - 1u))] = i;
    __syncthreads();
    if (count > 0)
      for (int c = threadIdx.x * VW; c < C; c += kBwdThreads * VW) {
        float acc[VW];
        if constexpr (VW == 8) {
          const float4 a = *reinterpret_cast<const float4*>(drow + c);
          const float4 b = *reinterpret_cast<const float4*>(drow + c + 4);
          acc[0] = a.x; acc[1] = a.y; acc[2] = a.z; acc[3] = a.w;
          acc[4] = b.x; acc[5] = b.y; acc[6] = b.z; acc[7] = b.w;
        } else {
          acc[0] = drow[c];
        }
        for (int j = 0; j < count; ++j) {
          float g[VW];
          loadv<VW>(dout + int64_t(list[j]) * ldo + c, g);
#pragma unroll
          for (int k = 0; k < VW; ++k) acc[k] += g[k];
        }
        if constexpr (VW == 8) {
          *reinterpret_cast<float4*>(drow + c) = make_float4(acc[0], acc[1], acc[2], acc[3]);
          *reinterpret_cast<float4*>(drow + c + 4) = make_float4(acc[4], acc[5], acc[6], acc[7]);
        } else {
          drow[c] = acc[0];
        }
      }
    __syncthreads();  // list and warp_counts are rewritten next round
  }
}

}  // namespace

void launch_embedding_forward(cudaStream_t s, Mat out, const int32_t* ids, Mat table) {
  NVTX_RANGE("embedding_forward");
  SF_CHECK(table.dtype == DType::bf16 || table.dtype == DType::f32,
           "cuda embedding_forward: table must be bf16 or f32, got ", dtype_name(table.dtype));
  check_mat(table, table.dtype, -1, -1, "embedding_forward", "table");
  check_mat(out, DType::bf16, -1, table.cols, "embedding_forward", "out");
  SF_CHECK(ids != nullptr || out.rows == 0, "cuda embedding_forward: ids is null");
  if (out.numel() == 0) return;
  const bool vec = vec8_ok(out) && vec8_ok(table);
  const int64_t n = vec ? out.numel() / 8 : out.numel();
  auto go = [&](auto* tab) {
    if (vec)
      embedding_forward_kernel<8><<<grid_for(n, 256), 256, 0, s>>>(
          out.as<bf16>(), out.ld, ids, tab, table.ld, table.rows, out.rows, out.cols);
    else
      embedding_forward_kernel<1><<<grid_for(n, 256), 256, 0, s>>>(
          out.as<bf16>(), out.ld, ids, tab, table.ld, table.rows, out.rows, out.cols);
  };
  if (table.dtype == DType::f32) go(table.as<const float>());
  else go(table.as<const bf16>());
  CUDA_CHECK_LAUNCH();
}

void launch_embedding_backward(cudaStream_t s, Mat dtable, const int32_t* ids, Mat dout) {
  NVTX_RANGE("embedding_backward");
  check_mat(dtable, DType::f32, -1, -1, "embedding_backward", "dtable");
  check_mat(dout, DType::bf16, -1, dtable.cols, "embedding_backward", "dout");
  SF_CHECK(ids != nullptr || dout.rows == 0, "cuda embedding_backward: ids is null");
  SF_REQUIRE(dout.rows < std::numeric_limits<int>::max() &&
                 dout.cols < std::numeric_limits<int>::max(),
             "cuda embedding_backward: ", dout.rows, " x ", dout.cols, " is too large");
  if (dout.numel() == 0) return;
  const bool vec = vec8_ok(dout) && vec8_ok(dtable);
  if (vec)
    embedding_backward_kernel<8><<<unsigned(dout.rows), kBwdThreads, 0, s>>>(
        dtable.as<float>(), dtable.ld, dtable.rows, ids, dout.as<const bf16>(), dout.ld,
        int(dout.rows), int(dout.cols));
  else
    embedding_backward_kernel<1><<<unsigned(dout.rows), kBwdThreads, 0, s>>>(
        dtable.as<float>(), dtable.ld, dtable.rows, ids, dout.as<const bf16>(), dout.ld,
        int(dout.rows), int(dout.cols));
  CUDA_CHECK_LAUNCH();
}

}  // namespace sf::cuda
