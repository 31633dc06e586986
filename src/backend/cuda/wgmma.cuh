// Hopper warpgroup MMA (wgmma.mma_async, sm_90a): PTX wrappers for the bf16 shapes the
// attention kernels use, plus shared-memory matrix descriptors for 128-byte-swizzled tiles.
//
// Tile layout ("sw128"): a [ROWS, COLS] bf16 tile is COLS / 64 sub-tiles of [ROWS, 64] (one
// 128-byte row each), sub-tile after sub-tile; in each, the 16-byte chunk c of row r sits at
// chunk c ^ (r & 7) (the hardware's 128B swizzle; tiles start 1024-byte aligned). The same
// tile serves as a K-major operand (rows = M or N, columns = K) and as an MN-major one
// (rows = K, columns = N, with the transpose flag).
//
// Register layouts (warp w of the warpgroup owns rows 16w..16w+15; g = lane / 4, t = lane % 4):
//   accumulator m64nN f32: d[4j + e] = (row g + 8 (e / 2), column 8j + 2t + e % 2)
//   A m64k16 bf16 (registers): the mma.sync m16n8k16 A layout of the warp's 16 rows.
// Every MMA sequence is bracketed: wg::fence() before (registers written since the last MMA),
// wg::commit() after, wg::wait<N>() before the results (or the operands' memory) are touched.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace sf::cuda::wg {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define SF_WGMMA 1
#endif

// Element offset of (row, 8-element chunk) in a sw128 tile of ROWS rows.
template <int ROWS>
__device__ __forceinline__ int sw128(int row, int chunk) {
  return (chunk >> 3) * (ROWS * 64) + row * 64 + (((chunk & 7) ^ (row & 7)) << 3);
}

// Descriptor of a 128B-swizzled operand at shared address `addr` (1024-aligned atoms; a start
// inside an atom advances along K by 32-byte steps). lbo/sbo in bytes.
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(lbo >> 4) << 16) |
         (uint64_t(sbo >> 4) << 32) | (uint64_t(1) << 62);
}
// K-major operand (rows = M or N, 64-wide sub-tiles along K): k-step kk (16 columns).
template <int ROWS>
__device__ __forceinline__ uint64_t desc_k(uint32_t tile, int kk) {
  return desc(tile + uint32_t((kk >> 2) * ROWS * 128 + (kk & 3) * 32), 16, 1024);
}
// MN-major operand (rows = K, 64-wide sub-tiles along N): k-step kk (16 rows).
template <int ROWS>
__device__ __forceinline__ uint64_t desc_mn(uint32_t tile, int kk) {
  return desc(tile + uint32_t(kk * 16 * 128), ROWS * 128, 1024);
}

// Packs an m64n(16 KB) accumulator into the register A fragments of KB k16 steps (columns
// 16 kb .. 16 kb + 15): a product's output becomes the next product's A (the FA2 trick).
template <int KB>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[KB][4], const float (&d)[8 * KB]) {
  auto pack = [](float lo, float hi) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  };
#pragma unroll
  for (int kb = 0; kb < KB; ++kb) {
    a[kb][0] = pack(d[8 * kb + 0], d[8 * kb + 1]);
    a[kb][1] = pack(d[8 * kb + 2], d[8 * kb + 3]);
    a[kb][2] = pack(d[8 * kb + 4], d[8 * kb + 5]);
    a[kb][3] = pack(d[8 * kb + 6], d[8 * kb + 7]);
  }
}
__device__ __forceinline__ void acc64_to_a(uint32_t (&a)[4][4], const float (&d)[32]) {
  acc_to_a<4>(a, d);
}

__device__ __forceinline__ void fence() {
#ifdef SF_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#ifdef SF_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wait() {
#ifdef SF_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Makes this thread's generic-proxy shared-memory writes (st.shared, cp.async) visible to
// wgmma's async proxy; before the barrier that precedes the MMAs.
__device__ __forceinline__ void fence_proxy_async() {
#ifdef SF_WGMMA
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// d (+)= A[64 x 16] (shared) * B[16 x 64] (shared); accumulate = false: d = A B. Operands are
// K-major (desc_k) unless their transpose flag TA / TB is set (MN-major, desc_mn).
template <int TA = 0, int TB = 0>
__device__ __forceinline__ void mma_ss_n64(float (&d)[32], uint64_t da, uint64_t db, bool accumulate) {
#ifdef SF_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, %35, %36;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(int(accumulate)), "n"(TA), "n"(TB));
#endif
}

// d (+)= A[64 x 16] (shared) * B[16 x 128] (shared); accumulate = false: d = A B. Transpose
// flags as mma_ss_n64.
template <int TA = 0, int TB = 0>
__device__ __forceinline__ void mma_ss_n128(float (&d)[64], uint64_t da, uint64_t db, bool accumulate) {
#ifdef SF_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, %67, %68;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(int(accumulate)), "n"(TA), "n"(TB));
#endif
}

// d += A[64 x 16] (registers) * B[16 x 64] (shared, MN-major: the transpose flag).
__device__ __forceinline__ void mma_rs_n64_tb(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
#ifdef SF_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
#endif
}

// d += A[64 x 16] (registers) * B[16 x 128] (shared, MN-major: the transpose flag).
__device__ __forceinline__ void mma_rs_n128_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
#ifdef SF_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
#endif
}

// Pins accumulator registers at this point of the program: the compiler may not move their
// reads or writes across it (a wgmma writes them asynchronously, behind the compiler's back).
template <int N>
__device__ __forceinline__ void pin(float (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(x[i])::"memory");
}

}  // namespace sf::cuda::wg
