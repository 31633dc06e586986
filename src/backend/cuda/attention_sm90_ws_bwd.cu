// The warp-specialised backward with atomic dQ (sm_90a): one pass over (key tile, query tile)
// pairs, FlashAttention-3's structure in our contract (attention.cuh). A block owns 128 keys of
// one kv head (K, V stay in shared memory) and runs the items (query head of the group, 64-row
// query tile) that see them. Its first warpgroup gives its registers to the other two and
// keeps two threads: the producer streams each item's Q and dO by TMA through an mbarrier
// ring (with its rows' lse and delta, laid out beside the accumulator by ws_stats_kernel), the
// dQ writer adds each item's dQ tile into the f32 accumulator with bulk reduce-adds of the copy
// engine. The two consumer warpgroups (64 keys each) compute:
//   S^T = K Q^T, dP^T = V dO^T     (both operands from shared memory)
//   dV += P^T dO, dK += dS^T Q      (P^T, dS^T from registers)
//   dQ  = dS K                      (dS^T through shared memory; the f32 product goes to
//                                    shared memory in the accumulator's order, and the writer
//                                    adds it, so the consumers issue no atomics)
// Same arithmetic as attn_dkdv_wgmma_kernel, in the same order, so dk and dv match the
// deterministic backward's bit for bit. At D 128 the consumers share each item's
// [128 keys, 64 queries] dS^T and each computes half of dQ's columns over all 128 keys; at D 64
// each computes its own keys' partial over all columns (a column half would start inside a
// swizzle atom) and the writer adds both partials.
#include <mutex>

#include "backend/cuda/attention_sm90.cuh"
#include "backend/cuda/attention_tiles.cuh"
#include "backend/cuda/tma.cuh"
#include "backend/cuda/wgmma.cuh"

namespace sf::cuda::attn {
namespace {

constexpr int kBwBQ = 64, kBwKB = 128, kBwStages = 2, kBwThreads = 3 * kThreads;

// Shared memory: K and V [128, D]; the ring's Q and dO tiles [64, D]; two [128, 64] dS^T tiles
// (item parity); the two consumers' [64, 64] f32 dQ products (the accumulator's order); the
// ring's lse and delta rows [64] f32; the barriers. bf16 tiles sw128.
template <int D>
struct BwSmem {
  static constexpr int kKvBytes = kBwKB * D * 2, kQBytes = kBwBQ * D * 2;
  static constexpr int kDsBytes = kBwKB * kBwBQ * 2, kDqHalf = kBwBQ * 64 * 4;
  static constexpr int kK = 0, kV = kKvBytes, kQ = 2 * kKvBytes;
  static constexpr int kDo = kQ + kBwStages * kQBytes, kDs = kDo + kBwStages * kQBytes;
  static constexpr int kDq = kDs + 2 * kDsBytes, kStats = kDq + 2 * kDqHalf;
  static constexpr int kStatBytes = kBwBQ * 4;  // a stage's lse, then its delta
  static constexpr int kBars = kStats + kBwStages * 2 * kStatBytes;
  static constexpr int kNumBars = 1 + 2 * kBwStages + 4;  // kv, full, empty, dq_full, dq_empty
  static constexpr int kBytes = kBars + kNumBars * 8;
  static_assert(kK % 1024 == 0 && kV % 1024 == 0 && kQ % 1024 == 0 && kDo % 1024 == 0 &&
                    kDs % 1024 == 0 && kQBytes % 1024 == 0,
                "the 128B swizzle's atoms are 1024-byte aligned");
  static_assert(kBytes + 1024 <= 227 * 1024, "an sm_90 block has 227 KiB of shared memory");
};

struct BwMaps {
  CUtensorMap k, v, q, dout;  // [128, 64] boxes for K, V; [64, 64] for Q, dO
};

// The block's barriers, in shared memory after the tiles, by their shared-memory addresses.
struct BwBars {
  uint32_t base;
  __device__ uint32_t kv() const { return base; }  // K and V landed (tx)
  // [stage]: the item's Q and dO landed (tx); both consumers are done with it (256 arrivals)
  __device__ uint32_t full(int st) const { return base + 8 * (1 + st); }
  __device__ uint32_t empty(int st) const { return base + 8 * (1 + kBwStages + st); }
  // [consumer]: its dQ product is in shared memory (128 arrivals); the writer has read it (1)
  __device__ uint32_t dq_full(int c) const { return base + 8 * (1 + 2 * kBwStages + c); }
  __device__ uint32_t dq_empty(int c) const { return base + 8 * (3 + 2 * kBwStages + c); }
};

#ifdef SF_WGMMA

__device__ __forceinline__ void init_bars(const BwBars& b) {
  tma::mbar_init(b.kv(), 1);
  for (int st = 0; st < kBwStages; ++st) {
    tma::mbar_init(b.full(st), 1);
    tma::mbar_init(b.empty(st), 2 * kThreads);  // every consumer thread, after its wait
  }
  for (int c = 0; c < 2; ++c) {
    tma::mbar_init(b.dq_full(c), kThreads);
    tma::mbar_init(b.dq_empty(c), 1);
  }
  tma::mbar_init_fence();
}

// All three roles walk the block's items in the same order, query head gi of the group outer,
// query tiles q0 = k0, k0 + 64, .. < len inner (the tiles before k0 see none of the block's
// keys), counting them in `it` (stage and barrier parities); nested loops rather than
// dkdv_item's division, for the producer warpgroup's 24 registers.

// The producer thread: K and V once, then each item's Q, dO and its rows' lse and delta into
// its stage, once both consumers released the stage's previous item.
template <int D>
__device__ __forceinline__ void produce_bwd(unsigned char* sm, const BwBars& bars,
                                            const BwMaps& m, const AttnArgs& p,
                                            const KeyBlock& blk) {
  using L = BwSmem<D>;
  tma::mbar_expect_tx(bars.kv(), 2 * L::kKvBytes);
  tma::load_tile<D, kBwKB>(sm + L::kK, &m.k, blk.hk * D, blk.start + blk.k0, bars.kv());
  tma::load_tile<D, kBwKB>(sm + L::kV, &m.v, blk.hk * D, blk.start + blk.k0, bars.kv());
  int it = 0;
#pragma unroll 1
  for (int gi = 0; gi < p.group; ++gi) {
    const int h = blk.hk * p.group + gi;
    const float* lse = p.acc_lse + dq_acc_row(p.acc_rows, h, blk.seq, blk.start, blk.k0);
    const float* delta = p.acc_delta + (lse - p.acc_lse);
#pragma unroll 1
    for (int q0 = blk.k0; q0 < blk.len; q0 += kBwBQ, ++it) {
      const int st = it % kBwStages;
      if (it >= kBwStages) tma::mbar_wait(bars.empty(st), uint32_t((it / kBwStages - 1) & 1));
      const uint32_t full = bars.full(st);
      tma::mbar_expect_tx(full, 2 * L::kQBytes + 2 * L::kStatBytes);
      tma::load_tile<D, kBwBQ>(sm + L::kQ + st * L::kQBytes, &m.q, h * D, blk.start + q0, full);
      tma::load_tile<D, kBwBQ>(sm + L::kDo + st * L::kQBytes, &m.dout, h * D, blk.start + q0,
                               full);
      unsigned char* stats = sm + L::kStats + st * 2 * L::kStatBytes;
      tma::load_bulk(stats, lse + (q0 - blk.k0), L::kStatBytes, full);
      tma::load_bulk(stats + L::kStatBytes, delta + (q0 - blk.k0), L::kStatBytes, full);
    }
  }
}

// The dQ writer thread: for each item, once a consumer's product is in shared memory, adds it
// into the item's accumulator tile (D 128: the consumer's column block; D 64: the whole tile,
// once per consumer), then hands both buffers back when the copy engine has read them.
template <int D>
__device__ __forceinline__ void write_dq(unsigned char* sm, const BwBars& bars,
                                         const AttnArgs& p, const KeyBlock& blk) {
  using L = BwSmem<D>;
  const uint32_t src = tma::saddr(sm + L::kDq);
  int it = 0;
#pragma unroll 1
  for (int gi = 0; gi < p.group; ++gi) {
    float* tile = p.dq_acc +
        dq_acc_row(p.acc_rows, blk.hk * p.group + gi, blk.seq, blk.start, blk.k0) * D;
#pragma unroll 1
    for (int q0 = blk.k0; q0 < blk.len; q0 += kBwBQ, tile += kBwBQ * D, ++it) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        tma::mbar_wait(bars.dq_full(c), uint32_t(it & 1));
        tma::bulk_reduce_add_f32(D == 128 ? tile + c * kBwBQ * 64 : tile,
                                 src + uint32_t(c * L::kDqHalf), L::kDqHalf);
      }
      tma::bulk_commit();
      tma::bulk_wait_read<0>();
      tma::mbar_arrive(bars.dq_empty(0));
      tma::mbar_arrive(bars.dq_empty(1));
    }
  }
  tma::bulk_wait<0>();
}

// A consumer thread's part of item `it` (query rows q0 .. q0 + nq of a query head): its
// warpgroup's keys from kw0 on, dK and dV accumulated in dkf, dvf; the Q, dO and statistics of
// the item's stage, then its dQ product handed to the writer.
template <int D>
__device__ __forceinline__ void consume_item(unsigned char* sm, const BwBars& bars, int it,
                                             int q0, int nq, int kw0, float scale_log2,
                                             float (&dkf)[D / 2], float (&dvf)[D / 2]) {
  using L = BwSmem<D>;
  const int cw = (threadIdx.x >> 7) - 1, t = threadIdx.x & 127;
  const int warp = t >> 5, lane = t & 31;
  const int krow0 = kw0 + warp * 16 + (lane >> 2);  // key index of accumulator rows g (and +8)
  const int st = it % kBwStages;
  const uint32_t ks_all = smem_addr(sm + L::kK);
  const uint32_t ks = ks_all + uint32_t(cw * 64 * 128),
                 vs = smem_addr(sm + L::kV) + uint32_t(cw * 64 * 128);
  const uint32_t qs = smem_addr(sm + L::kQ + st * L::kQBytes),
                 dos = smem_addr(sm + L::kDo + st * L::kQBytes);
  const uint32_t stats = smem_addr(sm + L::kStats + st * 2 * L::kStatBytes);
  tma::mbar_wait(bars.full(st), uint32_t((it / kBwStages) & 1));
  uint32_t b[4][4];
  dkdv_item_products<D, kBwKB>(dkf, dvf, b, ks, vs, qs, dos, kw0, krow0, q0, nq, lane & 3,
                               scale_log2, stats, stats + L::kStatBytes, [] {});
  // dS^T through shared memory for dQ = dS K (the buffer of this item's parity: the
  // consumers' sync of the previous item ordered its last reads before these writes).
  const uint32_t ds_tile = smem_addr(sm + L::kDs + (it & 1) * L::kDsBytes);
  store_ds_t<kBwKB>(ds_tile, b, cw * 64 + warp * 16, lane);
  wg::fence_proxy_async();
  if constexpr (D == 128) tma::bar_sync<1>(2 * kThreads);  // both consumers' rows are in
  else if (cw == 0) tma::bar_sync<2>(kThreads);             // this consumer's rows are in
  else tma::bar_sync<3>(kThreads);
  float dq[32];
  dq_item_product<D>(dq, ds_tile, ks_all, cw);  // (waits for dK and dV too)
  tma::mbar_arrive(bars.empty(st));            // this thread is done with the stage
  // The product into shared memory for the writer, once it has read the previous item's.
  tma::mbar_wait(bars.dq_empty(cw), uint32_t((it & 1) ^ 1));
  store_dq_frags(smem_addr(sm + L::kDq) + uint32_t(cw * L::kDqHalf), dq, t);
  wg::fence_proxy_async();  // the stores, visible to the copy engine
  tma::mbar_arrive(bars.dq_full(cw));
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
  const BwBars bars{smem_addr(sm + L::kBars)};
  const KeyBlock blk = key_block<kBwKB>(p);
  if (blk.k0 >= blk.len) return;  // the whole block, before any barrier
  if (threadIdx.x == 0) init_bars(bars);
  __syncthreads();
  const int wgi = threadIdx.x >> 7;  // 0: producer and dQ writer, 1-2: consumers
  if (wgi == 0) {
    tma::regs_dec<24>();
    if (threadIdx.x == 0) produce_bwd<D>(sm, bars, maps, p, blk);
    else if (threadIdx.x == 32) write_dq<D>(sm, bars, p, blk);
    return;
  }

  tma::regs_inc<240>();
  const int cw = wgi - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int start = blk.start, len = blk.len, k0 = blk.k0;
  const int kw0 = k0 + cw * 64;  // the consumer warpgroup's first key
  float dk[D / 8][4], dv[D / 8][4];
  zero(dk);
  zero(dv);
  float(&dkf)[D / 2] = reinterpret_cast<float(&)[D / 2]>(dk);
  float(&dvf)[D / 2] = reinterpret_cast<float(&)[D / 2]>(dv);
  tma::mbar_wait(bars.kv(), 0);
  int it = 0;
  for (int gi = 0; gi < p.group; ++gi)
    for (int q0 = k0; q0 < len; q0 += kBwBQ, ++it)
      consume_item<D>(sm, bars, it, q0, min(kBwBQ, len - q0), kw0, p.scale_log2, dkf, dvf);
  store_rows<D>(p.dk + int64_t(start + k0) * p.lddk + blk.hk * D, p.lddk, cw * 64 + warp * 16,
                len - k0, dk, p.scale, p.scale, lane);
  store_rows<D>(p.dv + int64_t(start + k0) * p.lddv + blk.hk * D, p.lddv, cw * 64 + warp * 16,
                len - k0, dv, 1.f, 1.f, lane);
#else
  __trap();  // launched only on sm_90 devices, for which the build has sm_90a code
#endif
}

// Each 64-row tile's lse and delta rows in the accumulator's layout (0 past the sequence's
// end), for the producer's bulk copies: grid (64-row tiles, sequences, query heads), a warp per
// row (row_delta: delta as every backward sums it).
template <int D>
__global__ void __launch_bounds__(256) ws_stats_kernel(AttnArgs p) {
  const int q0 = blockIdx.x * kAccTileRows, seq = blockIdx.y, h = blockIdx.z;
  const int start = p.cu[seq], nq = min(kAccTileRows, p.cu[seq + 1] - start - q0);
  if (nq <= 0) return;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t row0 = dq_acc_row(p.acc_rows, h, seq, start, q0);
  for (int r = warp; r < kAccTileRows; r += 8) {
    const int64_t t = start + q0 + r;
    const float delta =
        r < nq ? row_delta<D>(p.out + t * p.ldo + h * D, p.dout + t * p.lddo + h * D, lane) : 0.f;
    if (lane == 0) {
      p.acc_delta[row0 + r] = delta;
      p.acc_lse[row0 + r] = r < nq ? p.lse[int64_t(h) * p.T + t] : 0.f;
    }
  }
}

template <int D>
void backward_ws_d(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh) {
  const dim3 stat_grid((sh.max_seqlen + kAccTileRows - 1) / kAccTileRows, sh.n_seqs, sh.n_heads);
  ws_stats_kernel<D><<<stat_grid, 256, 0, s>>>(a);
  CUDA_CHECK_LAUNCH();
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
