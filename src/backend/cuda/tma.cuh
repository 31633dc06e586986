// Hopper's asynchronous copy machinery for the warp-specialised kernels (sm_90a): mbarriers,
// TMA tensor copies into shared memory, register-budget hand-over between warpgroups, named
// barriers; and, host side, the tensor maps the copies read through.
//
// The pattern (attention_sm90_ws*.cu): a producer thread waits until a stage is free
// (mbar_wait on its "empty" barrier), announces the bytes to come (mbar_expect_tx on its "full"
// barrier) and issues TMA copies that complete that transaction; consumers wait on "full",
// compute, and arrive on "empty". Parity: a barrier's k-th completed phase has parity k & 1;
// a fresh one counts parity 1 as completed, so a producer's first pass does not wait.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "core/error.h"

namespace sf::cuda::tma {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ uint32_t saddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Each barrier and copy takes the barrier as a pointer or as its shared-memory address (the
// 32-bit form keeps a kernel's barrier table in fewer registers).
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) { mbar_init(saddr(bar), count); }
// After every mbar_init, before the barrier that publishes them to the block.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  mbar_expect_tx(saddr(bar), bytes);
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) { mbar_arrive(saddr(bar)); }
// Returns once the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  mbar_wait(saddr(bar), parity);
}
// A box of a 2-D tensor map at (column c, row r) into smem (the map's swizzle applies).
__device__ __forceinline__ void load_2d(void* dst, const CUtensorMap* map, int c, int r,
                                        uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(saddr(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c), "r"(r), "r"(bar)
      : "memory");
}
// A [ROWS, COLS] bf16 tile in wgmma.cuh's sw128 layout from a 128B-swizzled map with
// [ROWS, 64] boxes: COLS / 64 boxes side by side, from (column c, row r).
template <int COLS, int ROWS>
__device__ __forceinline__ void load_tile(void* dst, const CUtensorMap* map, int c, int r,
                                          uint32_t bar) {
#pragma unroll
  for (int b = 0; b < COLS / 64; ++b)
    load_2d(static_cast<unsigned char*>(dst) + b * ROWS * 128, map, c + 64 * b, r, bar);
}
template <int COLS, int ROWS>
__device__ __forceinline__ void load_tile(void* dst, const CUtensorMap* map, int c, int r,
                                          uint64_t* bar) {
  load_tile<COLS, ROWS>(dst, map, c, r, saddr(bar));
}
// `bytes` (a multiple of 16) from global memory at src (16-byte aligned) into smem at dst, no
// tensor map, completing on bar's transaction count.
__device__ __forceinline__ void load_bulk(void* dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
      ::"r"(saddr(dst)), "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
// Adds `bytes` (a multiple of 16) of f32 from shared memory into global memory, element by
// element, through the copy engine (an asynchronous bulk group; dst 16-byte aligned).
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile(
      "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
      "r"(src), "r"(bytes)
      : "memory");
}
__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
// Until at most N committed bulk groups still read their shared memory (may be overwritten).
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Until at most N committed bulk groups are still incomplete (writes done).
template <int N>
__device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void regs_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
// Named barrier `id` (1-15; 0 is __syncthreads') over `count` threads: sync waits for count
// arrivals, its own included; arrive adds one without waiting.
__device__ __forceinline__ void bar_sync(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
// The same with an immediate id: a register id makes the compiler reserve all 16 barriers.
template <int ID>
__device__ __forceinline__ void bar_sync(int count) {
  asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
#endif

// ---- host side ---------------------------------------------------------------------------------

inline PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000,
                                                cudaEnableDefault, &q));
    SF_REQUIRE(q == cudaDriverEntryPointSuccess && f != nullptr,
               "cuda: the driver has no cuTensorMapEncodeTiled (needs CUDA 12+)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A 2-D map over rows [0, T) and `cols` columns of a bf16 view with row stride ld, read in
// [rows, 64] boxes with the 128B swizzle (rows past T read as zeros).
inline CUtensorMap tile_map(const __nv_bfloat16* base, int64_t T, int64_t cols, int64_t ld,
                            int rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(T)};
  const cuuint64_t strides[1] = {cuuint64_t(ld) * sizeof(__nv_bfloat16)};
  const cuuint32_t box[2] = {64, cuuint32_t(rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = encode_fn()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
                                 const_cast<__nv_bfloat16*>(base), dims, strides, box, elem,
                                 CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                 CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  SF_REQUIRE(r == CUDA_SUCCESS, "cuda: cuTensorMapEncodeTiled failed (", int(r), ") for a [",
             T, ", ", cols, "] bf16 view with row stride ", ld);
  return map;
}

}  // namespace sf::cuda::tma
