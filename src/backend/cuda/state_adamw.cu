// The compact-state AdamW kernel (contract in state_adamw.cuh).
//
// Work unit: a "state block" of at most 256 elements of one range piece: an int8 block
// (optim/state_format.h's grid), or 256 consecutive elements of an f32 / bf16 piece. One
// thread per element, one CUDA block of 256 threads per state block (grid-stride over the
// launch's state blocks), so an int8 block's absmax is one block-wide max reduction (max is
// exact and order-free: any reduction tree gives the host's value). The int8 maps live in
// constant memory, copied from optim's host tables; each CUDA block stages them in shared
// memory once, since the midpoint search reads them at per-thread (divergent) indices.
#include "backend/cuda/state_adamw.cuh"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "backend/cuda/common.cuh"
#include "backend/cuda/cuda_check.h"
#include "optim/adamw.h"
#include "optim/state_adamw.h"

namespace sf::cuda {

namespace {

constexpr int kThreads = 256;  // == kStateBlock: thread t handles element t of a state block
static_assert(kThreads == kStateBlock);
constexpr int kMaxPieces = 32;  // per launch; more pieces take several launches

// The maps: [0] m map, [1] m midpoints, [2] v map, [3] v midpoints.
__constant__ float c_tables[4][256];

enum : int32_t { kMomF32 = 0, kMomBf16 = 1, kMomInt8 = 2 };

struct PieceArgs {
  int64_t begin, end;             // unit indices, inside one range
  int64_t offset, numel, row;     // that range
  int64_t moment_offset;          // bytes into m (and v)
  int64_t scale_offset;           // int8: the range's first scale
  int64_t first;                  // the piece's first state block in the launch
  int32_t moments;                // kMom*
  int32_t decay;                  // 0 or 1: which constants
};

struct LaunchArgs {
  PieceArgs p[kMaxPieces];
  int32_t n_pieces;
  int32_t master_bf16;
  int64_t n_blocks;  // state blocks in the launch
  int64_t off;       // the window's first unit index (grad and out are window-relative)
  AdamWConstants c[2];
  uint32_t round_key;
  void* master;
  char* m;
  char* v;
  float* m_scale;
  float* v_scale;
  const float* grad;
  uint16_t* out;
};

// ---- per-element arithmetic: the host scalar kernel's operations, correctly rounded ------

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) {
  return __uint_as_float(uint32_t(h) << 16);
}
// core/dtype.h's f32_to_bf16 (quiet NaN, else round to nearest even), bit for bit.
__device__ __forceinline__ uint16_t f32_to_bf16_rne(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
// state_format.h's stochastic_round_noise and stochastic_round_bf16.
__device__ __forceinline__ uint16_t f32_to_bf16_stochastic(float f, uint32_t key,
                                                           uint32_t index) {
  uint32_t h = (index * 0x9e3779b9u) ^ key;
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  const uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  return uint16_t((u + (h >> 16)) >> 16);
}

__device__ __forceinline__ void update1(float graw, float& p, float& m, float& v,
                                        const AdamWConstants& c) {
  const float g = __fmul_rn(graw, c.grad_scale);
  m = __fadd_rn(__fmul_rn(c.beta1, m), __fmul_rn(c.one_minus_beta1, g));
  v = __fadd_rn(__fmul_rn(c.beta2, v), __fmul_rn(__fmul_rn(c.one_minus_beta2, g), g));
  const float pd = __fmul_rn(p, c.decay);
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.bc2_sqrt), c.eps);
  p = __fsub_rn(pd, __fdiv_rn(__fmul_rn(c.step_size, m), denom));
}

// The count of midpoints strictly below y (state_kernels_scalar.cpp's int8_code).
__device__ __forceinline__ int int8_code(float y, const float* mid) {
  int c = 0;
#pragma unroll
  for (int b = 128; b >= 1; b >>= 1) c += y > mid[c + b - 1] ? b : 0;
  return c;
}

// ---- block geometry (state_adamw.cpp's for_each_block, indexed) ---------------------------

struct Block {
  int64_t begin, end, scale;  // unit indices; scale index (int8)
};

__device__ __forceinline__ Block block_of(const PieceArgs& P, int64_t j) {
  Block b{0, 0, 0};
  if (P.moments != kMomInt8) {
    b.begin = P.begin + j * kThreads;
    b.end = min(P.end, b.begin + kThreads);
  } else if (P.row == 0) {
    const int64_t g = P.begin / kThreads + j;  // the unit's absolute grid
    b.begin = max(P.begin, g * kThreads);
    b.end = min(P.end, (g + 1) * kThreads);
    b.scale = P.scale_offset + g - P.offset / kThreads;
  } else {
    const int64_t bpr = (P.row + kThreads - 1) / kThreads, rel = P.begin - P.offset;
    const int64_t rb = rel / P.row * bpr + rel % P.row / kThreads + j;  // block in the range
    const int64_t row_start = P.offset + rb / bpr * P.row;
    b.begin = row_start + rb % bpr * kThreads;
    b.end = min(b.begin + kThreads, row_start + P.row);
    b.scale = P.scale_offset + rb;
  }
  return b;
}

// Max over the CUDA block of x (>= 0, not NaN).
__device__ __forceinline__ float block_absmax(float x, float* red) {
#pragma unroll
  for (int o = 16; o >= 1; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
  __syncthreads();
  float r = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) r = fmaxf(r, red[w]);
  __syncthreads();  // red is reused by the next reduction
  return r;
}

__device__ __forceinline__ float load_moment(const char* base, int32_t fmt, int64_t k,
                                             const float* map, float scale) {
  if (fmt == kMomF32) return reinterpret_cast<const float*>(base)[k];
  if (fmt == kMomBf16) return bf16_bits_to_f32(reinterpret_cast<const uint16_t*>(base)[k]);
  return __fmul_rn(map[reinterpret_cast<const uint8_t*>(base)[k]], scale);
}

__device__ __forceinline__ void store_moment(char* base, int32_t fmt, int64_t k, float x) {
  if (fmt == kMomF32) reinterpret_cast<float*>(base)[k] = x;
  if (fmt == kMomBf16) reinterpret_cast<uint16_t*>(base)[k] = f32_to_bf16_rne(x);
}

// Encodes this thread's x into the int8 block at codes (+ k) and its scale (thread 0).
__device__ __forceinline__ void encode_int8(float x, bool active, char* codes, int64_t k,
                                            float* scale, const float* mid, float* red) {
  // NaN enters as 0: the host's `|x| > a ? |x| : a` never picks it.
  const float ax = fabsf(x);
  const float a = block_absmax(active && ax > 0.0f ? ax : 0.0f, red);
  const float d = a > 0.0f ? a : 1.0f;
  if (active) reinterpret_cast<uint8_t*>(codes)[k] = uint8_t(int8_code(__fdiv_rn(x, d), mid));
  if (threadIdx.x == 0) *scale = a;
}

__global__ void __launch_bounds__(kThreads) state_adamw_kernel(const LaunchArgs a) {
  __shared__ float tab[4][256];
  __shared__ float red[kThreads / 32];
  for (int i = threadIdx.x; i < 4 * 256; i += kThreads) tab[i / 256][i % 256] = c_tables[i / 256][i % 256];
  __syncthreads();
  for (int64_t blk = blockIdx.x; blk < a.n_blocks; blk += gridDim.x) {
    int k = 0;  // the piece holding state block blk (uniform across the CUDA block)
    while (k + 1 < a.n_pieces && a.p[k + 1].first <= blk) ++k;
    const PieceArgs& P = a.p[k];
    const Block b = block_of(P, blk - P.first);
    const int64_t i = b.begin + threadIdx.x, e = i - P.offset;  // unit / range index
    const bool active = i < b.end;
    const bool q = P.moments == kMomInt8;
    const char* mbase = a.m + P.moment_offset;
    const char* vbase = a.v + P.moment_offset;
    float m = 0.0f, v = 0.0f;
    if (active) {
      const float ms = q ? a.m_scale[b.scale] : 0.0f, vs = q ? a.v_scale[b.scale] : 0.0f;
      float p = a.master_bf16 ? bf16_bits_to_f32(static_cast<const uint16_t*>(a.master)[i])
                              : static_cast<const float*>(a.master)[i];
      m = load_moment(mbase, P.moments, e, tab[0], ms);
      v = load_moment(vbase, P.moments, e, tab[2], vs);
      update1(a.grad[i - a.off], p, m, v, a.c[P.decay]);
      uint16_t bits;
      if (a.master_bf16) {
        bits = f32_to_bf16_stochastic(p, a.round_key, uint32_t(i));
        static_cast<uint16_t*>(a.master)[i] = bits;
      } else {
        static_cast<float*>(a.master)[i] = p;
        bits = f32_to_bf16_rne(p);
      }
      if (a.out) a.out[i - a.off] = bits;
      if (!q) {
        store_moment(a.m + P.moment_offset, P.moments, e, m);
        store_moment(a.v + P.moment_offset, P.moments, e, v);
      }
    }
    if (q) {  // uniform per CUDA block: every thread reaches the reductions
      encode_int8(m, active, a.m + P.moment_offset, e, a.m_scale + b.scale, tab[1], red);
      encode_int8(v, active, a.v + P.moment_offset, e, a.v_scale + b.scale, tab[3], red);
    }
  }
}

// ---- host side -----------------------------------------------------------------------------

// The maps into this device's constant memory, once per device.
void upload_tables() {
  static std::mutex mu;
  static bool done[64] = {};
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  SF_CHECK(dev < 64, "cuda adamw_state: device ", dev, " beyond the 64 the table cache holds");
  std::lock_guard<std::mutex> lock(mu);
  if (done[dev]) return;
  float t[4][256];
  std::memcpy(t[0], int8_map(false), sizeof t[0]);
  std::memcpy(t[1], int8_midpoints(false), sizeof t[1]);
  std::memcpy(t[2], int8_map(true), sizeof t[2]);
  std::memcpy(t[3], int8_midpoints(true), sizeof t[3]);
  CUDA_CHECK(cudaMemcpyToSymbol(c_tables, t, sizeof t));
  done[dev] = true;
}

// State blocks of a piece (the count block_of indexes).
int64_t piece_blocks(const StatePiece& p) {
  const RangeStateLayout& r = *p.range;
  if (r.moments != MomentFormat::int8) return (p.end - p.begin + kThreads - 1) / kThreads;
  if (r.row == 0) return (p.end - 1) / kThreads - p.begin / kThreads + 1;
  const int64_t bpr = (r.row + kThreads - 1) / kThreads;
  auto block_index = [&](int64_t x) {  // range block starting at (or, for the end, ending at) x
    const int64_t rel = x - r.offset;
    return rel / r.row * bpr + (rel % r.row + kThreads - 1) / kThreads;
  };
  return block_index(p.end) - block_index(p.begin);
}

int32_t moment_code(MomentFormat f) {
  return f == MomentFormat::f32 ? kMomF32 : f == MomentFormat::bf16 ? kMomBf16 : kMomInt8;
}

}  // namespace

void launch_adamw_state(cudaStream_t s, const UnitStateView& state, int64_t off, int64_t len,
                        const float* grad, uint16_t* weights_out,
                        std::span<const ParamRange> ranges, const AdamWStep& step) {
  NVTX_RANGE("adamw_state");
  const std::vector<StatePiece> pieces = state_window_pieces(state, off, len, ranges);
  if (pieces.empty()) return;
  SF_CHECK(grad, "cuda adamw_state: null gradient for unit ", state.unit);
  upload_tables();
  LaunchArgs a{};
  a.master_bf16 = state.format.master == MasterFormat::bf16;
  a.off = off;
  a.c[0] = adamw_constants(step, false);
  a.c[1] = adamw_constants(step, true);
  a.round_key = stochastic_round_key(state.rounding_seed, state.unit, step.step);
  a.master = state.master;
  a.m = static_cast<char*>(state.m);
  a.v = static_cast<char*>(state.v);
  a.m_scale = state.m_scale;
  a.v_scale = state.v_scale;
  a.grad = grad;
  a.out = weights_out;
  for (size_t first = 0; first < pieces.size(); first += kMaxPieces) {
    a.n_pieces = int32_t(std::min<size_t>(kMaxPieces, pieces.size() - first));
    a.n_blocks = 0;
    for (int32_t k = 0; k < a.n_pieces; ++k) {
      const StatePiece& p = pieces[first + size_t(k)];
      const RangeStateLayout& r = *p.range;
      a.p[k] = PieceArgs{p.begin, p.end, r.offset, r.numel, r.row, int64_t(r.moment_offset),
                         r.scale_offset, a.n_blocks, moment_code(r.moments), r.decay ? 1 : 0};
      a.n_blocks += piece_blocks(p);
    }
    state_adamw_kernel<<<grid_for(a.n_blocks * kThreads, kThreads), kThreads, 0, s>>>(a);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace sf::cuda
