// The warp-specialised wgmma forward (sm_90a): FlashAttention-3's structure in our contract
// (attention.cuh). A producer warpgroup, of which one thread issues the copies, feeds 128-row
// Q and 128-key K / V tiles by TMA through an mbarrier ring; two consumer warpgroups (64 query
// rows each) only compute, with the registers the producer gave up (setmaxnreg). Within a
// consumer, S(j) = Q K(j)^T is issued before O += P(j-1) V(j-1), so the tensor cores run one
// product while the softmax waits for the other; between the consumers, turns to issue
// (ping-pong) put one's softmax under the other's products. Same arithmetic as
// attn_forward_wgmma_kernel (log2-domain online softmax, the scale folded into one FFMA per
// exponent), so the two agree to rounding. The forward wherever the wgmma kernels run, unless
// SF_ATTN_WS=0 (attention.cuh); its speed against cuDNN's forward: docs/BENCHMARKS.md.
#include <mutex>

#include "backend/cuda/attention_sm90.cuh"
#include "backend/cuda/attention_tiles.cuh"
#include "backend/cuda/tma.cuh"
#include "backend/cuda/wgmma.cuh"
#include "core/error.h"

namespace sf::cuda::attn {
namespace {

// Two stages: a third (225 KiB at D 128) measured no faster at D 128 and 2-7% slower at D 64.
constexpr int kWsBQ = 128, kWsBK = 128, kWsStages = 2, kWsThreads = 3 * kThreads;
// Registers per thread of the producer warpgroup and of each consumer. setmaxnreg moves
// registers within the block's own allocation (168 a thread at 384 threads): an increase that
// allocation cannot grant waits forever.
constexpr int kWsProducerRegs = 24, kWsConsumerRegs = 240;
static_assert(kWsProducerRegs + 2 * kWsConsumerRegs <= 3 * 168,
              "the register split must fit the block's allocation at __launch_bounds__(384, 1)");

// Shared memory: Q [128, D], then the ring's K and V tiles [128, D] each, every tile sw128
// (wgmma.cuh; TMA's 128B swizzle writes that layout, 64 columns a box); then the barriers.
template <int D>
struct WsSmem {
  static constexpr int kTileBytes = 128 * D * 2;
  static constexpr int kQ = 0, kK = kTileBytes, kV = kK + kWsStages * kTileBytes;
  static constexpr int kBars = kV + kWsStages * kTileBytes;
  static constexpr int kBytes = kBars + (1 + 4 * kWsStages) * 8;
  static_assert(kQ % 1024 == 0 && kK % 1024 == 0 && kV % 1024 == 0,
                "the 128B swizzle's atoms are 1024-byte aligned");
  static_assert(kBytes + 1024 <= 227 * 1024, "an sm_90 block has 227 KiB of shared memory");
};

#ifdef SF_WGMMA  // the helpers exist only where the kernel has a body
using tma::mbar_arrive, tma::mbar_expect_tx, tma::mbar_init, tma::mbar_wait;

// Named barriers over the two consumer warpgroups (ids 1, 2): sync waits for 256 arrivals,
// its own warpgroup's 128 and the other's arrive.
__device__ __forceinline__ void consumers_sync(int id) { tma::bar_sync(id, 256); }
__device__ __forceinline__ void consumers_arrive(int id) { tma::bar_arrive(id, 256); }

// Masks the keys after each row on the diagonal tile of a 64 x 128 score accumulator.
__device__ __forceinline__ void mask_diagonal(float (&s)[64], int key0, int row0, int t4) {
#pragma unroll
  for (int i = 0; i < 64; ++i)
    if (key0 + (i >> 2) * 8 + 2 * t4 + (i & 1) > row0 + ((i & 3) >> 1) * 8) s[i] = -INFINITY;
}

// S = Q K^T for one warpgroup's 64 rows against a 128-key tile (issued, not waited for).
template <int D>
__device__ __forceinline__ void issue_scores(float (&s)[64], uint32_t qs, uint32_t ks) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wg::mma_ss_n128(s, wg::desc_k<kWsBQ>(qs, kk), wg::desc_k<kWsBK>(ks, kk), kk > 0);
}

// O += P V over a 128-key tile, P in registers (issued, not waited for).
template <int D>
__device__ __forceinline__ void issue_pv(float (&of)[D / 2], const uint32_t (&a)[8][4],
                                         uint32_t vs) {
#pragma unroll
  for (int kb = 0; kb < kWsBK / 16; ++kb) {
    if constexpr (D == 128) wg::mma_rs_n128_tb(of, a[kb], wg::desc_mn<kWsBK>(vs, kb));
    else wg::mma_rs_n64_tb(of, a[kb], wg::desc_mn<kWsBK>(vs, kb));
  }
}

// The ring's barriers, one of each per stage. K and V are released apart: K once S = Q K^T is
// done, V once O += P V is, a step later; so each tile's copy can start a whole step before
// the consumers need it (one barrier for both left the next K waiting on the last P V).
struct Ring {
  uint64_t* full_k;   // the producer's copy has landed (transaction bytes)
  uint64_t* full_v;
  uint64_t* empty_k;  // both consumers are done reading (an arrival per thread)
  uint64_t* empty_v;
};

// One [128, D] tile of key tile t into its stage, once the stage's last reader released it.
template <int D>
__device__ __forceinline__ void produce_tile(unsigned char* dst, const CUtensorMap* map,
                                             uint64_t* full, uint64_t* empty, int col, int row,
                                             int t) {
  const int st = t % kWsStages;
  if (t >= kWsStages) mbar_wait(&empty[st], uint32_t((t / kWsStages - 1) & 1));
  mbar_expect_tx(&full[st], WsSmem<D>::kTileBytes);
  tma::load_tile<D, 128>(dst + st * WsSmem<D>::kTileBytes, map, col, row + t * kWsBK,
                         &full[st]);
}

// The producer thread: Q once, then the key tiles 0 .. nkb - 1 in the order the consumers
// take them: K(0), then K(j) with V(j - 1), then V(nkb - 1). Columns q_col / kv_col, rows
// from q_row (Q) and kv_row (key tile 0).
template <int D>
__device__ __forceinline__ void produce(unsigned char* sm, uint64_t* bar_q, const Ring& r,
                                        const CUtensorMap* tq, const CUtensorMap* tk,
                                        const CUtensorMap* tv, int q_col, int kv_col, int q_row,
                                        int kv_row, int nkb) {
  using L = WsSmem<D>;
  mbar_expect_tx(bar_q, L::kTileBytes);
  tma::load_tile<D, 128>(sm + L::kQ, tq, q_col, q_row, bar_q);
  for (int j = 0; j <= nkb; ++j) {
    if (j < nkb) produce_tile<D>(sm + L::kK, tk, r.full_k, r.empty_k, kv_col, kv_row, j);
    if (j > 0) produce_tile<D>(sm + L::kV, tv, r.full_v, r.empty_v, kv_col, kv_row, j - 1);
  }
}

#endif  // SF_WGMMA

template <int D>
__global__ void __launch_bounds__(kWsThreads, 1)
    attn_forward_ws_kernel(const __grid_constant__ CUtensorMap tq,
                           const __grid_constant__ CUtensorMap tk,
                           const __grid_constant__ CUtensorMap tv, AttnArgs p) {
#ifdef SF_WGMMA
  using L = WsSmem<D>;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* sm = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* bar_q = reinterpret_cast<uint64_t*>(sm + L::kBars);
  const Ring ring{bar_q + 1, bar_q + 1 + kWsStages, bar_q + 1 + 2 * kWsStages,
                  bar_q + 1 + 3 * kWsStages};
  const QueryBlock blk = query_block<kWsBQ>(p);
  const int start = blk.start, len = blk.len, h = blk.h, hk = blk.hk, q0 = blk.q0;
  if (q0 >= len) return;  // the whole block, before any barrier
  // Key tiles this block sees: up to the diagonal one, which starts at q0 (kWsBK == kWsBQ).
  const int nkb = q0 / kWsBK + 1;
  if (threadIdx.x == 0) {
    mbar_init(bar_q, 1);
    for (int st = 0; st < kWsStages; ++st) {
      mbar_init(&ring.full_k[st], 1);
      mbar_init(&ring.full_v[st], 1);
      mbar_init(&ring.empty_k[st], 2 * kThreads);  // every consumer thread, after its wait
      mbar_init(&ring.empty_v[st], 2 * kThreads);
    }
    tma::mbar_init_fence();
  }
  __syncthreads();
  const int wgi = threadIdx.x >> 7;  // 0: producer, 1-2: consumers

  if (wgi == 0) {
    tma::regs_dec<kWsProducerRegs>();
    if (threadIdx.x == 0)
      produce<D>(sm, bar_q, ring, &tq, &tk, &tv, h * D, hk * D, start + q0,
                 start, nkb);
    return;
  }

  tma::regs_inc<kWsConsumerRegs>();
  const int cw = wgi - 1;  // consumer warpgroup: rows q0 + 64 cw ..
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int row0 = q0 + cw * 64 + warp * 16 + g;  // accumulator rows g (and g + 8)
  const uint32_t qs = smem_addr(sm + L::kQ) + uint32_t(cw * 64 * 128);
  auto k_at = [&](int j) { return smem_addr(sm + L::kK + (j % kWsStages) * L::kTileBytes); };
  auto v_at = [&](int j) { return smem_addr(sm + L::kV + (j % kWsStages) * L::kTileBytes); };
  auto parity = [](int j) { return uint32_t((j / kWsStages) & 1); };
  // Each thread arrives on key tile t's stage once its own wait for the product reading it
  // returned (a wait covers the waiting thread's part of a wgmma, not its warpgroup's).
  auto release = [&](uint64_t* empty, int t) { mbar_arrive(&empty[t % kWsStages]); };

  float o[D / 8][4];
  zero(o);
  float(&of)[D / 2] = reinterpret_cast<float(&)[D / 2]>(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];
  float s[64];
  uint32_t a[8][4];
  auto rescale_o = [&] {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) of[i] *= alpha[(i & 3) >> 1];
  };

  // Ping-pong: the consumers take turns to issue their products (steps 0 .. nkb: S(0), then
  // S(j) with P(j-1) V(j-1), then the last P V), so one's softmax runs under the other's
  // tensor-core work rather than both softmaxes at once with the tensor cores idle. Consumer
  // c waits on barrier 1 + c and, after issuing, lets the other go; consumer 1 opens the first
  // turn for consumer 0 and skips its own last arrive, so every arrival is waited for.
  const int my_turn = 1 + cw, their_turn = 2 - cw;
  auto end_turn = [&](bool last) {
    if (!(last && cw == 1)) consumers_arrive(their_turn);
  };
  if (cw == 1) consumers_arrive(their_turn);

  mbar_wait(bar_q, 0);
  mbar_wait(&ring.full_k[0], parity(0));
  consumers_sync(my_turn);
  wg::fence();
  issue_scores<D>(s, qs, k_at(0));
  wg::commit();
  end_turn(false);
  wg::wait<0>();
  wg::pin(s);
  release(ring.empty_k, 0);
  if (nkb == 1) mask_diagonal(s, 0, row0, t4);
  online_softmax<16>(s, m, l, alpha, p.scale_log2);
  wg::acc_to_a<8>(a, s);
  for (int j = 1; j < nkb; ++j) {
    mbar_wait(&ring.full_k[j % kWsStages], parity(j));
    consumers_sync(my_turn);
    wg::pin(s);
    wg::pin(of);
    wg::fence();
    issue_scores<D>(s, qs, k_at(j));  // S(j) ...
    wg::commit();
    rescale_o();  // by alpha(j - 1), while S(j) runs: no product is writing O now
    mbar_wait(&ring.full_v[(j - 1) % kWsStages], parity(j - 1));
    wg::pin(of);
    wg::fence();
    issue_pv<D>(of, a, v_at(j - 1));  // ... and O += P(j-1) V(j-1) behind it
    wg::commit();
    end_turn(false);
    wg::wait<1>();  // S(j) done: K(j)'s stage may be refilled
    wg::pin(s);
    release(ring.empty_k, j);
    if (j == nkb - 1) mask_diagonal(s, j * kWsBK, row0, t4);
    online_softmax<16>(s, m, l, alpha, p.scale_log2);
    wg::wait<0>();  // P(j-1) V(j-1) done: V(j-1)'s stage may be refilled
    wg::pin(of);
    release(ring.empty_v, j - 1);
    wg::acc_to_a<8>(a, s);
  }
  mbar_wait(&ring.full_v[(nkb - 1) % kWsStages], parity(nkb - 1));
  consumers_sync(my_turn);
  rescale_o();
  wg::pin(of);
  wg::fence();
  issue_pv<D>(of, a, v_at(nkb - 1));
  wg::commit();
  end_turn(true);
  wg::wait<0>();
  wg::pin(of);
  release(ring.empty_v, nkb - 1);

  finish_forward_rows<D>(p, o, m, l, start, len, h, q0, row0, cw * 64 + warp * 16, lane);
#else
  __trap();  // launched only on sm_90 devices, for which the build has sm_90a code
#endif
}

template <int D>
void forward_ws_d(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh) {
  using L = WsSmem<D>;
  const size_t smem = size_t(L::kBytes) + 1024;  // + 1 KiB to align the tiles
  static std::once_flag once;
  std::call_once(once, [&] { set_smem(attn_forward_ws_kernel<D>, smem); });
  const CUtensorMap tq = tma::tile_map(a.q, a.T, int64_t(sh.n_heads) * D, a.ldq, kWsBQ);
  const CUtensorMap tk = tma::tile_map(a.k, a.T, int64_t(sh.n_kv_heads) * D, a.ldk, kWsBK);
  const CUtensorMap tv = tma::tile_map(a.v, a.T, int64_t(sh.n_kv_heads) * D, a.ldv, kWsBK);
  const dim3 grid((sh.max_seqlen + kWsBQ - 1) / kWsBQ, sh.n_seqs, sh.n_heads);
  attn_forward_ws_kernel<D><<<grid, kWsThreads, smem, s>>>(tq, tk, tv, a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void forward_sm90_ws(cudaStream_t s, const AttnArgs& a, const AttentionShape& sh) {
  if (sh.head_dim == 64) forward_ws_d<64>(s, a, sh);
  else forward_ws_d<128>(s, a, sh);
}

}  // namespace sf::cuda::attn
