// The wgmma (sm_90a) attention kernels: forward, dk/dv and dq (the family is described in
// attention.cu's header; the contract in attention.cuh), and their launchers.
#include <mutex>

#include "backend/cuda/attention_sm90.cuh"
#include "backend/cuda/attention_tiles.cuh"
#include "backend/cuda/wgmma.cuh"

namespace sf::cuda::attn {
namespace {


// Copies rows [0, n_valid) of a ROWS x D tile into a sw128 tile (wgmma.cuh); rows past n_valid
// are zero-filled.
template <int D, int ROWS, int NTH = kThreads>
__device__ __forceinline__ void load_tile_sw128(bf16* smem, const bf16* g, int64_t ld,
                                                int n_valid, const bf16* safe) {
  constexpr int CH = D / 8;
#pragma unroll
  for (int i = threadIdx.x; i < ROWS * CH; i += NTH) {
    const int r = i / CH, c = i % CH;
    const bool ok = r < n_valid;
    cp_async16(smem_addr(smem + wg::sw128<ROWS>(r, c)), ok ? g + r * ld + c * 8 : safe, ok);
  }
}

// The forward with warpgroup MMAs: two warpgroups per 128-row query tile (64 rows each) share
// double-buffered 64-key K and V tiles. S = Q K^T reads both operands from shared memory;
// O += P V takes P from registers and V as an MN-major operand. Online softmax as
// attn_forward_kernel. A warpgroup skips the key tiles wholly after its rows.
template <int D>
__global__ void __launch_bounds__(2 * kThreads, 2) attn_forward_wgmma_kernel(AttnArgs p) {
#ifdef SF_WGMMA
  constexpr int BQ = 128, BK = 64, NTH = 2 * kThreads, KE = BK * D;
  extern __shared__ __align__(128) unsigned char smem_raw[];  // rounded up to 1024 below
  bf16* Qs = reinterpret_cast<bf16*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                     ~uintptr_t(1023));
  bf16* Kbuf = Qs + BQ * D;  // [2][BK, D]
  bf16* Vbuf = Kbuf + 2 * KE;  // [2][BK, D]
  const QueryBlock blk = query_block<BQ>(p);
  const int start = blk.start, len = blk.len, h = blk.h, hk = blk.hk, q0 = blk.q0;
  if (q0 >= len) return;
  const int wgi = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;

  const bf16* kg = p.k + int64_t(start) * p.ldk + hk * D;
  const bf16* vg = p.v + int64_t(start) * p.ldv + hk * D;
  load_tile_sw128<D, BQ, NTH>(Qs, p.q + int64_t(start + q0) * p.ldq + h * D, p.ldq,
                              min(BQ, len - q0), p.q);
  auto prefetch = [&](int j, int buf) {
    const int nk = min(BK, len - j * BK);
    load_tile_sw128<D, BK, NTH>(Kbuf + buf * KE, kg + int64_t(j) * BK * p.ldk, p.ldk, nk, p.k);
    load_tile_sw128<D, BK, NTH>(Vbuf + buf * KE, vg + int64_t(j) * BK * p.ldv, p.ldv, nk, p.v);
    cp_async_commit();
  };
  prefetch(0, 0);  // (Q travels in the same group)

  const int qw = q0 + wgi * 64;            // the warpgroup's first row
  const int row0 = qw + warp * 16 + g;     // query index of accumulator rows g (and +8)
  const int nkb = (min(q0 + BQ, len) - 1) / BK + 1;
  const int last = qw < len ? (min(qw + 63, len - 1)) / BK : -1;  // the warpgroup's last tile
  const uint32_t qs = smem_addr(Qs) + uint32_t(wgi * 64 * 128);  // its 64 rows (8 KiB in)
  float o[D / 8][4];
  zero(o);
  float(&of)[D / 2] = reinterpret_cast<float(&)[D / 2]>(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  for (int j = 0; j < nkb; ++j) {
    const int buf = j & 1;
    if (j + 1 < nkb) {
      prefetch(j + 1, buf ^ 1);  // that buffer's last reader finished before the loop's end
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    wg::fence_proxy_async();
    __syncthreads();  // tile j (and Q) landed for every thread
    if (j <= last) {  // warpgroup-uniform
      const uint32_t ks = smem_addr(Kbuf + buf * KE), vs = smem_addr(Vbuf + buf * KE);
      float s[32];
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)  // S = Q K^T
        wg::mma_ss_n64(s, wg::desc_k<BQ>(qs, kk), wg::desc_k<BK>(ks, kk), kk > 0);
      wg::commit();
      wg::wait<0>();
      // Mask the future where the tile reaches past the warp's first row. Scores stay
      // unscaled: the scale (> 0) goes into the row maximum and one FFMA per exponent.
      if (j * BK + BK - 1 > qw + warp * 16) {
#pragma unroll
        for (int i = 0; i < 32; ++i)
          if (j * BK + (i >> 2) * 8 + 2 * t4 + (i & 1) > row0 + ((i & 3) >> 1) * 8)
            s[i] = -INFINITY;
      }
      float alpha[2];
      online_softmax<8>(s, m, l, alpha, p.scale_log2);
      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int i = 0; i < D / 2; ++i) of[i] *= alpha[(i & 3) >> 1];
      }
      uint32_t a[4][4];
      wg::acc64_to_a(a, s);
      wg::fence();
#pragma unroll
      for (int kb = 0; kb < BK / 16; ++kb) {  // O += P V
        if constexpr (D == 128) wg::mma_rs_n128_tb(of, a[kb], wg::desc_mn<BK>(vs, kb));
        else wg::mma_rs_n64_tb(of, a[kb], wg::desc_mn<BK>(vs, kb));
      }
      wg::commit();
      wg::wait<0>();
    }
    // Every warp is done with buffer buf before it is refilled. (Prefetching after the tile's
    // first barrier instead, with one barrier per tile, made this kernel 3-4% slower at seq 4K
    // and 8K; the backward kernels gained 1%.)
    __syncthreads();
  }

  finish_forward_rows<D>(p, o, m, l, start, len, h, q0, row0, wgi * 64 + warp * 16, lane);
#else
  __trap();  // launched only on sm_90 devices, for which the build has sm_90a code
#endif
}

// dq as attn_dq_kernel (same arithmetic, 128-key tiles double-buffered) with warpgroup MMAs:
// S = Q K^T and dP = dO V^T read both operands from shared memory, and dQ += dS K takes dS
// from registers and K as an MN-major operand. A warpgroup reads each K/V element once per
// tile where four mma.sync warps read it four times (ncu: the mma.sync kernels were bound by
// shared-memory wavefronts, 63% of peak, short-scoreboard stalls first). WGS warpgroups of
// 64 rows share each K/V tile: with one, the K/V stream from L2 was ~3 TB/s.
template <int D, int WGS>
__global__ void __launch_bounds__(WGS * kThreads, 3 - WGS) attn_dq_wgmma_kernel(AttnArgs p) {
#ifdef SF_WGMMA
  constexpr int BK = 128, BQ = 64 * WGS, NTH = WGS * kThreads, QE = BQ * D, KE = BK * D;
  extern __shared__ __align__(128) unsigned char smem_raw[];  // rounded up to 1024 below
  bf16* Qs = reinterpret_cast<bf16*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                     ~uintptr_t(1023));
  bf16* dOs = Qs + QE;
  bf16* Kbuf = dOs + QE;       // [2][BK, D]
  bf16* Vbuf = Kbuf + 2 * KE;  // [2][BK, D]
  float* dl_s = reinterpret_cast<float*>(Vbuf + 2 * KE);  // [BQ]
  const QueryBlock blk = query_block<BQ>(p);
  const int start = blk.start, len = blk.len, h = blk.h, hk = blk.hk, q0 = blk.q0;
  if (q0 >= len) return;
  const int wgi = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int nq = min(BQ, len - q0);

  load_tile_sw128<D, BQ, NTH>(Qs, p.q + int64_t(start + q0) * p.ldq + h * D, p.ldq, nq, p.q);
  load_tile_sw128<D, BQ, NTH>(dOs, p.dout + int64_t(start + q0) * p.lddo + h * D, p.lddo, nq,
                              p.dout);
  cp_async_commit();
  auto prefetch = [&](int kt, int buf) {
    const int kb0 = kt * BK, nk = min(BK, len - kb0);
    load_tile_sw128<D, BK, NTH>(Kbuf + buf * KE, p.k + int64_t(start + kb0) * p.ldk + hk * D,
                                p.ldk, nk, p.k);
    load_tile_sw128<D, BK, NTH>(Vbuf + buf * KE, p.v + int64_t(start + kb0) * p.ldv + hk * D,
                                p.ldv, nk, p.v);
    cp_async_commit();
  };
  const int kend = min(len, q0 + BQ);
  const int n_kt = (kend + BK - 1) / BK;
  prefetch(0, 0);
  dq_tile_delta<D>(p, start, q0, h, nq, dl_s);
  __syncthreads();
  const int qw = q0 + wgi * 64;         // the warpgroup's first row
  const int row0 = qw + warp * 16 + g;  // query index of accumulator rows g (and +8)
  float lse2[2], delta[2];
  dq_row_stats(p, start, len, h, row0, wgi * 64 + warp * 16 + g, dl_s, lse2, delta);
  const uint32_t qs = smem_addr(Qs) + uint32_t(wgi * 64 * 128),  // its 64 rows (8 KiB in)
      dos = smem_addr(dOs) + uint32_t(wgi * 64 * 128);

  float dq[D / 8][4];
  zero(dq);
  float(&dqf)[D / 2] = reinterpret_cast<float(&)[D / 2]>(dq);
  for (int kt = 0; kt < n_kt; ++kt) {
    const int buf = kt & 1, kb0 = kt * BK;
    cp_async_wait<0>();       // tile kt (prefetched during tile kt - 1) landed
    wg::fence_proxy_async();  // this thread's copies, visible to the MMAs' async proxy
    __syncthreads();          // ... for every thread; every warp is done with tile kt - 1
    const uint32_t ks = smem_addr(Kbuf + buf * KE), vs = smem_addr(Vbuf + buf * KE);
    // The last tile (keys q0 .. q0 + 127) is the diagonal of both warpgroups, masked below.
    float s[BK / 2], dp[BK / 2];
    wg::fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)  // S = Q K^T
      wg::mma_ss_n128(s, wg::desc_k<BQ>(qs, kk), wg::desc_k<BK>(ks, kk), kk > 0);
    wg::commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)  // dP = dO V^T
      wg::mma_ss_n128(dp, wg::desc_k<BQ>(dos, kk), wg::desc_k<BK>(vs, kk), kk > 0);
    wg::commit();
    // The next tile's copies go out while the MMAs run (issued before them, they delayed
    // every tile's first MMA by the copies' ~100 instructions per thread).
    if (kt + 1 < n_kt) prefetch(kt + 1, buf ^ 1);
    wg::wait<1>();  // S is ready (dP may still run)
    // P = exp(scale * s - lse); only a tile reaching past the warpgroup's first row needs the
    // causal mask (warpgroup-uniform test).
#pragma unroll
    for (int i = 0; i < BK / 2; ++i) s[i] = exp2_ftz(fmaf(s[i], p.scale_log2, -lse2[(i & 3) >> 1]));
    if (kb0 + BK - 1 > qw) {
#pragma unroll
      for (int i = 0; i < BK / 2; ++i)
        if (kb0 + (i >> 2) * 8 + 2 * t4 + (i & 1) > row0 + ((i & 3) >> 1) * 8) s[i] = 0.f;
    }
    wg::wait<0>();
#pragma unroll
    for (int i = 0; i < BK / 2; ++i) dp[i] = s[i] * (dp[i] - delta[(i & 3) >> 1]);
    uint32_t a[BK / 16][4];
    wg::acc_to_a<BK / 16>(a, dp);
    wg::fence();
#pragma unroll
    for (int kb = 0; kb < BK / 16; ++kb) {  // dQ += dS K
      if constexpr (D == 128) wg::mma_rs_n128_tb(dqf, a[kb], wg::desc_mn<BK>(ks, kb));
      else wg::mma_rs_n64_tb(dqf, a[kb], wg::desc_mn<BK>(ks, kb));
    }
    wg::commit();
    wg::wait<0>();
  }
  store_rows<D>(p.o + int64_t(start + q0) * p.ld_o + h * D, p.ld_o, wgi * 64 + warp * 16, nq,
                dq, p.scale, p.scale, lane);
#else
  __trap();  // launched only on sm_90 devices, for which the build has sm_90a code
#endif
}

// dk, dv as attn_dkdv_kernel (query tiles of 64 rows double-buffered, same work items) with
// warpgroup MMAs: S^T = K Q^T and dP^T = V dO^T read both operands from shared memory;
// dV += P^T dO and dK += dS^T Q take P^T and dS^T from registers and dO, Q as MN-major
// operands. WGS warpgroups of 64 keys share each query tile (one item's Q, dO stream from L2
// serves 64 WGS keys).
// ATOMIC_DQ: the whole backward in one pass (5 products per tile pair against the two
// kernels' 7): dS^T also goes to shared memory, dQ = dS K is an SS product with both operands
// MN-major, and it is added into p.dq_acc with atomics. At D 128 the two warpgroups share the
// tile's [128 keys, 64 queries] dS^T and each adds half of dQ's columns over all 128 keys (half
// the atomics of per-warpgroup partials); at D 64 a column half would start inside a swizzle
// atom, so each adds its own keys' partial.
template <int D, int WGS, bool ATOMIC_DQ = false>
__global__ void __launch_bounds__(WGS * kThreads, 3 - WGS) attn_dkdv_wgmma_kernel(AttnArgs p) {
#ifdef SF_WGMMA
  static_assert(!ATOMIC_DQ || WGS == 2, "the atomic dQ splits its work over two warpgroups");
  constexpr int BQ = 64, KB = 64 * WGS, NTH = WGS * kThreads, KE = KB * D, QE = BQ * D;
  extern __shared__ __align__(128) unsigned char smem_raw[];  // rounded up to 1024 below
  bf16* Ks = reinterpret_cast<bf16*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) &
                                     ~uintptr_t(1023));
  bf16* Vs = Ks + KE;
  bf16* Qbuf = Vs + KE;                                           // [2][BQ, D]
  bf16* dObuf = Qbuf + 2 * QE;                                    // [2][BQ, D]
  float* lse_buf = reinterpret_cast<float*>(dObuf + 2 * QE);      // [2][BQ], natural log
  float* dl_buf = lse_buf + 2 * BQ;                               // [2][BQ]
  bf16* dSt = Ks + 2 * KE + 4 * QE + 512;  // ATOMIC_DQ: [KB, BQ] after the 1 KiB of statistics
  const KeyBlock blk = key_block<KB>(p);
  const int start = blk.start, len = blk.len, hk = blk.hk, k0 = blk.k0;
  if (k0 >= len) return;
  const int wgi = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int t4 = lane & 3;

  load_tile_sw128<D, KB, NTH>(Ks, p.k + int64_t(start + k0) * p.ldk + hk * D, p.ldk,
                              min(KB, len - k0), p.k);
  load_tile_sw128<D, KB, NTH>(Vs, p.v + int64_t(start + k0) * p.ldv + hk * D, p.ldv,
                              min(KB, len - k0), p.v);
  cp_async_commit();

  const DkdvItems items = dkdv_items<BQ>(p, k0, len);  // (the first query tile: KB % BQ == 0)
  const int n_items = items.n_items;
  auto prefetch = [&](int it, int buf) {
    int gi, q0;
    dkdv_item<BQ>(items, it, gi, q0);
    const int h = hk * p.group + gi, nq = min(BQ, len - q0);
    load_tile_sw128<D, BQ, NTH>(Qbuf + buf * QE, p.q + int64_t(start + q0) * p.ldq + h * D,
                                p.ldq, nq, p.q);
    load_tile_sw128<D, BQ, NTH>(dObuf + buf * QE, p.dout + int64_t(start + q0) * p.lddo + h * D,
                                p.lddo, nq, p.dout);
    load_row_stats<BQ, NTH>(lse_buf + buf * BQ, dl_buf + buf * BQ, p, start, q0, h, nq);
    cp_async_commit();
  };

  float dk[D / 8][4], dv[D / 8][4];
  zero(dk);
  zero(dv);
  float(&dkf)[D / 2] = reinterpret_cast<float(&)[D / 2]>(dk);
  float(&dvf)[D / 2] = reinterpret_cast<float(&)[D / 2]>(dv);
  const int kw0 = k0 + wgi * 64;                 // the warpgroup's first key
  const int krow0 = kw0 + warp * 16 + (lane >> 2);  // key index of accumulator rows g (and +8)
  const uint32_t ks = smem_addr(Ks) + uint32_t(wgi * 64 * 128),  // its 64 rows (8 KiB in)
      vs = smem_addr(Vs) + uint32_t(wgi * 64 * 128);

  prefetch(0, 0);
  for (int it = 0; it < n_items; ++it) {
    const int buf = it & 1;
    cp_async_wait<0>();       // item it (prefetched during item it - 1) landed
    wg::fence_proxy_async();  // this thread's copies, visible to the MMAs' async proxy
    __syncthreads();          // ... for every thread; every warp is done with item it - 1
    int gi, q0;
    dkdv_item<BQ>(items, it, gi, q0);
    const int nq = min(BQ, len - q0);
    const uint32_t qs = smem_addr(Qbuf + buf * QE), dos = smem_addr(dObuf + buf * QE);
    // Warpgroup 1 also runs the items wholly before its keys (masked to zero, adding nothing):
    // skipping them behind a warpgroup-uniform branch made the kernels 5% slower.
    uint32_t b[4][4];
    dkdv_item_products<D, KB>(dkf, dvf, b, ks, vs, qs, dos, kw0, krow0, q0, nq, t4, p.scale_log2,
                              smem_addr(lse_buf + buf * BQ), smem_addr(dl_buf + buf * BQ), [&] {
      if (it + 1 < n_items) prefetch(it + 1, buf ^ 1);  // while the MMAs run (as in dq)
    });
    if constexpr (ATOMIC_DQ) {
      store_ds_t<KB>(smem_addr(dSt), b, wgi * 64 + warp * 16, lane);
      wg::fence_proxy_async();  // the stores, visible to the MMAs' async proxy
      if constexpr (D == 128) {
        __syncthreads();  // both warpgroups' dS^T rows are in (the previous item's were read)
      } else {
        // This warpgroup's rows are in (immediate ids: a register id reserves all 16).
        if (wgi == 0) asm volatile("bar.sync 1, 128;\n" ::: "memory");
        else asm volatile("bar.sync 2, 128;\n" ::: "memory");
      }
      float dq[32];
      dq_item_product<D>(dq, smem_addr(dSt), smem_addr(Ks), wgi);
      const int h = hk * p.group + gi;
      float* tile = p.dq_acc + dq_acc_row(p.acc_rows, h, blk.seq, start, q0) * D;
      add_dq_frags(tile + (D == 128 ? wgi * 64 * 64 : 0), dq, threadIdx.x & 127);
    } else {
      wg::wait<0>();
    }
  }
  store_rows<D>(p.dk + int64_t(start + k0) * p.lddk + hk * D, p.lddk, wgi * 64 + warp * 16,
                len - k0, dk, p.scale, p.scale, lane);
  store_rows<D>(p.dv + int64_t(start + k0) * p.lddv + hk * D, p.lddv, wgi * 64 + warp * 16,
                len - k0, dv, 1.f, 1.f, lane);
#else
  __trap();  // launched only on sm_90 devices, for which the build has sm_90a code
#endif
}

template <int D>
void forward_sm90_d(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh) {
  // Q + two stages of K, V; + 1 KiB to align the tiles.
  const size_t smem = (128 + 4 * size_t(kTile)) * D * sizeof(bf16) + 1024;
  static std::once_flag once;
  std::call_once(once, [&] { set_smem(attn_forward_wgmma_kernel<D>, smem); });
  const dim3 grid((sh.max_seqlen + 127) / 128, sh.n_seqs, sh.n_heads);
  attn_forward_wgmma_kernel<D><<<grid, 2 * kThreads, smem, s>>>(a);
  CUDA_CHECK_LAUNCH();
}

template <int D, int WGS, bool ATOMIC_DQ = false>
void dkdv_sm90(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh) {
  // K, V of 64 WGS keys + two stages of 64-row Q, dO (+ lse, delta, padded to 1 KiB); the
  // atomic form's [64 WGS, 64] dS^T; + 1 KiB to align.
  const size_t smem = (2 * 64 * WGS + 4 * 64) * size_t(D) * sizeof(bf16) + 1024 +
                      (ATOMIC_DQ ? 64 * WGS * 64 * sizeof(bf16) : 0) + 1024;
  static std::once_flag once;
  std::call_once(once, [&] { set_smem(attn_dkdv_wgmma_kernel<D, WGS, ATOMIC_DQ>, smem); });
  const unsigned tiles = unsigned((sh.max_seqlen + 64 * WGS - 1) / (64 * WGS));
  attn_dkdv_wgmma_kernel<D, WGS, ATOMIC_DQ>
      <<<dim3(tiles, sh.n_seqs, sh.n_kv_heads), WGS * kThreads, smem, s>>>(a);
  CUDA_CHECK_LAUNCH();
}

template <int D, int WGS>
void dq_sm90(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh) {
  // Q, dO of 64 WGS rows + two stages of 128-key K, V (+ delta); + 1 KiB to align.
  const size_t smem = (2 * 64 * WGS + 4 * 128) * size_t(D) * sizeof(bf16) + 64 * WGS * 4 + 1024;
  static std::once_flag once;
  std::call_once(once, [&] { set_smem(attn_dq_wgmma_kernel<D, WGS>, smem); });
  const unsigned tiles = unsigned((sh.max_seqlen + 64 * WGS - 1) / (64 * WGS));
  attn_dq_wgmma_kernel<D, WGS><<<dim3(tiles, sh.n_seqs, sh.n_heads), WGS * kThreads, smem, s>>>(a);
  CUDA_CHECK_LAUNCH();
}

// Two warpgroups per block in both kernels: against one (two blocks per SM instead), the
// backward ran 10% faster at seq 4K and 8K on the H200 (the streamed tiles' L2 traffic halves).
template <int D>
void backward_sm90_d(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh) {
  dkdv_sm90<D, 2>(s, a, sh);
  dq_sm90<D, 2>(s, a, sh);
}

// dq = scale x the accumulator, as bf16: a block per (64-row tile, sequence, query head), each
// thread a few of the tile's float4 slots (dq_acc_slot), rows past the sequence's end skipped.
template <int D>
__global__ void __launch_bounds__(256) dq_from_acc_kernel(AttnArgs p) {
  const int q0 = blockIdx.x * kAccTileRows, seq = blockIdx.y, h = blockIdx.z;
  const int start = p.cu[seq], nq = min(kAccTileRows, p.cu[seq + 1] - start - q0);
  if (nq <= 0) return;
  const float4* tile =
      reinterpret_cast<const float4*>(p.dq_acc + dq_acc_row(p.acc_rows, h, seq, start, q0) * D);
  bf16* dq = p.o + int64_t(start + q0) * p.ld_o + h * D;
#pragma unroll
  for (int f = threadIdx.x; f < 16 * D; f += 256) {
    const float4 v = tile[f];
    const AccSlot at = dq_acc_slot(f);
    if (at.row < nq)
      *reinterpret_cast<uint32_t*>(dq + int64_t(at.row) * p.ld_o + at.col) =
          pack_bf16(v.x * p.scale, v.y * p.scale);
    if (at.row + 8 < nq)
      *reinterpret_cast<uint32_t*>(dq + int64_t(at.row + 8) * p.ld_o + at.col) =
          pack_bf16(v.z * p.scale, v.w * p.scale);
  }
}

}  // namespace

void backward_atomic_sm90(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh, bool ws) {
  if (ws) backward_ws_sm90(s, a, sh);
  else if (sh.head_dim == 64) dkdv_sm90<64, 2, true>(s, a, sh);
  else dkdv_sm90<128, 2, true>(s, a, sh);
  const dim3 grid((sh.max_seqlen + kAccTileRows - 1) / kAccTileRows, sh.n_seqs, sh.n_heads);
  if (sh.head_dim == 64) dq_from_acc_kernel<64><<<grid, 256, 0, s>>>(a);
  else dq_from_acc_kernel<128><<<grid, 256, 0, s>>>(a);
  CUDA_CHECK_LAUNCH();
}

void forward_sm90(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh) {
  if (sh.head_dim == 64) forward_sm90_d<64>(s, a, sh);
  else forward_sm90_d<128>(s, a, sh);
}

void backward_sm90(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh) {
  if (sh.head_dim == 64) backward_sm90_d<64>(s, a, sh);
  else backward_sm90_d<128>(s, a, sh);
}

}  // namespace sf::cuda::attn
