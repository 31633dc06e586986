// Attention over a KV cache (contract in attention_decode.cuh).
#include "backend/cuda/attention_decode.cuh"
#include "backend/cuda/common.cuh"

#include <cmath>

namespace sf::cuda {

namespace {

constexpr int kWarps = 4;

struct DecodeArgs {
  bf16* out;
  int64_t ld_out;
  const bf16* q;
  int64_t ld_q;
  const bf16* k;
  int64_t ld_k;
  const bf16* v;
  int64_t ld_v;
  int64_t past;      // cached tokens before the first new one
  int rep;           // query heads per kv head
  float scale_log2;  // scale * log2(e): the softmax runs in exp2
};

// EPL = head_dim / 32 elements per lane: lane l holds elements [l*EPL, (l+1)*EPL) of a head.
template <int EPL>
__global__ void __launch_bounds__(kWarps * 32) attention_decode_kernel(DecodeArgs a) {
  constexpr int D = EPL * 32;
  const int i = blockIdx.x, h = blockIdx.y, g = h / a.rep;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t len = a.past + i + 1;  // keys this token attends to
  float q[EPL], acc[EPL];
  const bf16* qp = a.q + int64_t(i) * a.ld_q + int64_t(h) * D + lane * EPL;
#pragma unroll
  for (int e = 0; e < EPL; ++e) {
    q[e] = to_f32(qp[e]) * a.scale_log2;
    acc[e] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int64_t j = warp; j < len; j += kWarps) {
    const bf16* kp = a.k + j * a.ld_k + int64_t(g) * D + lane * EPL;
    float sc = 0.f;
#pragma unroll
    for (int e = 0; e < EPL; ++e) sc += q[e] * to_f32(kp[e]);
    sc = warp_sum(sc);
    const float m_new = fmaxf(m, sc);
    const float corr = exp2f(m - m_new), p = exp2f(sc - m_new);
    l = l * corr + p;
    const bf16* vp = a.v + j * a.ld_v + int64_t(g) * D + lane * EPL;
#pragma unroll
    for (int e = 0; e < EPL; ++e) acc[e] = acc[e] * corr + p * to_f32(vp[e]);
    m = m_new;
  }
  // Combine the warps' partial softmaxes: out = sum_w acc_w 2^(m_w - M) / sum_w l_w 2^(m_w - M).
  __shared__ float s_m[kWarps], s_l[kWarps], s_acc[kWarps][D];
  if (lane == 0) s_m[warp] = m, s_l[warp] = l;
#pragma unroll
  for (int e = 0; e < EPL; ++e) s_acc[warp][lane * EPL + e] = acc[e];
  __syncthreads();
  float M = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, s_m[w]);
  float denom = 0.f, wgt[kWarps];
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    wgt[w] = s_m[w] == -INFINITY ? 0.f : exp2f(s_m[w] - M);  // a warp that saw no key
    denom += s_l[w] * wgt[w];
  }
  const float inv = 1.f / denom;
  bf16* op = a.out + int64_t(i) * a.ld_out + int64_t(h) * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += s_acc[w][d] * wgt[w];
    op[d] = from_f32<bf16>(o * inv);
  }
}

}  // namespace

void launch_attention_decode(cudaStream_t s, Mat out, Mat q, Mat k, Mat v,
                             const AttentionShape& sh, int64_t kv_len) {
  NVTX_RANGE("attention_decode");
  const char* op = "attention_decode";
  SF_CHECK(sh.n_heads > 0 && sh.n_kv_heads > 0 && sh.n_heads % sh.n_kv_heads == 0,
           "cuda ", op, ": n_heads ", sh.n_heads, " must be a multiple of n_kv_heads ",
           sh.n_kv_heads);
  SF_CHECK(sh.head_dim == 32 || sh.head_dim == 64 || sh.head_dim == 128 || sh.head_dim == 256,
           "cuda ", op, ": head_dim ", sh.head_dim, " is not 32, 64, 128 or 256");
  const int64_t qd = int64_t(sh.n_heads) * sh.head_dim, kvd = int64_t(sh.n_kv_heads) * sh.head_dim;
  check_mat(q, DType::bf16, -1, qd, op, "q");
  check_mat(out, DType::bf16, q.rows, qd, op, "out");
  check_mat(k, DType::bf16, -1, kvd, op, "k_cache");
  check_mat(v, DType::bf16, -1, kvd, op, "v_cache");
  SF_CHECK(kv_len >= q.rows && kv_len <= k.rows && kv_len <= v.rows, "cuda ", op, ": kv_len ",
           kv_len, " must hold the ", q.rows, " new tokens and fit the cache of ",
           std::min(k.rows, v.rows), " rows");
  if (q.rows == 0) return;
  DecodeArgs a{out.as<bf16>(), out.ld, q.as<const bf16>(), q.ld, k.as<const bf16>(), k.ld,
               v.as<const bf16>(), v.ld, kv_len - q.rows, sh.n_heads / sh.n_kv_heads,
               float(double(sh.scale) * 1.4426950408889634)};
  const dim3 grid(unsigned(q.rows), unsigned(sh.n_heads));
  switch (sh.head_dim) {
    case 32: attention_decode_kernel<1><<<grid, kWarps * 32, 0, s>>>(a); break;
    case 64: attention_decode_kernel<2><<<grid, kWarps * 32, 0, s>>>(a); break;
    case 128: attention_decode_kernel<4><<<grid, kWarps * 32, 0, s>>>(a); break;
    default: attention_decode_kernel<8><<<grid, kWarps * 32, 0, s>>>(a); break;
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace sf::cuda
