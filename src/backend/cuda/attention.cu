// Flash attention forward and backward with bf16 tensor-core MMAs, fp32 accumulation and online
// softmax (contracts in attention.cuh). Two kernel families compute the same thing:
//  - wgmma (sm_90a, Hopper; the default there): a warpgroup (4 warps) owns a 64-row tile and
//    reads shared-memory operands straight from 128B-swizzled tiles (wgmma.cuh). Forward: two
//    warpgroups per 128-row query tile. Backward: the dk/dv and dq kernels of the mma.sync
//    family with the same work items, two warpgroups per block (dk/dv: 128 keys share each
//    64-row Q/dO tile; dq: 128 rows share each 128-key K/V tile). A warpgroup reads each
//    shared operand once where four mma.sync warps read it four times: the mma.sync backward
//    was bound by shared-memory wavefronts (ncu: 63% of peak, short-scoreboard stalls first);
//    on the H200 the wgmma backward is 1.5x / 1.8x / 1.85x faster at seq 1K / 4K / 8K.
//  Every kernel takes its (tile, sequence, head) from heavy_first() and the common part of its
//  prologue (block indices, work items, row statistics) from attention_tiles.cuh.
//    The forward there is the warp-specialised kernel of attention_sm90_ws.cu (a TMA producer
//    warp feeding two consumer warpgroups) unless SF_ATTN_WS=0.
//  - mma.sync (m16n8k16, sm_80+): every other GPU, and SF_ATTN_WGMMA=0.
// Both backwards are deterministic (no atomics; the same bits every call).
//
// mma.sync tiles: 4 warps per block, each warp owns 16 rows of a 64-row tile (the forward: MT
// m-tiles of 16 rows per warp, a 64 x MT-row query tile against 64-row key tiles). Tiles sit in
// shared memory as [rows, D] bf16 with the 16-byte chunk index XOR-swizzled by (row & 7), so
// ldmatrix reads 8 rows of one chunk column without bank conflicts. Global -> shared copies
// use cp.async (16 bytes, zero-filled past the end of the sequence).
//
// Fragment layouts of mma.m16n8k16 (g = lane / 4, t = lane % 4):
//   A 16x16 (row-major): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8, 2t+8..)
//   B 16x8 (k x n):      b0 = (k 2t..2t+1, n g), b1 = (k 2t+8.., n g)
//   C 16x8 f32:          c0,c1 = (g, 2t..2t+1), c2,c3 = (g+8, 2t..2t+1)
// so an accumulator pair of n-tiles (2j, 2j+1) is, packed to bf16, the A operand of the next
// product over those 16 columns (the FA2 register trick).
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/attention_sm90.cuh"
#include "backend/cuda/attention_tiles.cuh"

namespace sf::cuda {
namespace {

using namespace attn;  // the shared tile helpers (attention_tiles.cuh)

// ---- forward ----------------------------------------------------------------------------------

// Each warp owns MT m-tiles of 16 query rows: m-tile mt of warp w covers tile rows
// mt * 64 + 16 * w, so every warp has the same share of the diagonal (no warp idles at the
// barriers on the last key tiles). MT = 2 (128-row query tiles) reuses every K and V fragment
// read from shared memory for two m-tiles and gives the MMA pipe two independent chains.
template <int MT>
constexpr int fwd_rows() { return MT * kWarps * 16; }
template <int D, int MT>
constexpr int fwd_blocks_per_sm() { return MT == 1 ? kFwdBlocksPerSm : 2; }

// s[mt] (+)= Q rows of m-tile mt @ K^T; each K fragment serves every m-tile. No per-m-tile
// predicates: a warp's m-tile that the key tile lies wholly after (only on the last key tile
// of a query tile) is computed and masked. Predicating the MMAs (8d0e0dc) kept the compiler
// from interleaving the fragment loads with the MMAs: its 64-row path ran ~20% slower than
// the plain kernel.
template <int D, int NT, int MT>
__device__ __forceinline__ void mma_qkt(float (&s)[MT][NT][4], const bf16* qt, int warp,
                                        const bf16* kt, int lane) {
#pragma unroll
  for (int kc = 0; kc < D / 16; ++kc) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) frag_a<D>(a[mt], qt, mt * 64 + warp * 16, kc * 2, lane);
#pragma unroll
    for (int nb = 0; nb < NT / 2; ++nb) {
      uint32_t b[4];
      frag_b<D>(b, kt, nb * 16, kc * 2, lane);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma(s[mt][2 * nb], a[mt], b[0], b[1]);
        mma(s[mt][2 * nb + 1], a[mt], b[2], b[3]);
      }
    }
  }
}

// o[mt] += P[mt] @ V; each V fragment serves every m-tile.
template <int D, int KB, int MT>
__device__ __forceinline__ void mma_pv_m(float (&o)[MT][D / 8][4], const uint32_t (&p)[MT][KB][4],
                                         const bf16* vt, int lane) {
#pragma unroll
  for (int kb = 0; kb < KB; ++kb)
#pragma unroll
    for (int dc = 0; dc < D / 16; ++dc) {
      uint32_t b[4];
      frag_bt<D>(b, vt, kb * 16, dc * 2, lane);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma(o[mt][2 * dc], p[mt][kb], b[0], b[1]);
        mma(o[mt][2 * dc + 1], p[mt][kb], b[2], b[3]);
      }
    }
}

// grid (query tiles, sequences, query heads), blocks in heavy_first() order.
template <int D, int MT>
__global__ void __launch_bounds__(kThreads, (fwd_blocks_per_sm<D, MT>()))
    attn_forward_kernel(AttnArgs p) {
  constexpr int BQ = fwd_rows<MT>();
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* Ks = Qs + BQ * D;
  bf16* Vs = Ks + kTile * D;
  const QueryBlock blk = query_block<BQ>(p);
  const int start = blk.start, len = blk.len, h = blk.h, hk = blk.hk, q0 = blk.q0;
  if (q0 >= len) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;

  const bf16* qg = p.q + int64_t(start + q0) * p.ldq + h * D;
  const bf16* kg = p.k + int64_t(start) * p.ldk + hk * D;
  const bf16* vg = p.v + int64_t(start) * p.ldv + hk * D;
  load_tile<D, BQ>(Qs, qg, p.ldq, min(BQ, len - q0), p.q);
  load_tile<D, kTile>(Ks, kg, p.ldk, min(kTile, len), p.k);
  cp_async_commit();

  float o[MT][D / 8][4];
  float m[MT][2], l[MT][2];
  int row0[MT];  // query index of accumulator rows g (and +8) of each m-tile
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    zero(o[mt]);
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.f;
    row0[mt] = q0 + mt * 64 + warp * 16 + g;
  }
  // Key tiles 0 .. the one holding the last query row of the tile (causal).
  const int nkb = (min(q0 + BQ, len) - 1) / kTile + 1;

  for (int j = 0; j < nkb; ++j) {
    cp_async_wait_all();
    __syncthreads();  // K_j (and Q) landed; every warp is done with V_{j-1}
    load_tile<D, kTile>(Vs, vg + int64_t(j) * kTile * p.ldv, p.ldv, min(kTile, len - j * kTile),
                        p.v);
    cp_async_commit();

    // Per m-tile (warp-uniform): does the key tile reach past its first row (mask)? A key
    // tile wholly after its rows masks them all: m stays (key tile 0 came first), p = 0.
    bool diag[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) diag[mt] = j * kTile + kTile - 1 > q0 + mt * 64 + warp * 16;

    float s[MT][kTile / 8][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) zero(s[mt]);
    mma_qkt<D, kTile / 8, MT>(s, Qs, warp, Ks, lane);  // S = Q K^T

    uint32_t pf[MT][kTile / 16][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      // Mask the future where the tile straddles the diagonal. Scores stay unscaled: the
      // scale (> 0) goes into the row maximum and one FFMA per exponent.
      if (diag[mt]) {
#pragma unroll
        for (int nt = 0; nt < kTile / 8; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (j * kTile + nt * 8 + 2 * t4 + (e & 1) > row0[mt] + (e >> 1) * 8)
              s[mt][nt][e] = -INFINITY;
      }
      // Online softmax for rows g (e = 0, 1) and g + 8 (e = 2, 3), in log2 units.
      float alpha[2];
#pragma unroll
      for (int ri = 0; ri < 2; ++ri) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < kTile / 8; ++nt)
          mx = fmaxf(mx, fmaxf(s[mt][nt][2 * ri], s[mt][nt][2 * ri + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[mt][ri], mx * p.scale_log2);
        const float base = m_new == -INFINITY ? 0.f : m_new;
        alpha[ri] = exp2_ftz(m[mt][ri] - base);
        m[mt][ri] = m_new;
        float rs = 0.f;
#pragma unroll
        for (int nt = 0; nt < kTile / 8; ++nt) {
          const float p0 = exp2_ftz(fmaf(s[mt][nt][2 * ri], p.scale_log2, -base)),
                      p1 = exp2_ftz(fmaf(s[mt][nt][2 * ri + 1], p.scale_log2, -base));
          s[mt][nt][2 * ri] = p0;
          s[mt][nt][2 * ri + 1] = p1;
          rs += p0 + p1;
        }
        l[mt][ri] = l[mt][ri] * alpha[ri] + rs;  // per-thread partial; quad-summed at the end
      }
      // Rescale o only when some row's maximum moved (alpha is exactly 1 otherwise).
      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          o[mt][dt][0] *= alpha[0];
          o[mt][dt][1] *= alpha[0];
          o[mt][dt][2] *= alpha[1];
          o[mt][dt][3] *= alpha[1];
        }
      }
      to_a_frags<kTile / 8>(pf[mt], s[mt]);
    }

    cp_async_wait_all();
    __syncthreads();  // V_j landed; every warp is done with K_j
    if (j + 1 < nkb) {
      load_tile<D, kTile>(Ks, kg + int64_t(j + 1) * kTile * p.ldk, p.ldk,
                          min(kTile, len - (j + 1) * kTile), p.k);
      cp_async_commit();
    }
    mma_pv_m<D, kTile / 16, MT>(o, pf, Vs, lane);
  }

#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    float inv[2];
#pragma unroll
    for (int ri = 0; ri < 2; ++ri) {
      float lt = l[mt][ri];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      inv[ri] = 1.f / lt;
      const int r = row0[mt] + ri * 8;
      if (t4 == 0 && r < len)
        p.lse[int64_t(h) * p.T + start + r] = (m[mt][ri] + log2f(lt)) * kLn2;
    }
    store_rows<D>(p.o + int64_t(start + q0) * p.ld_o + h * D, p.ld_o, mt * 64 + warp * 16,
                  len - q0, o[mt], inv[0], inv[1], lane);
  }
}

// ---- backward ---------------------------------------------------------------------------------

// delta[t, h] = dout[t, h, :] . out[t, h, :], one warp per (token, head), into the dq stash.
template <int D>
__global__ void attn_delta_kernel(AttnArgs p, int n_heads) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= p.T * n_heads) return;
  const int64_t t = w / n_heads;
  const int h = int(w - t * n_heads);
  const float acc = row_delta<D>(p.out + t * p.ldo + h * D, p.dout + t * p.lddo + h * D, lane);
  if (lane == 0) reinterpret_cast<float*>(p.o + t * p.ld_o)[h] = acc;
}

// dk, dv for one key tile of one kv head; grid (key tiles, sequences, kv heads). Query tiles of
// BQ rows, double-buffered: the (head, query tile) item after the current one is copied in
// (cp.async) while the current one is computed. Heavy early key tiles (which see the most
// queries) start first.
template <int D, int BQ>
__global__ void __launch_bounds__(kThreads, kBwdBlocksPerSm) attn_dkdv_kernel(AttnArgs p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* Ks = reinterpret_cast<bf16*>(smem_raw);
  bf16* Vs = Ks + kTile * D;
  bf16* Qbuf = Vs + kTile * D;                                    // [2][BQ, D]
  bf16* dObuf = Qbuf + 2 * BQ * D;                                // [2][BQ, D]
  float* lse_buf = reinterpret_cast<float*>(dObuf + 2 * BQ * D);  // [2][BQ], natural log
  float* dl_buf = lse_buf + 2 * BQ;                               // [2][BQ]
  const KeyBlock blk = key_block<kTile>(p);
  const int start = blk.start, len = blk.len, hk = blk.hk, k0 = blk.k0;
  if (k0 >= len) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, t4 = lane & 3;

  load_tile<D, kTile>(Ks, p.k + int64_t(start + k0) * p.ldk + hk * D, p.ldk,
                      min(kTile, len - k0), p.k);
  load_tile<D, kTile>(Vs, p.v + int64_t(start + k0) * p.ldv + hk * D, p.ldv,
                      min(kTile, len - k0), p.v);
  cp_async_commit();

  const DkdvItems items = dkdv_items<BQ>(p, (k0 / BQ) * BQ, len);
  const int n_items = items.n_items;
  auto prefetch = [&](int it, int buf) {
    int gi, q0;
    dkdv_item<BQ>(items, it, gi, q0);
    const int h = hk * p.group + gi, nq = min(BQ, len - q0);
    load_tile<D, BQ>(Qbuf + buf * BQ * D, p.q + int64_t(start + q0) * p.ldq + h * D, p.ldq, nq,
                     p.q);
    load_tile<D, BQ>(dObuf + buf * BQ * D, p.dout + int64_t(start + q0) * p.lddo + h * D,
                     p.lddo, nq, p.dout);
    load_row_stats<BQ, kThreads>(lse_buf + buf * BQ, dl_buf + buf * BQ, p, start, q0, h, nq);
    cp_async_commit();
  };

  float dk[D / 8][4], dv[D / 8][4];
  zero(dk);
  zero(dv);
  const int krow0 = k0 + warp * 16 + (lane >> 2);  // key index of accumulator rows g (and +8)

  prefetch(0, 0);
  for (int it = 0; it < n_items; ++it) {
    const int buf = it & 1;
    if (it + 1 < n_items) {
      prefetch(it + 1, buf ^ 1);  // that buffer's last reader finished before the loop's end
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // item it (and K, V) landed for every thread
    int gi, q0;
    dkdv_item<BQ>(items, it, gi, q0);
    const int nq = min(BQ, len - q0);
    const bf16* Qs = Qbuf + buf * BQ * D;
    const bf16* dOs = dObuf + buf * BQ * D;
    const float* lse_s = lse_buf + buf * BQ;
    const float* dl_s = dl_buf + buf * BQ;

    // S^T = K Q^T: rows = this warp's 16 keys, columns = BQ queries.
    float st[BQ / 8][4];
    zero(st);
    mma_abt<D, BQ / 8>(st, Ks, warp * 16, Qs, lane);
    // P^T = exp(scale * s - lse); zero where the key is after the query or the query is past
    // the end (its zero-filled lse would give finite junk).
#pragma unroll
    for (int nt = 0; nt < BQ / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = nt * 8 + 2 * t4 + (e & 1);
        const float pv = exp2_ftz(st[nt][e] * p.scale_log2 - lse_s[qi] * kLog2e);
        st[nt][e] = (krow0 + (e >> 1) * 8 > q0 + qi || qi >= nq) ? 0.f : pv;
      }
    uint32_t pf[BQ / 16][4];
    to_a_frags<BQ / 8>(pf, st);
    mma_pv<D, BQ / 16>(dv, pf, dOs, lane);  // dV += P^T dO

    // dP^T = V dO^T, then dS^T = P^T * (dP^T - delta).
    float dp[BQ / 8][4];
    zero(dp);
    mma_abt<D, BQ / 8>(dp, Vs, warp * 16, dOs, lane);
#pragma unroll
    for (int nt = 0; nt < BQ / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qi = nt * 8 + 2 * t4 + (e & 1);
        dp[nt][e] = st[nt][e] * (dp[nt][e] - dl_s[qi]);
      }
    to_a_frags<BQ / 8>(pf, dp);
    mma_pv<D, BQ / 16>(dk, pf, Qs, lane);  // dK += dS^T Q
    __syncthreads();  // every warp is done with buffer buf before it is refilled
  }
  store_rows<D>(p.dk + int64_t(start + k0) * p.lddk + hk * D, p.lddk, warp * 16, len - k0, dk,
                p.scale, p.scale, lane);
  store_rows<D>(p.dv + int64_t(start + k0) * p.lddv + hk * D, p.lddv, warp * 16, len - k0, dv,
                1.f, 1.f, lane);
}

// dq for one query tile of one head; grid (query tiles, sequences, query heads), heavy first.
// Key/value tiles of BK rows, double-buffered like the dk/dv kernel's query tiles.
template <int D, int BK>
__global__ void __launch_bounds__(kThreads, kBwdBlocksPerSm) attn_dq_kernel(AttnArgs p) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* Qs = reinterpret_cast<bf16*>(smem_raw);
  bf16* dOs = Qs + kTile * D;
  bf16* Kbuf = dOs + kTile * D;                          // [2][BK, D]
  bf16* Vbuf = Kbuf + 2 * BK * D;                        // [2][BK, D]
  float* dl_s = reinterpret_cast<float*>(Vbuf + 2 * BK * D);  // [kTile]
  const QueryBlock blk = query_block<kTile>(p);
  const int start = blk.start, len = blk.len, h = blk.h, hk = blk.hk, q0 = blk.q0;
  if (q0 >= len) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int nq = min(kTile, len - q0);

  load_tile<D, kTile>(Qs, p.q + int64_t(start + q0) * p.ldq + h * D, p.ldq, nq, p.q);
  load_tile<D, kTile>(dOs, p.dout + int64_t(start + q0) * p.lddo + h * D, p.lddo, nq, p.dout);
  cp_async_commit();
  auto prefetch = [&](int kt, int buf) {
    const int kb0 = kt * BK, nk = min(BK, len - kb0);
    load_tile<D, BK>(Kbuf + buf * BK * D, p.k + int64_t(start + kb0) * p.ldk + hk * D, p.ldk,
                     nk, p.k);
    load_tile<D, BK>(Vbuf + buf * BK * D, p.v + int64_t(start + kb0) * p.ldv + hk * D, p.ldv,
                     nk, p.v);
    cp_async_commit();
  };
  const int kend = min(len, q0 + kTile);
  const int n_kt = (kend + BK - 1) / BK;
  prefetch(0, 0);
  dq_tile_delta<D>(p, start, q0, h, nq, dl_s);
  __syncthreads();
  float lse2[2], delta[2];
  const int row0 = q0 + warp * 16 + g;
  dq_row_stats(p, start, len, h, row0, warp * 16 + g, dl_s, lse2, delta);

  float dq[D / 8][4];
  zero(dq);
  for (int kt = 0; kt < n_kt; ++kt) {
    const int buf = kt & 1, kb0 = kt * BK;
    if (kt + 1 < n_kt) {
      prefetch(kt + 1, buf ^ 1);  // that buffer's last reader finished before the loop's end
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // tile kt (and Q, dO) landed for every thread
    const bf16* Ks = Kbuf + buf * BK * D;
    const bf16* Vs = Vbuf + buf * BK * D;

    float s[BK / 8][4];
    zero(s);
    mma_abt<D, BK / 8>(s, Qs, warp * 16, Ks, lane);  // S = Q K^T
    float dp[BK / 8][4];
    zero(dp);
    mma_abt<D, BK / 8>(dp, dOs, warp * 16, Vs, lane);  // dP = dO V^T
#pragma unroll
    for (int nt = 0; nt < BK / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ri = e >> 1;
        const int kidx = kb0 + nt * 8 + 2 * t4 + (e & 1);
        float pv = exp2_ftz(s[nt][e] * p.scale_log2 - lse2[ri]);
        if (kidx > row0 + ri * 8) pv = 0.f;
        dp[nt][e] = pv * (dp[nt][e] - delta[ri]);
      }
    uint32_t dsf[BK / 16][4];
    to_a_frags<BK / 8>(dsf, dp);
    mma_pv<D, BK / 16>(dq, dsf, Ks, lane);  // dQ += dS K
    __syncthreads();  // every warp is done with buffer buf before it is refilled
  }
  store_rows<D>(p.o + int64_t(start + q0) * p.ld_o + h * D, p.ld_o, warp * 16, nq, dq, p.scale,
                p.scale, lane);
}

// ---- host helpers ---------------------------------------------------------------------------

// Backward tile sizes: the dk/dv kernel holds two [16 x D] f32 accumulators per warp, so the
// query tile shrinks at D = 128 to stay within the register file.
template <int D>
constexpr int dkdv_bq() { return D == 128 ? 32 : 64; }
template <int D>
constexpr int dq_bk() { return 64; }

// The wgmma kernels run on compute capability 9.x devices when the build carries sm_90a code
// (SF_CUDA_ARCHS holds 90a, the default; without it their bodies are traps); elsewhere, or
// with SF_ATTN_WGMMA=0, the mma.sync kernels run.
bool device_has_wgmma() {
#ifdef SF_BUILD_SM90A
  static const bool has = [] {
    int dev = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    return major == 9;
  }();
  return has;
#else
  return false;
#endif
}
std::atomic<int> g_wgmma{-1};  // -1: not decided yet
bool use_wgmma() {
  int v = g_wgmma.load();
  if (v < 0) {
    const char* e = std::getenv("SF_ATTN_WGMMA");
    v = device_has_wgmma() && !(e != nullptr && std::string(e) == "0") ? 1 : 0;
    g_wgmma.store(v);
  }
  return v == 1;
}

void check_qkv(const Mat& m, int64_t rows, int64_t cols, const char* op, const char* arg) {
  check_mat(m, DType::bf16, rows, cols, op, arg);
  SF_REQUIRE(m.rows <= 1 || m.ld % 8 == 0, "cuda ", op, ": ", arg, " row stride ", m.ld,
             " must be a multiple of 8 elements (16-byte rows)");
  SF_REQUIRE(reinterpret_cast<uintptr_t>(m.data) % 16 == 0, "cuda ", op, ": ", arg,
             " must be 16-byte aligned");
}

AttnArgs make_args(Mat q, Mat k, Mat v, const AttentionShape& sh, const int32_t* cu,
                   const char* op) {
  SF_CHECK(sh.n_heads > 0 && sh.n_kv_heads > 0 && sh.n_heads % sh.n_kv_heads == 0, "cuda ", op,
           ": n_heads ", sh.n_heads, " must be a positive multiple of n_kv_heads ",
           sh.n_kv_heads);
  SF_REQUIRE(sh.head_dim == 64 || sh.head_dim == 128, "cuda ", op, ": head_dim ", sh.head_dim,
             " is not supported on the GPU (64 or 128)");
  SF_CHECK(sh.n_seqs >= 1 && sh.n_seqs < 65536 && cu != nullptr, "cuda ", op,
           ": need cu_seqlens for 1..65535 sequences, got n_seqs = ", sh.n_seqs);
  SF_CHECK(sh.max_seqlen >= 0, "cuda ", op, ": max_seqlen ", sh.max_seqlen);
  const int64_t T = q.rows;
  check_qkv(q, T, int64_t(sh.n_heads) * sh.head_dim, op, "q");
  check_qkv(k, T, int64_t(sh.n_kv_heads) * sh.head_dim, op, "k");
  check_qkv(v, T, int64_t(sh.n_kv_heads) * sh.head_dim, op, "v");
  AttnArgs a{};
  a.q = q.as<const bf16>();
  a.k = k.as<const bf16>();
  a.v = v.as<const bf16>();
  a.ldq = q.ld;
  a.ldk = k.ld;
  a.ldv = v.ld;
  a.cu = cu;
  a.T = T;
  a.group = sh.n_heads / sh.n_kv_heads;
  a.scale = sh.scale;
  a.scale_log2 = sh.scale * kLog2e;
  return a;
}

template <int D, int MT>
void forward_mt(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh) {
  constexpr int BQ = fwd_rows<MT>();
  const size_t smem = (size_t(BQ) + 2 * kTile) * D * sizeof(bf16);
  static std::once_flag once;  // per instantiation: the attribute belongs to the function
  std::call_once(once, [&] { set_smem(attn_forward_kernel<D, MT>, smem); });
  const dim3 grid((sh.max_seqlen + BQ - 1) / BQ, sh.n_seqs, sh.n_heads);
  attn_forward_kernel<D, MT><<<grid, kThreads, smem, s>>>(a);
  CUDA_CHECK_LAUNCH();
}

std::atomic<int> g_ws_forward{-1};  // -1: not decided yet, else a WsForward (SF_ATTN_WS)
WsForward ws_forward() {
  int v = g_ws_forward.load();
  if (v < 0) {
    v = int(ws_forward_setting());
    g_ws_forward.store(v);
  }
  return WsForward(v);
}
bool use_ws_forward() { return ws_forward() != WsForward::off && use_wgmma(); }
std::atomic<bool> g_ws_backward{true};
bool use_ws_backward() { return g_ws_backward.load() && use_wgmma(); }

// 128 query rows per block (MT 2). Measured on the H200 against the 64-row kernel in one call
// (scripts/gpu.sh ab, 2026-11-30): 12% / 19% / 21% faster at seq 1K / 4K / 8K (32/8 heads,
// D 128), although ptxas reports 156 B of spill stores at D 128.
template <int D>
void forward(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh) {
  SF_REQUIRE(ws_forward() != WsForward::required || use_wgmma(), "SF_ATTN_WS=1: the "
             "warp-specialised forward needs a compute capability 9 GPU, a build with sm_90a code "
             "(SF_CUDA_ARCHS) and SF_ATTN_WGMMA unset; unset SF_ATTN_WS");
  if (use_ws_forward()) {
    forward_sm90_ws(s, a, sh);
  } else if (use_wgmma()) {
    forward_sm90(s, a, sh);
  } else {
    forward_mt<D, 2>(s, a, sh);
  }
}

// Step 1 of every backward: the delta stash in dq's rows (attention.cuh).
void launch_delta(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh) {
  const unsigned blocks = unsigned((a.T * sh.n_heads * 32 + 255) / 256);
  if (sh.head_dim == 64) attn_delta_kernel<64><<<blocks, 256, 0, s>>>(a, sh.n_heads);
  else attn_delta_kernel<128><<<blocks, 256, 0, s>>>(a, sh.n_heads);
  CUDA_CHECK_LAUNCH();
}

template <int D>
void backward(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh) {
  launch_delta(s, a, sh);
  if (use_wgmma()) return backward_sm90(s, a, sh);
  constexpr int BQ = dkdv_bq<D>(), BK = dq_bk<D>();
  // K, V + two stages of Q, dO (+ lse, delta); Q, dO + two stages of K, V (+ delta).
  const size_t smem_kv = (2 * size_t(kTile) + 4 * BQ) * D * sizeof(bf16) + 4 * BQ * sizeof(float);
  const size_t smem_q = (2 * size_t(kTile) + 4 * BK) * D * sizeof(bf16) + kTile * sizeof(float);
  static std::once_flag once;
  std::call_once(once, [&] {
    set_smem(attn_dkdv_kernel<D, BQ>, smem_kv);
    set_smem(attn_dq_kernel<D, BK>, smem_q);
  });
  const unsigned tiles = unsigned((sh.max_seqlen + kTile - 1) / kTile);
  attn_dkdv_kernel<D, BQ><<<dim3(tiles, sh.n_seqs, sh.n_kv_heads), kThreads, smem_kv, s>>>(a);
  CUDA_CHECK_LAUNCH();
  attn_dq_kernel<D, BK><<<dim3(tiles, sh.n_seqs, sh.n_heads), kThreads, smem_q, s>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

bool set_attention_wgmma(bool on) {
  g_wgmma.store(on && device_has_wgmma() ? 1 : 0);
  return use_wgmma();
}

WsForward ws_forward_setting() {
  const char* e = std::getenv("SF_ATTN_WS");
  if (e == nullptr) return WsForward::by_default;
  const std::string want = e;
  SF_REQUIRE(want == "0" || want == "1", "SF_ATTN_WS=", want, " must be 0 (slideformer's "
             "attention forward runs its wgmma kernel) or 1 (its warp-specialised kernel, Hopper "
             "only, the default there); unset it for the default");
  return want == "1" ? WsForward::required : WsForward::off;
}

bool set_attention_ws_backward(bool on) {
  g_ws_backward.store(on);
  return use_ws_backward();
}

bool set_attention_ws_forward(bool on) {
  g_ws_forward.store(int(on ? WsForward::by_default : WsForward::off));
  return use_ws_forward();
}

void launch_attention_forward(cudaStream_t s, Mat out, float* lse, Mat q, Mat k, Mat v,
                              const AttentionShape& sh, const int32_t* cu) {
  NVTX_RANGE("attention_forward");
  AttnArgs a = make_args(q, k, v, sh, cu, "attention_forward");
  check_qkv(out, q.rows, q.cols, "attention_forward", "out");
  SF_CHECK(lse != nullptr || q.rows == 0, "cuda attention_forward: lse is null (the GPU kernel "
           "always writes it)");
  if (q.rows == 0 || sh.max_seqlen == 0) return;
  a.o = out.as<bf16>();
  a.ld_o = out.ld;
  a.lse = lse;
  if (sh.head_dim == 64) forward<64>(s, a, sh);
  else forward<128>(s, a, sh);
}

namespace {
// The backward's arguments, checked.
AttnArgs backward_args(Mat dq, Mat dk, Mat dv, Mat dout, Mat out, const float* lse, Mat q, Mat k,
                       Mat v, const AttentionShape& sh, const int32_t* cu, const char* op) {
  AttnArgs a = make_args(q, k, v, sh, cu, op);
  check_qkv(dq, q.rows, q.cols, op, "dq");
  check_qkv(dout, q.rows, q.cols, op, "dout");
  check_qkv(out, q.rows, q.cols, op, "out");
  check_qkv(dk, k.rows, k.cols, op, "dk");
  check_qkv(dv, v.rows, v.cols, op, "dv");
  SF_CHECK(lse != nullptr || q.rows == 0, "cuda ", op, ": lse is null");
  a.out = out.as<const bf16>();
  a.ldo = out.ld;
  a.dout = dout.as<const bf16>();
  a.lddo = dout.ld;
  a.o = dq.as<bf16>();
  a.ld_o = dq.ld;
  a.dk = dk.as<bf16>();
  a.lddk = dk.ld;
  a.dv = dv.as<bf16>();
  a.lddv = dv.ld;
  a.lse = const_cast<float*>(lse);
  return a;
}
}  // namespace

void launch_attention_backward(cudaStream_t s, Mat dq, Mat dk, Mat dv, Mat dout, Mat out,
                               const float* lse, Mat q, Mat k, Mat v, const AttentionShape& sh,
                               const int32_t* cu) {
  NVTX_RANGE("attention_backward");
  const AttnArgs a = backward_args(dq, dk, dv, dout, out, lse, q, k, v, sh, cu,
                                   "attention_backward");
  if (q.rows == 0 || sh.max_seqlen == 0) return;
  if (sh.head_dim == 64) backward<64>(s, a, sh);
  else backward<128>(s, a, sh);
}

bool attention_backward_atomic_runs() { return use_wgmma(); }

// The f32 dQ accumulator (Hq x dq_acc_rows x D, dq_acc_layout.h), then the warp-specialised
// kernel's lse and delta rows (Hq x dq_acc_rows each).
namespace {
size_t dq_acc_floats(int64_t T, const AttentionShape& sh) {
  return size_t(sh.n_heads) * size_t(attn::dq_acc_rows(T, sh.n_seqs)) * size_t(sh.head_dim);
}
}  // namespace
size_t attention_backward_atomic_workspace_bytes(int64_t T, const AttentionShape& sh) {
  const size_t rows = size_t(sh.n_heads) * size_t(attn::dq_acc_rows(T, sh.n_seqs));
  return (dq_acc_floats(T, sh) + 2 * rows) * sizeof(float);
}

void launch_attention_backward_atomic(cudaStream_t s, Mat dq, Mat dk, Mat dv, Mat dout, Mat out,
                                      const float* lse, Mat q, Mat k, Mat v,
                                      const AttentionShape& sh, const int32_t* cu,
                                      float* workspace, size_t workspace_bytes) {
  NVTX_RANGE("attention_backward_atomic");
  const char* op = "attention_backward_atomic";
  AttnArgs a = backward_args(dq, dk, dv, dout, out, lse, q, k, v, sh, cu, op);
  SF_REQUIRE(attention_backward_atomic_runs(), "cuda ", op, ": needs slideformer's wgmma "
             "kernels (a compute capability 9 GPU, a build with sm_90a code, SF_ATTN_WGMMA "
             "unset); launch_attention_backward runs everywhere");
  const size_t need = attention_backward_atomic_workspace_bytes(q.rows, sh);
  SF_CHECK(workspace_bytes >= need && reinterpret_cast<uintptr_t>(workspace) % 16 == 0, "cuda ",
           op, ": the workspace must be 16-byte aligned and hold ", need, " bytes, got ",
           workspace_bytes);
  if (q.rows == 0 || sh.max_seqlen == 0) return;
  a.dq_acc = workspace;
  a.acc_rows = attn::dq_acc_rows(q.rows, sh.n_seqs);
  a.acc_lse = workspace + dq_acc_floats(q.rows, sh);
  a.acc_delta = a.acc_lse + sh.n_heads * a.acc_rows;
  const bool ws = use_ws_backward();
  CUDA_CHECK(cudaMemsetAsync(workspace, 0, dq_acc_floats(q.rows, sh) * sizeof(float), s));
  if (!ws) launch_delta(s, a, sh);  // (the wgmma form reads delta from the stash)
  backward_atomic_sm90(s, a, sh, ws);
}

}  // namespace sf::cuda