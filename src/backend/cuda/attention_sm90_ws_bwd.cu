// The warp-specialised backward with atomic dQ (sm_90a): one pass over (key tile, query tile)
// pairs, FlashAttention-3's structure in our contract (attention.cuh). A block owns 128 keys of
// one kv head (K, V stay in shared memory); a producer warpgroup, of which one thread issues
// the copies, streams the items' Q and dO (item: query head of the group, 64-row query tile)
// by TMA through an mbarrier ring. Two consumer warpgroups (64 keys each) compute, with the
// registers the producer gave up; each thread reads its 16 query columns' lse and delta from
// global memory (L2) while its first products run:
//   S^T = K Q^T, dP^T = V dO^T     (both operands from shared memory)
//   dV += P^T dO, dK += dS^T Q      (P^T, dS^T from registers)
//   dQ  = dS K                      (dS^T through shared memory; added into an f32 accumulator
//                                    with atomics, then scaled into dq by another kernel)
// Same arithmetic as attn_dkdv_wgmma_kernel, in the same order, so dk and dv match the
// deterministic backward's bit for bit. At D 128 the consumers share each item's
// [128 keys, 64 queries] dS^T and each adds half of dQ's columns over all 128 keys; at D 64
// each adds its own keys' partial (a column half would start inside a swizzle atom).
#include <mutex>

#include "backend/cuda/attention_sm90.cuh"
#include "backend/cuda/attention_tiles.cuh"
#include "backend/cuda/tma.cuh"
#include "backend/cuda/wgmma.cuh"

namespace sf::cuda::attn {
namespace {

constexpr int kBwBQ = 64, kBwKB = 128, kBwStages = 2, kBwThreads = 3 * kThreads;

// Shared memory: K and V [128, D]; the ring's Q and dO tiles [64, D]; two [128, 64] dS^T
// tiles (item parity); the barriers. Tiles sw128.
template <int D>
struct BwSmem {
  static constexpr int kKvBytes = kBwKB * D * 2, kQBytes = kBwBQ * D * 2;
  static constexpr int kDsBytes = kBwKB * kBwBQ * 2;
  static constexpr int kK = 0, kV = kKvBytes, kQ = 2 * kKvBytes;
  static constexpr int kDo = kQ + kBwStages * kQBytes, kDs = kDo + kBwStages * kQBytes;
  static constexpr int kBars = kDs + 2 * kDsBytes;
  static constexpr int kBytes = kBars + (1 + 2 * kBwStages) * 8;
  static_assert(kK % 1024 == 0 && kV % 1024 == 0 && kQ % 1024 == 0 && kDo % 1024 == 0 &&
                    kDs % 1024 == 0 && kQBytes % 1024 == 0,
                "the 128B swizzle's atoms are 1024-byte aligned");
  static_assert(kBytes + 1024 <= 227 * 1024, "an sm_90 block has 227 KiB of shared memory");
};

struct BwMaps {
  CUtensorMap k, v, q, dout;  // [128, 64] boxes for K, V; [64, 64] for Q, dO
};

#ifdef SF_WGMMA

// The producer thread: K and V once, then each item's Q and dO into its stage, once both
// consumers released the stage's previous item.
template <int D>
__device__ __forceinline__ void produce_bwd(unsigned char* sm, uint64_t* bar_kv, uint64_t* full,
                                            uint64_t* empty, const BwMaps& m, const AttnArgs& p,
                                            const KeyBlock& blk, const DkdvItems& items) {
  using L = BwSmem<D>;
  tma::mbar_expect_tx(bar_kv, 2 * L::kKvBytes);
  tma::load_tile<D, kBwKB>(sm + L::kK, &m.k, blk.hk * D, blk.start + blk.k0, bar_kv);
  tma::load_tile<D, kBwKB>(sm + L::kV, &m.v, blk.hk * D, blk.start + blk.k0, bar_kv);
  for (int it = 0; it < items.n_items; ++it) {
    const int st = it % kBwStages;
    if (it >= kBwStages) tma::mbar_wait(&empty[st], uint32_t((it / kBwStages - 1) & 1));
    int gi, q0;
    dkdv_item<kBwBQ>(items, it, gi, q0);
    const int h = blk.hk * p.group + gi, row = blk.start + q0;
    tma::mbar_expect_tx(&full[st], 2 * L::kQBytes);
    tma::load_tile<D, kBwBQ>(sm + L::kQ + st * L::kQBytes, &m.q, h * D, row, &full[st]);
    tma::load_tile<D, kBwBQ>(sm + L::kDo + st * L::kQBytes, &m.dout, h * D, row, &full[st]);
  }
}

#endif  // SF_WGMMA

template <int D>
__global__ void __launch_bounds__(kBwThreads, 1)
    attn_bwd_ws_kernel(const __grid_constant__ BwMaps maps, AttnArgs p) {
#ifdef SF_WGMMA
  using L = BwSmem<D>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* sm = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* bar_kv = reinterpret_cast<uint64_t*>(sm + L::kBars);
  uint64_t* full = bar_kv + 1;
  uint64_t* empty = full + kBwStages;
  const KeyBlock blk = key_block<kBwKB>(p);
  if (blk.k0 >= blk.len) return;  // the whole block, before any barrier
  const DkdvItems items = dkdv_items<kBwBQ>(p, blk.k0, blk.len);
  if (threadIdx.x == 0) {
    tma::mbar_init(bar_kv, 1);
    for (int st = 0; st < kBwStages; ++st) {
      tma::mbar_init(&full[st], 1);
      tma::mbar_init(&empty[st], 2 * kThreads);  // every consumer thread, after its wait
    }
    tma::mbar_init_fence();
  }
  __syncthreads();
  const int wgi = threadIdx.x >> 7;  // 0: producer, 1-2: consumers
  if (wgi == 0) {
    tma::regs_dec<24>();
    if (threadIdx.x == 0) produce_bwd<D>(sm, bar_kv, full, empty, maps, p, blk, items);
    return;
  }

  tma::regs_inc<240>();
  const int cw = wgi - 1;  // consumer warpgroup: keys k0 + 64 cw ..
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, t4 = lane & 3;
  const int start = blk.start, len = blk.len, k0 = blk.k0;
  const int kw0 = k0 + cw * 64;                     // the warpgroup's first key
  const int krow0 = kw0 + warp * 16 + (lane >> 2);  // key index of accumulator rows g (and +8)
  const uint32_t ks_all = smem_addr(sm + L::kK), vs_all = smem_addr(sm + L::kV);
  const uint32_t ks = ks_all + uint32_t(cw * 64 * 128), vs = vs_all + uint32_t(cw * 64 * 128);

  float dk[D / 8][4], dv[D / 8][4];
  zero(dk);
  zero(dv);
  float(&dkf)[D / 2] = reinterpret_cast<float(&)[D / 2]>(dk);
  float(&dvf)[D / 2] = reinterpret_cast<float(&)[D / 2]>(dv);
  tma::mbar_wait(bar_kv, 0);
  for (int it = 0; it < items.n_items; ++it) {
    const int st = it % kBwStages;
    tma::mbar_wait(&full[st], uint32_t((it / kBwStages) & 1));
    int gi, q0;
    dkdv_item<kBwBQ>(items, it, gi, q0);
    const int nq = min(kBwBQ, len - q0);
    const uint32_t qs = smem_addr(sm + L::kQ + st * L::kQBytes),
                   dos = smem_addr(sm + L::kDo + st * L::kQBytes);
    const int h = blk.hk * p.group + gi;
    uint32_t b[4][4];
    dkdv_item_products<D, kBwKB>(dkf, dvf, b, ks, vs, qs, dos, kw0, krow0, q0, nq, t4,
                                 p.scale_log2, [&](float (&lse_c)[16], float (&dl_c)[16]) {
      const int64_t stat = int64_t(h) * p.T + start + q0;  // (0 past the end: masked)
#pragma unroll
      for (int c = 0; c < 16; ++c) {
        const int qi = (c >> 1) * 8 + 2 * t4 + (c & 1);
        lse_c[c] = qi < nq ? p.lse[stat + qi] * kLog2e : 0.f;
        dl_c[c] = qi < nq ? p.delta[stat + qi] : 0.f;
      }
    });
    // dS^T through shared memory for dQ = dS K (the buffer of this item's parity: the
    // consumers' sync of the previous item ordered its last reads before these writes).
    unsigned char* ds_tile = sm + L::kDs + (it & 1) * L::kDsBytes;
    store_ds_t<kBwKB>(reinterpret_cast<bf16*>(ds_tile), b, cw * 64 + warp * 16, lane);
    wg::fence_proxy_async();
    if constexpr (D == 128) tma::bar_sync(1, 2 * kThreads);  // both consumers' rows are in
    else if (cw == 0) tma::bar_sync(2, kThreads);             // this consumer's rows are in
    else tma::bar_sync(3, kThreads);
    float dq[32];
    dq_item_product<D>(dq, smem_addr(ds_tile), ks_all, cw);  // (waits for dK and dV too)
    tma::mbar_arrive(&empty[st]);  // this thread is done with the stage
    add_dq_rows(p.dq_acc + int64_t(start + q0) * p.ldacc + h * D, p.ldacc, dq, warp * 16, nq,
                D == 128 ? cw * 64 : 0, lane);
  }
  store_rows<D>(p.dk + int64_t(start + k0) * p.lddk + blk.hk * D, p.lddk, cw * 64 + warp * 16,
                len - k0, dk, p.scale, p.scale, lane);
  store_rows<D>(p.dv + int64_t(start + k0) * p.lddv + blk.hk * D, p.lddv, cw * 64 + warp * 16,
                len - k0, dv, 1.f, 1.f, lane);
#else
  __trap();  // launched only on sm_90 devices, for which the build has sm_90a code
#endif
}

template <int D>
void backward_ws_d(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh) {
  const size_t smem = size_t(BwSmem<D>::kBytes) + 1024;  // + 1 KiB to align the tiles
  static std::once_flag once;
  std::call_once(once, [&] { set_smem(attn_bwd_ws_kernel<D>, smem); });
  const int64_t kv_cols = int64_t(sh.n_kv_heads) * D, q_cols = int64_t(sh.n_heads) * D;
  BwMaps m;
  m.k = tma::tile_map(a.k, a.T, kv_cols, a.ldk, kBwKB);
  m.v = tma::tile_map(a.v, a.T, kv_cols, a.ldv, kBwKB);
  m.q = tma::tile_map(a.q, a.T, q_cols, a.ldq, kBwBQ);
  m.dout = tma::tile_map(a.dout, a.T, q_cols, a.lddo, kBwBQ);
  const unsigned tiles = unsigned((sh.max_seqlen + kBwKB - 1) / kBwKB);
  attn_bwd_ws_kernel<D><<<dim3(tiles, sh.n_seqs, sh.n_kv_heads), kBwThreads, smem, s>>>(m, a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void backward_ws_sm90(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh) {
  if (sh.head_dim == 64) backward_ws_d<64>(s, a, sh);
  else backward_ws_d<128>(s, a, sh);
}

}  // namespace sf::cuda::attn
