// Shared by the two attention kernel families (attention.cu: mma.sync; attention_sm90.cu:
// wgmma): the kernels' argument block, tile constants, block order, cp.async / ldmatrix /
// mma.sync PTX wrappers, the swizzled shared-memory tile helpers, the row store and the
// kernels' common prologue (block indices, work items, row statistics). Internal to
// backend/cuda's attention; the contract is in attention.cuh.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/common.cuh"
#include "backend/cuda/dq_acc_layout.h"
#include "backend/cuda/wgmma.cuh"

namespace sf::cuda::attn {

constexpr int kWarps = 4, kThreads = kWarps * 32, kTile = 64;
// Blocks per SM the register allocation must allow. Forward: 3 (168 registers, Q fragments
// re-read from shared memory) ran 7% faster than 2 (208 registers, 8 warps per SM). The
// backward kernels hold two f32 accumulators: forcing 3 (smaller tiles) ran 15% slower.
constexpr int kFwdBlocksPerSm = 3, kBwdBlocksPerSm = 2;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

struct AttnArgs {
  const bf16* q;
  const bf16* k;
  const bf16* v;
  int64_t ldq, ldk, ldv;
  const bf16* out;   // backward: the forward's output
  const bf16* dout;  // backward
  int64_t ldo, lddo;
  bf16* o;           // forward: out; backward: dq (also the delta stash)
  bf16* dk;
  bf16* dv;
  int64_t ld_o, lddk, lddv;
  float* lse;        // [Hq, T]
  float* dq_acc;     // backward with atomic dQ: f32 tiles (dq_acc_layout.h), zeroed
  int64_t acc_rows;  // its rows per head (dq_acc_rows)
  float* acc_lse;    // the warp-specialised backward: lse and delta (dout . out) per row, in
  float* acc_delta;  // the accumulator's rows, 0 past each sequence's end
  const int32_t* cu;
  int64_t T;
  int group;         // Hq / Hkv
  float scale, scale_log2;
};

// ---- block order ------------------------------------------------------------------------------

// The causal kernels' grids are (tiles, sequences, heads), and a block's work falls with its
// tile's rank: rank 0 is the tile with the most partner tiles (the last query tile, the first
// key tile). Blocks start in roughly linear order, so with blockIdx used as is the heavy tiles
// of the last (sequence, head) pairs start last and run alone at the end (a list-scheduling
// model gives +14% for dk/dv at 4 x 4096). This maps the linear block index rank-major instead:
// every pair's heaviest tile first, heads of one sequence next to each other (GQA groups share
// K and V in L2).
struct BlockTile {
  int rank, seq, head;
};
__device__ __forceinline__ BlockTile heavy_first() {
  const int pairs = gridDim.y * gridDim.z;
  const int lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const int rank = lin / pairs, rest = lin - rank * pairs;
  return {rank, rest / int(gridDim.z), rest % int(gridDim.z)};
}

// ---- PTX wrappers -----------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}
// 4-byte copy (f32 statistics); zero-filled when !valid.
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void cp_async_wait_all() { cp_async_wait<0>(); }
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// d += a * b
__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// 2^x from the special-function unit alone. exp2f also scales arguments below -126 so as to
// return subnormals: three more instructions per exponent, which doubled the softmax's ALU work
// beside the MUFU. A weight below 2^-126 of its row's maximum, flushed to zero, changes no
// bf16 output; -inf still gives 0.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// ---- shared-memory tiles ----------------------------------------------------------------------

// Element offset of (row, 8-element chunk) in a swizzled [rows, D] tile.
template <int D>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// Copies rows [0, n_valid) of a ROWS x D tile starting at g (row stride ld) into smem; rows past
// n_valid are zero-filled (`safe` is any valid global address for the masked copies).
template <int D, int ROWS>
__device__ __forceinline__ void load_tile(bf16* smem, const bf16* g, int64_t ld, int n_valid,
                                          const bf16* safe) {
  constexpr int CH = D / 8;
#pragma unroll
  for (int i = threadIdx.x; i < ROWS * CH; i += kThreads) {
    const int r = i / CH, c = i % CH;
    const bool ok = r < n_valid;
    cp_async16(smem_addr(smem + swz<D>(r, c)), ok ? g + r * ld + c * 8 : safe, ok);
  }
}

// A fragment: rows [r0, r0+16), columns [8*kc, 8*kc+16) of a row-major tile.
template <int D>
__device__ __forceinline__ void frag_a(uint32_t (&a)[4], const bf16* tile, int r0, int kc,
                                       int lane) {
  const int r = r0 + (lane & 15), c = kc + (lane >> 4);
  ldsm_x4(a, smem_addr(tile + swz<D>(r, c)));
}
// B fragments for two n-tiles from a tile stored [n, k] (rows = n): n in [n0, n0+16),
// k in [8*kc, 8*kc+16). b[0], b[1] serve n-tile n0; b[2], b[3] serve n0+8.
template <int D>
__device__ __forceinline__ void frag_b(uint32_t (&b)[4], const bf16* tile, int n0, int kc,
                                       int lane) {
  const int r = n0 + (lane & 7) + ((lane >> 4) << 3), c = kc + ((lane >> 3) & 1);
  ldsm_x4(b, smem_addr(tile + swz<D>(r, c)));
}
// B fragments for two n-tiles from a tile stored [k, n] (rows = k): k in [k0, k0+16),
// n in [8*nc, 8*nc+16). b[0], b[1] serve n-tile nc; b[2], b[3] serve nc+1.
template <int D>
__device__ __forceinline__ void frag_bt(uint32_t (&b)[4], const bf16* tile, int k0, int nc,
                                        int lane) {
  const int r = k0 + (lane & 7) + (((lane >> 3) & 1) << 3), c = nc + (lane >> 4);
  ldsm_x4_t(b, smem_addr(tile + swz<D>(r, c)));
}

// s[16 x 8*NT] (+)= A-tile rows [ra, ra+16) @ B-tile^T, B stored [n, k] with n in [0, 8*NT).
template <int D, int NT>
__device__ __forceinline__ void mma_abt(float (&s)[NT][4], const bf16* at, int ra,
                                        const bf16* bt, int lane) {
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    uint32_t a[4];
    frag_a<D>(a, at, ra, kc * 2, lane);
#pragma unroll
    for (int nb = 0; nb < NT / 2; ++nb) {
      uint32_t b[4];
      frag_b<D>(b, bt, nb * 16, kc * 2, lane);
      mma(s[2 * nb], a, b[0], b[1]);
      mma(s[2 * nb + 1], a, b[2], b[3]);
    }
  }
}

// acc[16 x D] += P[16 x 16*KB] (A fragments in registers) @ B-tile, B stored [k, n=D].
template <int D, int KB>
__device__ __forceinline__ void mma_pv(float (&acc)[D / 8][4], const uint32_t (&p)[KB][4],
                                       const bf16* bt, int lane) {
#pragma unroll
  for (int kb = 0; kb < KB; ++kb)
#pragma unroll
    for (int dc = 0; dc < D / 16; ++dc) {
      uint32_t b[4];
      frag_bt<D>(b, bt, kb * 16, dc * 2, lane);
      mma(acc[2 * dc], p[kb], b[0], b[1]);
      mma(acc[2 * dc + 1], p[kb], b[2], b[3]);
    }
}

// Packs accumulator n-tile pairs into A fragments.
template <int NT>
__device__ __forceinline__ void to_a_frags(uint32_t (&p)[NT / 2][4], const float (&s)[NT][4]) {
#pragma unroll
  for (int kb = 0; kb < NT / 2; ++kb) {
    p[kb][0] = pack_bf16(s[2 * kb][0], s[2 * kb][1]);
    p[kb][1] = pack_bf16(s[2 * kb][2], s[2 * kb][3]);
    p[kb][2] = pack_bf16(s[2 * kb + 1][0], s[2 * kb + 1][1]);
    p[kb][3] = pack_bf16(s[2 * kb + 1][2], s[2 * kb + 1][3]);
  }
}

template <int N, int M>
__device__ __forceinline__ void zero(float (&x)[N][M]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
#pragma unroll
    for (int j = 0; j < M; ++j) x[i][j] = 0.f;
}

// Stores a warp's [16 x D] accumulator (times mul) as bf16 rows r0 + g (+8) of dst, rows
// >= n_valid skipped.
template <int D>
__device__ __forceinline__ void store_rows(bf16* dst, int64_t ld, int r0, int n_valid,
                                           const float (&acc)[D / 8][4], float mul0, float mul1,
                                           int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r0 + g + half * 8;
    if (r >= n_valid) continue;
    const float mul = half ? mul1 : mul0;
    bf16* row = dst + int64_t(r) * ld + 2 * t;
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
      *reinterpret_cast<uint32_t*>(row + dt * 8) =
          pack_bf16(acc[dt][2 * half] * mul, acc[dt][2 * half + 1] * mul);
  }
}

// ---- the wgmma forwards' softmax and epilogue (attention_sm90*.cu) --------------------------

// One online-softmax step over a warpgroup score accumulator of NT n8-tiles (wgmma.cuh's
// layout: rows g and g + 8, columns 8 nt + 2 t (+1)), already masked: s becomes the exp2
// weights, m the running row maxima (log2 domain: the scale (> 0) goes into the maximum and
// one FFMA per exponent), l the per-thread partial row sums (quad-summed at the end), alpha
// each row half's rescale factor for the output accumulator.
template <int NT>
__device__ __forceinline__ void online_softmax(float (&s)[4 * NT], float (&m)[2], float (&l)[2],
                                               float (&alpha)[2], float scale_log2) {
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {  // rows g (i & 3 in {0, 1}) and g + 8 ({2, 3})
    float mx = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      mx = fmaxf(mx, fmaxf(s[4 * nt + 2 * ri], s[4 * nt + 2 * ri + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m[ri], mx * scale_log2);
    const float base = m_new == -INFINITY ? 0.f : m_new;
    alpha[ri] = exp2_ftz(m[ri] - base);
    m[ri] = m_new;
    float rs = 0.f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const float p0 = exp2_ftz(fmaf(s[4 * nt + 2 * ri], scale_log2, -base)),
                  p1 = exp2_ftz(fmaf(s[4 * nt + 2 * ri + 1], scale_log2, -base));
      s[4 * nt + 2 * ri] = p0;
      s[4 * nt + 2 * ri + 1] = p1;
      rs += p0 + p1;
    }
    l[ri] = l[ri] * alpha[ri] + rs;  // per-thread partial; quad-summed at the end
  }
}

// A wgmma forward's end for one warp: sums l over the quad, writes lse (natural log) of the
// rows before len, and stores O / l as bf16. row0 = the warp's first accumulator row within
// the sequence (+ g); r0 = its first row within the block's query tile at q0.
template <int D>
__device__ __forceinline__ void finish_forward_rows(const AttnArgs& p, const float (&o)[D / 8][4],
                                                    const float (&m)[2], const float (&l)[2],
                                                    int start, int len, int h, int q0, int row0,
                                                    int r0, int lane) {
  float inv[2];
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    float lt = l[ri];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    inv[ri] = 1.f / lt;
    const int r = row0 + ri * 8;
    if ((lane & 3) == 0 && r < len)
      p.lse[int64_t(h) * p.T + start + r] = (m[ri] + log2f(lt)) * kLn2;
  }
  store_rows<D>(p.o + int64_t(start + q0) * p.ld_o + h * D, p.ld_o, r0, len - q0, o, inv[0],
                inv[1], lane);
}

// ---- backward statistics ----------------------------------------------------------------------

// delta = dout . out over one (token, head) row, by one warp (every lane returns it): the one
// order of summation of every backward, so that their dk and dv can agree bit for bit.
template <int D>
__device__ __forceinline__ float row_delta(const bf16* o, const bf16* d, int lane) {
  float acc = 0.f;
#pragma unroll
  for (int c = lane * 2; c < D; c += 64) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(o + c));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(d + c));
    acc += a.x * b.x + a.y * b.y;
  }
  return warp_sum(acc);
}

// ---- the wgmma backwards' dk/dv item (attention_sm90*.cu) -----------------------------------

// Thread t4's 16 query columns (2 t4 + 8 i, + 1) of a 64-float row of statistics in shared
// memory at `at`, x mul: ld.shared.v2, volatile so that it keeps its place among the waits.
__device__ __forceinline__ void load_col_stats(float (&v)[16], uint32_t at, int t4, float mul) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n"
                 : "=f"(v[2 * i]), "=f"(v[2 * i + 1])
                 : "r"(at + uint32_t(8 * i + 2 * t4) * 4));
    v[2 * i] *= mul;
    v[2 * i + 1] *= mul;
  }
}

// acc [64 keys, D] += A [64 keys, 64 queries] (registers: four k-fragments of 16 queries) x the
// [64 queries, D] tile at shared address `tile` (MN-major): issued, not committed.
template <int D>
__device__ __forceinline__ void add_rs_product(float (&acc)[D / 2], const uint32_t (&a)[4][4],
                                               uint32_t tile) {
#pragma unroll
  for (int kb = 0; kb < 4; ++kb) {
    if constexpr (D == 128) wg::mma_rs_n128_tb(acc, a[kb], wg::desc_mn<64>(tile, kb));
    else wg::mma_rs_n64_tb(acc, a[kb], wg::desc_mn<64>(tile, kb));
  }
}

// One (query head, 64-row query tile) item for a warpgroup's 64 keys, shared by the wgmma
// backwards so that their dk and dv agree bit for bit: S^T = K Q^T and dP^T = V dO^T (K, V: the
// warpgroup's rows of KROWS-row sw128 tiles at ks, vs; Q, dO: 64-row tiles at qs, dos), then
// hook() while those run (the caller may issue its next copies there), P^T (zero where the key
// is after the query or the query is past nq), dV += P^T dO, dS^T = P^T (dP^T - delta),
// dK += dS^T Q. The item's 64 lse (natural log) and delta are f32 rows in shared memory at
// lse_s, dl_s (lse read under S^T's product, delta only where it is used). Returns with dK's
// product issued, not waited for; b holds dS^T as A fragments. kw0: the warpgroup's first key,
// krow0: its accumulator row g's key, both within the sequence; t4: lane % 4.
template <int D, int KROWS, class Hook>
__device__ __forceinline__ void dkdv_item_products(float (&dkf)[D / 2], float (&dvf)[D / 2],
                                                   uint32_t (&b)[4][4], uint32_t ks, uint32_t vs,
                                                   uint32_t qs, uint32_t dos, int kw0, int krow0,
                                                   int q0, int nq, int t4, float scale_log2,
                                                   uint32_t lse_s, uint32_t dl_s, Hook&& hook) {
  constexpr int BQ = 64;
  float st[32], dp[32];
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)  // S^T = K Q^T
    wg::mma_ss_n64(st, wg::desc_k<KROWS>(ks, kk), wg::desc_k<BQ>(qs, kk), kk > 0);
  wg::commit();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)  // dP^T = V dO^T
    wg::mma_ss_n64(dp, wg::desc_k<KROWS>(vs, kk), wg::desc_k<BQ>(dos, kk), kk > 0);
  wg::commit();
  hook();
  {
    // P^T = exp(scale * s - lse); only the diagonal and the last query tile need the mask
    // (warpgroup-uniform test). Rows past nq hold zero-filled or another sequence's rows: any
    // finite junk there is overwritten. (lse is read under S^T's product, delta only once it
    // is needed: the registers are scarcest around dV's product.)
    float lse_c[16];
    load_col_stats(lse_c, lse_s, t4, kLog2e);
    wg::wait<1>();  // S^T is ready
#pragma unroll
    for (int i = 0; i < 32; ++i)
      st[i] = exp2_ftz(fmaf(st[i], scale_log2, -lse_c[((i >> 2) << 1) | (i & 1)]));
  }
  if (kw0 + 63 > q0 || nq < BQ) {
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int qi = (i >> 2) * 8 + 2 * t4 + (i & 1);
      if (krow0 + ((i & 3) >> 1) * 8 > q0 + qi || qi >= nq) st[i] = 0.f;
    }
  }
  uint32_t a[4][4];
  wg::acc64_to_a(a, st);
  wg::fence();
  add_rs_product<D>(dvf, a, dos);  // dV += P^T dO
  wg::commit();
  wg::wait<1>();  // dP^T is ready (groups complete in order)
  {
    float dl_c[16];
    load_col_stats(dl_c, dl_s, t4, 1.f);
#pragma unroll
    for (int i = 0; i < 32; ++i) dp[i] = st[i] * (dp[i] - dl_c[((i >> 2) << 1) | (i & 1)]);
  }
  wg::acc64_to_a(b, dp);
  wg::fence();
  add_rs_product<D>(dkf, b, qs);  // dK += dS^T Q
  wg::commit();
}

// ---- the atomic backwards' dQ (attention_sm90*.cu) ------------------------------------------

// Writes a warp's dS^T A fragments (wgmma.cuh's register layout: keys r0 + g (+8), queries
// 16 kb + 2 t (+1, +8)) into a sw128 [ROWS keys, 64 queries] tile at shared address `tile`;
// conflict-free (the swizzle spreads the eight rows' chunks over all banks).
template <int ROWS>
__device__ __forceinline__ void store_ds_t(uint32_t tile, const uint32_t (&b)[4][4], int r0,
                                           int lane) {
  const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int kb = 0; kb < 4; ++kb)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int row = r0 + g + 8 * (r & 1), col = 16 * kb + 8 * (r >> 1) + 2 * t4;
      const uint32_t at = tile + uint32_t(wg::sw128<ROWS>(row, col >> 3) + (col & 7)) * 2;
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(at), "r"(b[kb][r]) : "memory");
    }
}

// One item's dQ = dS K for warpgroup wgi of two sharing 128 keys (issued and waited for, with
// every product before it): at D 128 half of the columns (64 wgi ..) over all 128 keys (the
// caller synced both warpgroups' dS^T rows), at D 64 all columns over its own 64 keys. ds: the
// [128 keys, 64 queries] sw128 dS^T tile; ks: the [128, D] K tile.
template <int D>
__device__ __forceinline__ void dq_item_product(float (&dq)[32], uint32_t ds, uint32_t ks, int wgi) {
  wg::fence();
  if constexpr (D == 128) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk)
      wg::mma_ss_n64<1, 1>(dq, wg::desc_mn<128>(ds, kk),
                           wg::desc_mn<128>(ks + uint32_t(wgi * 128 * 128), kk), kk > 0);
  } else {
    const uint32_t off = uint32_t(wgi * 64 * 128);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wg::mma_ss_n64<1, 1>(dq, wg::desc_mn<128>(ds + off, kk), wg::desc_mn<128>(ks + off, kk),
                           kk > 0);
  }
  wg::commit();
  wg::wait<0>();
  wg::pin(dq);
}

// A warpgroup's [64 queries, 64 columns] dQ product (thread t's 32 accumulators) in the
// accumulator tile's order (dq_acc_layout.h): float4 j of thread t at (j * 128 + t) * 4 floats
// from `block`, the tile's column block the product belongs to.
// Into shared memory (a warp's 32 float4 per j are 512 contiguous bytes: no bank conflicts):
__device__ __forceinline__ void store_dq_frags(uint32_t block, const float (&d)[32], int t) {
#pragma unroll
  for (int j = 0; j < 8; ++j)
    asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(block + uint32_t(j * 128 + t) * 16),
                 "f"(d[4 * j]), "f"(d[4 * j + 1]), "f"(d[4 * j + 2]), "f"(d[4 * j + 3])
                 : "memory");
}
// Or added into the global accumulator (RED.ADD.F32x4: one atomic per float4):
__device__ __forceinline__ void add_dq_frags(float* block, const float (&d)[32], int t) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float* at = block + (j * 128 + t) * 4;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float4*>(at),
              make_float4(d[4 * j], d[4 * j + 1], d[4 * j + 2], d[4 * j + 3]));
#else  // (compiled for the other archs' passes, never run there)
    for (int e = 0; e < 4; ++e) atomicAdd(at + e, d[4 * j + e]);
#endif
  }
}

// ---- block prologue ---------------------------------------------------------------------------

// What every kernel of both families works out before its main loop: its (tile, sequence,
// head) from heavy_first(), the sequence's place in the packed batch (cu_seqlens) and the GQA
// kv head. A block whose tile starts at or past its sequence's end has nothing to do: the
// kernel returns on `q0 >= len` / `k0 >= len` itself (a helper cannot end it).

// Query-tile blocks (forward, dq): grid (query tiles, sequences, query heads); rank 0 is the
// last query tile, the one with the most key tiles.
struct QueryBlock {
  int start, len;  // the sequence's first token in the packed batch, its length
  int h, hk;       // query head, its kv head (h / group)
  int q0;          // the tile's first query row, within the sequence
};
template <int BQ>
__device__ __forceinline__ QueryBlock query_block(const AttnArgs& p) {
  const BlockTile bt = heavy_first();
  QueryBlock b;
  b.h = bt.head;
  b.hk = b.h / p.group;
  b.start = p.cu[bt.seq];
  b.len = p.cu[bt.seq + 1] - b.start;
  b.q0 = (gridDim.x - 1 - bt.rank) * BQ;
  return b;
}

// Key-tile blocks (dk/dv): grid (key tiles, sequences, kv heads); rank 0 is the first key
// tile, the one that the most query tiles see.
struct KeyBlock {
  int start, len;  // as QueryBlock
  int hk;          // kv head; its query heads are hk * group .. hk * group + group - 1
  int k0;          // the tile's first key, within the sequence
  int seq;         // the sequence's index in the batch
};
template <int KB>
__device__ __forceinline__ KeyBlock key_block(const AttnArgs& p) {
  const BlockTile bt = heavy_first();
  const int start = p.cu[bt.seq];
  return {start, p.cu[bt.seq + 1] - start, bt.head, bt.rank * KB, bt.seq};
}

// The dq kernels' row statistics. delta = dout . out for the tile's rows into dl_s[r], r <
// blockDim.x / 2 (0 from row nq on): two threads per row, each half of D, from global memory.
// The caller syncs before reading dl_s.
template <int D>
__device__ __forceinline__ void dq_tile_delta(const AttnArgs& p, int start, int q0, int h,
                                              int nq, float* dl_s) {
  const int r = threadIdx.x >> 1, half = threadIdx.x & 1;
  float acc = 0.f;
  if (r < nq) {
    const bf16* o = p.out + int64_t(start + q0 + r) * p.ldo + h * D + half * (D / 2);
    const bf16* d = p.dout + int64_t(start + q0 + r) * p.lddo + h * D + half * (D / 2);
#pragma unroll
    for (int c = 0; c < D / 2; c += 8) {
      float a[8], b[8];
      load8(o + c, a);
      load8(d + c, b);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc += a[k] * b[k];
    }
  }
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  if (half == 0) dl_s[r] = acc;
}
// Then per thread, for its accumulator rows row0 and row0 + 8 (query indices; tile-local
// lrow0, lrow0 + 8): the lse in log2 units (INFINITY past the end: P = 0) and delta.
__device__ __forceinline__ void dq_row_stats(const AttnArgs& p, int start, int len, int h,
                                             int row0, int lrow0, const float* dl_s,
                                             float (&lse2)[2], float (&delta)[2]) {
#pragma unroll
  for (int ri = 0; ri < 2; ++ri) {
    const int r = row0 + ri * 8;
    lse2[ri] = r < len ? p.lse[int64_t(h) * p.T + start + r] * kLog2e : INFINITY;
    delta[ri] = dl_s[lrow0 + ri * 8];
  }
}

// The dk/dv kernels' work items: (query head gi of the group, BQ-row query tile) with gi
// outer, over the query tiles from q_first (the first that sees the block's keys) to the end.
struct DkdvItems {
  int q_first, n_qt, n_items;
};
template <int BQ>
__device__ __forceinline__ DkdvItems dkdv_items(const AttnArgs& p, int q_first, int len) {
  const int n_qt = (len - q_first + BQ - 1) / BQ;
  return {q_first, n_qt, p.group * n_qt};
}
template <int BQ>
__device__ __forceinline__ void dkdv_item(const DkdvItems& w, int it, int& gi, int& q0) {
  gi = it / w.n_qt;
  q0 = w.q_first + (it - gi * w.n_qt) * BQ;
}
// Copies item (head h, rows q0 .. q0 + nq) statistics into smem: the forward's lse (natural
// log) and delta (the dq stash, p.o), zero past nq. Threads 0 .. NTH - 1.
template <int BQ, int NTH>
__device__ __forceinline__ void load_row_stats(float* lse_s, float* dl_s, const AttnArgs& p,
                                               int start, int q0, int h, int nq) {
  for (int i = threadIdx.x; i < BQ; i += NTH) {
    const bool ok = i < nq;
    const int64_t tq = start + q0 + (ok ? i : 0);  // a valid address for the masked copy
    cp_async4(smem_addr(lse_s + i), p.lse + int64_t(h) * p.T + tq, ok);
    cp_async4(smem_addr(dl_s + i), reinterpret_cast<const float*>(p.o + tq * p.ld_o) + h, ok);
  }
}

// Lets a kernel take `bytes` of dynamic shared memory (above the default 48 KiB).
template <class K>
void set_smem(K kernel, size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(bytes)));
}

}  // namespace sf::cuda::attn
