// RMSNorm forward (optionally fused with the residual add) and backward (contracts in
// norm.cuh). A "group" is one D-wide slice of a row; TPG threads own a group (8 to 32 lanes
// of a warp for small D, up to 512 threads for hidden sizes), each thread a fixed set of
// VW-wide column chunks, so every element is read and written by the same thread: that is
// what makes the in-place aliasing (sum = a, dx = dout/x/dres) safe. Sums of squares and dot
// products are f32. These ops are memory-bound: the kernels that matter (small-group forward,
// register-resident backward) issue all of a row's loads before its reduction and keep the
// values packed in registers, so each multiprocessor has several rows' bytes in flight.
#include <algorithm>

#include "backend/cuda/common.cuh"
#include "backend/cuda/elementwise.cuh"
#include "backend/cuda/norm.cuh"

namespace sf::cuda {
namespace {

struct NormArgs {
  bf16* out;          // forward: out; backward: dx
  int64_t ld_out;
  bf16* sum;          // forward with add: the residual sum
  int64_t ld_sum;
  const bf16* a;      // forward: x or a; backward: dout
  int64_t ld_a;
  const bf16* b;      // forward: b; backward: x
  int64_t ld_b;
  const bf16* dres;   // backward: residual gradient (may be null)
  int64_t ld_dres;
  const bf16* w;      // [D]
  float* rstd;        // forward: out (may be null); backward: in
  float* dw_partial;  // backward: [gridDim.x, D] or null
  int64_t n_groups;   // T * G
  int G, D;
  float eps;
};

template <int TPG>
constexpr int block_threads() { return TPG < 256 ? 256 : TPG; }

// Above this much dynamic shared memory a kernel needs the opt-in attribute (48 KiB less the
// kernels' own static reduction buffer, with margin).
constexpr size_t kDefaultSmem = 46 * 1024;

// Sum over the TPG threads of one group; `red` holds block_threads/32 floats.
template <int TPG>
__device__ __forceinline__ float group_sum(float x, float* red) {
  if constexpr (TPG < 32) {  // a group is TPG aligned lanes of one warp
#pragma unroll
    for (int o = TPG / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
  } else if constexpr (TPG == 32) {
    return warp_sum(x);
  } else {
    x = warp_sum(x);
    constexpr int WPG = TPG / 32;  // warps per group
    const int warp = threadIdx.x >> 5;
    if ((threadIdx.x & 31) == 0) red[warp] = x;
    __syncthreads();
    const int first = (warp / WPG) * WPG;
    float t = 0.f;
#pragma unroll
    for (int i = 0; i < WPG; ++i) t += red[first + i];
    __syncthreads();
    return t;
  }
}

// VW bf16 values kept packed in registers (half the registers of floats) until used; what
// lets the register-resident kernels keep several rows' loads in flight per multiprocessor.
template <int VW>
struct Packed;
template <>
struct Packed<8> {
  uint4 u;
  __device__ __forceinline__ void load(const bf16* p) { u = *reinterpret_cast<const uint4*>(p); }
  __device__ __forceinline__ void zero() { u = make_uint4(0u, 0u, 0u, 0u); }
  // Element e (a constant once the caller's loop is unrolled); bf16 -> f32 is exact.
  __device__ __forceinline__ float operator[](int e) const {
    const uint32_t w = e < 2 ? u.x : (e < 4 ? u.y : (e < 6 ? u.z : u.w));
    return __uint_as_float((e & 1) ? (w & 0xffff0000u) : (w << 16));
  }
  // The same value through a byte permute: a second pass over the data unpacks with this, so
  // the compiler cannot merge it with the first pass's unpack and keep 8 floats alive instead
  // of 4 packed words between the passes.
  __device__ __forceinline__ float again(int e) const {
    const uint32_t w = e < 2 ? u.x : (e < 4 ? u.y : (e < 6 ? u.z : u.w));
    return __uint_as_float(__byte_perm(w, 0u, (e & 1) ? 0x3254u : 0x1054u));
  }
};
template <>
struct Packed<1> {
  bf16 h;
  __device__ __forceinline__ void load(const bf16* p) { h = *p; }
  __device__ __forceinline__ void zero() { h = __float2bfloat16_rn(0.f); }
  __device__ __forceinline__ float operator[](int) const { return __bfloat162float(h); }
  __device__ __forceinline__ float again(int) const { return __bfloat162float(h); }
};

// (row, first column) of group gi; 32-bit division when gi fits.
struct GroupPos {
  int64_t t, gcol;
};
__device__ __forceinline__ GroupPos group_pos(int64_t gi, int G, int D) {
  if (gi < (int64_t(1) << 31)) {
    const uint32_t t = uint32_t(gi) / uint32_t(G);
    return {int64_t(t), int64_t(uint32_t(gi) - t * uint32_t(G)) * D};
  }
  return {gi / G, (gi % G) * D};
}

// ---- kernels ------------------------------------------------------------------------------

// Forward for small groups (D <= TPG*VW, TPG <= 32: one chunk per thread, a group is TPG
// lanes of one warp, no block barrier), e.g. Qwen3's per-head q/k norm (D = 128). Each thread
// takes U groups per iteration and issues all U loads before the first reduction; x stays
// in registers for the output (one global read) and w is loaded once per thread.
template <int VW, int TPG, int U>
__global__ void __launch_bounds__(256) rmsnorm_forward_small_kernel(NormArgs p) {
  static_assert(TPG <= 32 && 256 % TPG == 0, "a group must fit one warp");
  constexpr int GPB = 256 / TPG;  // groups per block per u
  const int sg = threadIdx.x / TPG, c = (threadIdx.x % TPG) * VW;
  const bool lane_on = c < p.D;  // lanes past the group's width only join the reductions
  Packed<VW> w;
  if (lane_on) w.load(p.w + c);
  else w.zero();
  // The loop bound is uniform over the block: every lane runs every group_sum.
  for (int64_t b0 = int64_t(blockIdx.x) * GPB * U; b0 < p.n_groups;
       b0 += int64_t(gridDim.x) * GPB * U) {
    const int64_t base = b0 + sg;
    Packed<VW> x[U];
    float ss[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t gi = base + u * GPB;
      if (lane_on && gi < p.n_groups) {
        const GroupPos g = group_pos(gi, p.G, p.D);
        x[u].load(p.a + g.t * p.ld_a + g.gcol + c);
      } else {
        x[u].zero();
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      ss[u] = 0.f;
#pragma unroll
      for (int k = 0; k < VW; ++k) ss[u] += x[u][k] * x[u][k];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) ss[u] = group_sum<TPG>(ss[u], nullptr);  // every lane joins
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t gi = base + u * GPB;
      if (gi >= p.n_groups) continue;
      const float r = 1.f / sqrtf(ss[u] / float(p.D) + p.eps);
      if (lane_on) {
        const GroupPos g = group_pos(gi, p.G, p.D);
        float v[VW];
#pragma unroll
        for (int k = 0; k < VW; ++k) v[k] = w[k] * (x[u][k] * r);
        storev<VW>(p.out + g.t * p.ld_out + g.gcol + c, v);
      }
      if (c == 0 && p.rstd) p.rstd[gi] = r;
    }
  }
}

template <int VW, int TPG, bool ADD>
__global__ void __launch_bounds__(block_threads<TPG>())
    rmsnorm_forward_kernel(NormArgs p) {
  constexpr int BS = block_threads<TPG>(), GPB = BS / TPG;
  __shared__ float red[BS / 32];
  const int sg = threadIdx.x / TPG, li = threadIdx.x % TPG;
  // Every thread of the block runs the same number of iterations (group_sum syncs the block).
  for (int64_t base = int64_t(blockIdx.x) * GPB; base < p.n_groups;
       base += int64_t(gridDim.x) * GPB) {
    const int64_t gi = base + sg;
    const bool active = gi < p.n_groups;
    const int64_t t = active ? gi / p.G : 0, gcol = active ? (gi % p.G) * p.D : 0;
    const bf16* xa = p.a + t * p.ld_a + gcol;
    const bf16* xb = ADD ? p.b + t * p.ld_b + gcol : nullptr;
    bf16* xs = ADD ? p.sum + t * p.ld_sum + gcol : nullptr;
    float ss = 0.f;
    if (active)
      for (int c = li * VW; c < p.D; c += TPG * VW) {
        float v[VW];
        loadv<VW>(xa + c, v);
        if constexpr (ADD) {
          float u[VW];
          loadv<VW>(xb + c, u);
#pragma unroll
          for (int k = 0; k < VW; ++k) v[k] = __bfloat162float(__float2bfloat16_rn(v[k] + u[k]));
          storev<VW>(xs + c, v);
        }
#pragma unroll
        for (int k = 0; k < VW; ++k) ss += v[k] * v[k];
      }
    ss = group_sum<TPG>(ss, red);
    if (!active) continue;
    const float r = 1.f / sqrtf(ss / float(p.D) + p.eps);
    const bf16* x = ADD ? xs : xa;
    bf16* o = p.out + t * p.ld_out + gcol;
    for (int c = li * VW; c < p.D; c += TPG * VW) {
      float v[VW], w[VW];
      loadv<VW>(x + c, v);
      loadv<VW>(p.w + c, w);
#pragma unroll
      for (int k = 0; k < VW; ++k) v[k] = w[k] * (v[k] * r);
      storev<VW>(o + c, v);
    }
    if (li == 0 && p.rstd) p.rstd[gi] = r;
  }
}

// Backward: dx = r * (w*dout - xhat * mean(dout*w*xhat)) (+ dres), xhat = x*r.
// dw partials of this block's groups accumulate in shared memory (GPB rows of D floats, each
// element owned by one thread), then the block writes its [D] partial row.
template <int VW, int TPG>
__global__ void __launch_bounds__(block_threads<TPG>())
    rmsnorm_backward_kernel(NormArgs p) {
  constexpr int BS = block_threads<TPG>(), GPB = BS / TPG;
  __shared__ float red[BS / 32];
  extern __shared__ float acc[];  // [GPB][D] when dw_partial
  const int sg = threadIdx.x / TPG, li = threadIdx.x % TPG;
  const bool want_dw = p.dw_partial != nullptr;
  if (want_dw) {
    for (int i = threadIdx.x; i < GPB * p.D; i += BS) acc[i] = 0.f;
    __syncthreads();
  }
  float* my_acc = acc + sg * p.D;
  for (int64_t base = int64_t(blockIdx.x) * GPB; base < p.n_groups;
       base += int64_t(gridDim.x) * GPB) {
    const int64_t gi = base + sg;
    const bool active = gi < p.n_groups;
    const int64_t t = active ? gi / p.G : 0, gcol = active ? (gi % p.G) * p.D : 0;
    const bf16* dout = p.a + t * p.ld_a + gcol;
    const bf16* x = p.b + t * p.ld_b + gcol;
    const float r = active ? p.rstd[gi] : 0.f;
    float s = 0.f;
    if (active)
      for (int c = li * VW; c < p.D; c += TPG * VW) {
        float d[VW], xv[VW], w[VW];
        loadv<VW>(dout + c, d);
        loadv<VW>(x + c, xv);
        loadv<VW>(p.w + c, w);
#pragma unroll
        for (int k = 0; k < VW; ++k) s += d[k] * w[k] * (xv[k] * r);
      }
    s = group_sum<TPG>(s, red);
    if (!active) continue;
    const float mean = s / float(p.D);
    bf16* dx = p.out + t * p.ld_out + gcol;
    const bf16* dres = p.dres ? p.dres + t * p.ld_dres + gcol : nullptr;
    for (int c = li * VW; c < p.D; c += TPG * VW) {
      float d[VW], xv[VW], w[VW], rr[VW];
      loadv<VW>(dout + c, d);
      loadv<VW>(x + c, xv);
      loadv<VW>(p.w + c, w);
      if (dres) loadv<VW>(dres + c, rr);
#pragma unroll
      for (int k = 0; k < VW; ++k) {
        const float xhat = xv[k] * r;
        if (want_dw) my_acc[c + k] += d[k] * xhat;
        float v = r * (w[k] * d[k] - xhat * mean);
        if (dres) v += rr[k];
        xv[k] = v;
      }
      storev<VW>(dx + c, xv);
    }
  }
  if (!want_dw) return;
  __syncthreads();
  for (int c = threadIdx.x; c < p.D; c += BS) {
    float v = 0.f;
#pragma unroll
    for (int g = 0; g < GPB; ++g) v += acc[g * p.D + c];
    p.dw_partial[int64_t(blockIdx.x) * p.D + c] = v;
  }
}

// The same backward with each thread's CPT chunks (columns (li + k*TPG)*VW) kept in registers
// between the passes: one global read of dout, x and dres. They stay packed bf16 until used and
// the thread's dw partial (summed over all of the block's groups) lives in shared memory, laid
// out [k*VW + e][thread] so a warp's accesses are conflict-free: fewer registers per row, so a
// multiprocessor holds more rows' loads in flight. For D <= 2*TPG*VW.
template <int VW, int TPG, int CPT>
__global__ void __launch_bounds__(block_threads<TPG>())
    rmsnorm_backward_cached_kernel(NormArgs p) {
  constexpr int BS = block_threads<TPG>(), GPB = BS / TPG;
  __shared__ float red[BS / 32];
  // acc: [CPT*VW][BS] f32 when dw_partial; then w as [CPT*TPG*VW] bf16, zero past D (read
  // per row from shared memory rather than held in registers across rows).
  extern __shared__ float acc[];
  const int sg = threadIdx.x / TPG, li = threadIdx.x % TPG;
  const bool want_dw = p.dw_partial != nullptr;
  const bool has_dres = p.dres != nullptr;
  bf16* w_s = reinterpret_cast<bf16*>(acc + (want_dw ? CPT * VW * BS : 0));
  if (want_dw)
#pragma unroll
    for (int j = 0; j < CPT * VW; ++j) acc[j * BS + threadIdx.x] = 0.f;  // own slots only
  for (int i = threadIdx.x; i < CPT * TPG * VW; i += BS)
    w_s[i] = i < p.D ? p.w[i] : __float2bfloat16_rn(0.f);
  __syncthreads();
  for (int64_t base = int64_t(blockIdx.x) * GPB; base < p.n_groups;
       base += int64_t(gridDim.x) * GPB) {
    const int64_t gi = base + sg;
    const bool active = gi < p.n_groups;
    const GroupPos g = active ? group_pos(gi, p.G, p.D) : GroupPos{0, 0};
    const bf16* dout = p.a + g.t * p.ld_a + g.gcol;
    const bf16* x = p.b + g.t * p.ld_b + g.gcol;
    const bf16* dres = has_dres ? p.dres + g.t * p.ld_dres + g.gcol : nullptr;
    const float r = active ? p.rstd[gi] : 0.f;
    Packed<VW> d[CPT], xv[CPT], rr[CPT], wv[CPT];
    // All loads (dres too) issued before any use: one latency per row, not two.
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
      const int c = (li + k * TPG) * VW;
      wv[k].load(w_s + c);
      if (active && c < p.D) {
        d[k].load(dout + c);
        xv[k].load(x + c);
        if (has_dres) rr[k].load(dres + c);
        else rr[k].zero();
      } else {
        d[k].zero();
        xv[k].zero();
        rr[k].zero();
      }
    }
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < CPT; ++k)
#pragma unroll
      for (int e = 0; e < VW; ++e) s += d[k][e] * wv[k][e] * (xv[k][e] * r);
    s = group_sum<TPG>(s, red);
    if (!active) continue;
    const float mean = s / float(p.D);
    bf16* dx = p.out + g.t * p.ld_out + g.gcol;
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
      const int c = (li + k * TPG) * VW;
      if (c >= p.D) continue;
      float o[VW];
#pragma unroll
      for (int e = 0; e < VW; ++e) {
        const float xhat = xv[k].again(e) * r, de = d[k].again(e);
        if (want_dw) acc[(k * VW + e) * BS + threadIdx.x] += de * xhat;
        float v = r * (wv[k].again(e) * de - xhat * mean);
        if (has_dres) v += rr[k][e];
        o[e] = v;
      }
      storev<VW>(dx + c, o);
    }
  }
  if (!want_dw) return;
  __syncthreads();
  // Column c is slot (k*VW + e) of lane li = (c/VW) % TPG in every sub-group: add them in order.
  for (int c = threadIdx.x; c < p.D; c += BS) {
    const int chunk = c / VW, e = c % VW, k = chunk / TPG, l = chunk % TPG;
    float v = 0.f;
#pragma unroll
    for (int g = 0; g < GPB; ++g) v += acc[(k * VW + e) * BS + g * TPG + l];
    p.dw_partial[int64_t(blockIdx.x) * p.D + c] = v;
  }
}

// ---- host helpers ---------------------------------------------------------------------------

// Threads per group: about one to four chunks per thread (small groups, e.g. per-head
// norms of D = 128, take a quarter or half warp each instead of idling half a warp).
int pick_tpg(int64_t chunks) {
  if (chunks <= 8) return 8;
  if (chunks <= 16) return 16;
  return chunks <= 64 ? 32 : (chunks <= 512 ? 128 : 512);
}

template <class F>
void dispatch_tpg(int tpg, bool vec, F&& f) {
  auto with_vw = [&](auto vw) {
    if (tpg == 8) f(vw, std::integral_constant<int, 8>{});
    else if (tpg == 16) f(vw, std::integral_constant<int, 16>{});
    else if (tpg == 32) f(vw, std::integral_constant<int, 32>{});
    else if (tpg == 128) f(vw, std::integral_constant<int, 128>{});
    else f(vw, std::integral_constant<int, 512>{});
  };
  if (vec) with_vw(std::integral_constant<int, 8>{});
  else with_vw(std::integral_constant<int, 1>{});
}

// f(VW, TPG, CPT) as integral constants, TPG in 8..512 (powers of two), CPT in {1, 2}.
template <class F>
void dispatch_cached(int tpg, int cpt, bool vec, F&& f) {
  auto with_cpt = [&](auto vw, auto tp) {
    if (cpt == 1) f(vw, tp, std::integral_constant<int, 1>{});
    else f(vw, tp, std::integral_constant<int, 2>{});
  };
  auto with_tpg = [&](auto vw) {
    switch (tpg) {
      case 8: with_cpt(vw, std::integral_constant<int, 8>{}); break;
      case 16: with_cpt(vw, std::integral_constant<int, 16>{}); break;
      case 32: with_cpt(vw, std::integral_constant<int, 32>{}); break;
      case 64: with_cpt(vw, std::integral_constant<int, 64>{}); break;
      case 128: with_cpt(vw, std::integral_constant<int, 128>{}); break;
      case 256: with_cpt(vw, std::integral_constant<int, 256>{}); break;
      default: with_cpt(vw, std::integral_constant<int, 512>{}); break;
    }
  };
  if (vec) with_tpg(std::integral_constant<int, 8>{});
  else with_tpg(std::integral_constant<int, 1>{});
}

// Blocks of `kernel` that fit on the device at once: the grid of a grid-stride kernel whose
// blocks all do the same amount of work (a second partial wave would double the time).
template <class K>
int64_t resident_blocks(K kernel, int threads, size_t smem) {
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  return int64_t(std::max(per_sm, 1)) * sm_count();
}

int64_t norm_groups(const Mat& x, const Mat& w, const char* op) {
  SF_CHECK(w.dtype == DType::bf16 && w.rows == 1 && w.cols > 0 && x.cols % w.cols == 0, "cuda ",
           op, ": weight is ", dtype_name(w.dtype), " [", w.rows, ", ", w.cols, "], x is [",
           x.rows, ", ", x.cols, "]; need a bf16 [1, D] weight with x.cols a multiple of D");
  SF_REQUIRE(w.cols <= (1 << 20), "cuda ", op, ": norm width ", w.cols, " is too large");
  return x.cols / w.cols;
}

void forward_common(cudaStream_t s, Mat sum, Mat out, float* rstd, Mat a, Mat b, Mat w,
                    float eps, bool add, const char* op) {
  check_mat(a, DType::bf16, -1, -1, op, add ? "a" : "x");
  check_mat(out, DType::bf16, a.rows, a.cols, op, "out");
  if (add) {
    check_mat(b, DType::bf16, a.rows, a.cols, op, "b");
    check_mat(sum, DType::bf16, a.rows, a.cols, op, "sum");
  }
  const int64_t G = norm_groups(a, w, op), D = w.cols;
  if (a.rows == 0) return;
  NormArgs p{};
  p.out = out.as<bf16>();
  p.ld_out = out.ld;
  p.a = a.as<const bf16>();
  p.ld_a = a.ld;
  if (add) {
    p.b = b.as<const bf16>();
    p.ld_b = b.ld;
    p.sum = sum.as<bf16>();
    p.ld_sum = sum.ld;
  }
  p.w = w.as<const bf16>();
  p.rstd = rstd;
  p.n_groups = a.rows * G;
  p.G = int(G);
  p.D = int(D);
  p.eps = eps;
  const bool vec = D % 8 == 0 && vec8_ok(a) && vec8_ok(out) && vec8_ok(w) &&
                   (!add || (vec8_ok(b) && vec8_ok(sum)));
  const int64_t chunks = vec ? D / 8 : D;
  if (!add && chunks <= 32) {  // small groups (per-head norms): one chunk per thread
    const int tpg = chunks <= 8 ? 8 : (chunks <= 16 ? 16 : 32);
    dispatch_tpg(tpg, vec, [&](auto vw, auto tp) {
      constexpr int VW = decltype(vw)::value, TPG = decltype(tp)::value, U = 4;
      if constexpr (TPG <= 32) {
        constexpr int per_block = 256 / TPG * U;  // groups per block per iteration
        auto* kern = rmsnorm_forward_small_kernel<VW, TPG, U>;
        const int64_t blocks = std::min<int64_t>((p.n_groups + per_block - 1) / per_block,
                                                 resident_blocks(kern, 256, 0));
        kern<<<unsigned(blocks), 256, 0, s>>>(p);
        CUDA_CHECK_LAUNCH();
      }
    });
    return;
  }
  const int tpg = pick_tpg(chunks);
  dispatch_tpg(tpg, vec, [&](auto vw, auto tp) {
    constexpr int VW = decltype(vw)::value, TPG = decltype(tp)::value;
    constexpr int BS = block_threads<TPG>(), GPB = BS / TPG;
    const unsigned grid = grid_for((p.n_groups + GPB - 1) / GPB, 1);
    if (add)
      rmsnorm_forward_kernel<VW, TPG, true><<<grid, BS, 0, s>>>(p);
    else
      rmsnorm_forward_kernel<VW, TPG, false><<<grid, BS, 0, s>>>(p);
    CUDA_CHECK_LAUNCH();
  });
}

}  // namespace

// ---- launchers ------------------------------------------------------------------------------

void launch_rmsnorm_forward(cudaStream_t s, Mat out, float* rstd, Mat x, Mat w, float eps) {
  NVTX_RANGE("rmsnorm_forward");
  forward_common(s, Mat(), out, rstd, x, Mat(), w, eps, false, "rmsnorm_forward");
}

void launch_add_rmsnorm_forward(cudaStream_t s, Mat sum, Mat out, float* rstd, Mat a, Mat b,
                                Mat w, float eps) {
  NVTX_RANGE("add_rmsnorm_forward");
  forward_common(s, sum, out, rstd, a, b, w, eps, true, "add_rmsnorm_forward");
}

void launch_rmsnorm_backward(cudaStream_t s, Mat dx, Mat dw, Mat dout, Mat x, Mat w,
                             const float* rstd, Mat dres, const Workspace& ws) {
  NVTX_RANGE("rmsnorm_backward");
  const char* op = "rmsnorm_backward";
  check_mat(x, DType::bf16, -1, -1, op, "x");
  check_mat(dx, DType::bf16, x.rows, x.cols, op, "dx");
  check_mat(dout, DType::bf16, x.rows, x.cols, op, "dout");
  const bool has_dres = !dres.empty();
  if (has_dres) check_mat(dres, DType::bf16, x.rows, x.cols, op, "dres");
  const int64_t G = norm_groups(x, w, op), D = w.cols;
  const bool want_dw = !dw.empty();
  if (want_dw) check_mat(dw, DType::f32, 1, D, op, "dw");
  SF_CHECK(rstd != nullptr || x.rows == 0, "cuda rmsnorm_backward: rstd is null");
  if (x.rows == 0) return;
  NormArgs p{};
  p.out = dx.as<bf16>();
  p.ld_out = dx.ld;
  p.a = dout.as<const bf16>();
  p.ld_a = dout.ld;
  p.b = x.as<const bf16>();
  p.ld_b = x.ld;
  if (has_dres) {
    p.dres = dres.as<const bf16>();
    p.ld_dres = dres.ld;
  }
  p.w = w.as<const bf16>();
  p.rstd = const_cast<float*>(rstd);
  p.n_groups = x.rows * G;
  p.G = int(G);
  p.D = int(D);
  const bool vec = D % 8 == 0 && vec8_ok(x) && vec8_ok(dx) && vec8_ok(dout) && vec8_ok(w) &&
                   (!has_dres || vec8_ok(dres));
  const int64_t chunks = vec ? D / 8 : D;
  if (chunks <= 2 * 512) {
    // Registers hold each thread's chunks: the smallest TPG with at most two chunks a thread
    // (D = 4096: 256 threads x 2 chunks measured faster than 512 x 1 on an H200).
    int tpg = 8;
    while (tpg < 512 && 2 * tpg < chunks) tpg *= 2;
    const int cpt = chunks <= tpg ? 1 : 2;
    dispatch_cached(tpg, cpt, vec, [&](auto vw, auto tp, auto cp) {
      constexpr int VW = decltype(vw)::value, TPG = decltype(tp)::value,
                    CPT = decltype(cp)::value;
      constexpr int BS = block_threads<TPG>(), GPB = BS / TPG;
      auto* kern = rmsnorm_backward_cached_kernel<VW, TPG, CPT>;
      size_t smem = sizeof(bf16) * size_t(CPT * TPG * VW);  // w, then the dw slots
      if (want_dw) smem += sizeof(float) * size_t(CPT * VW) * size_t(BS);
      if (smem > kDefaultSmem)
        CUDA_CHECK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        int(smem)));
      // One wave of resident blocks: every block loops over the same number of rows, and
      // each block is one [D] dw partial row for the finishing pass to read.
      int64_t blocks = (p.n_groups + GPB - 1) / GPB;
      blocks = std::min<int64_t>(blocks, resident_blocks(kern, BS, smem));
      if (want_dw) {
        blocks = std::min<int64_t>(blocks, int64_t(ws.reduce_bytes / (sizeof(float) * D)));
        SF_REQUIRE(blocks >= 1, "cuda rmsnorm_backward: norm width ", D,
                   " exceeds the reduction workspace");
        p.dw_partial = static_cast<float*>(ws.reduce);
      }
      kern<<<unsigned(blocks), BS, smem, s>>>(p);
      CUDA_CHECK_LAUNCH();
      if (want_dw) launch_colsum_finish(s, dw.as<float>(), p.dw_partial, int(blocks), D);
    });
    return;
  }
  const int tpg = pick_tpg(chunks);
  dispatch_tpg(tpg, vec, [&](auto vw, auto tp) {
    constexpr int VW = decltype(vw)::value, TPG = decltype(tp)::value;
    constexpr int BS = block_threads<TPG>(), GPB = BS / TPG;
    int64_t blocks = (p.n_groups + GPB - 1) / GPB;
    blocks = std::min<int64_t>(blocks, 8 * sm_count());  // enough warps to cover latency
    size_t smem = 0;
    if (want_dw) {
      // One partial row of D floats per block in the workspace.
      blocks = std::min<int64_t>(blocks, int64_t(ws.reduce_bytes / (sizeof(float) * D)));
      SF_REQUIRE(blocks >= 1, "cuda rmsnorm_backward: norm width ", D,
                 " exceeds the reduction workspace");
      p.dw_partial = static_cast<float*>(ws.reduce);
      smem = sizeof(float) * size_t(GPB) * size_t(D);
      if (smem > kDefaultSmem)
        CUDA_CHECK(cudaFuncSetAttribute(rmsnorm_backward_kernel<VW, TPG>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    }
    rmsnorm_backward_kernel<VW, TPG><<<unsigned(blocks), BS, smem, s>>>(p);
    CUDA_CHECK_LAUNCH();
    if (want_dw) launch_colsum_finish(s, dw.as<float>(), p.dw_partial, int(blocks), D);
  });
}

}  // namespace sf::cuda
