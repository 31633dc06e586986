// SwiGLU forward/backward (contracts in swiglu.cuh): a grid-stride walk over VW-wide chunks of
// the [T, F] views, each chunk read then written by one thread (in-place safe).
#include "backend/cuda/common.cuh"
#include "backend/cuda/swiglu.cuh"

namespace sf::cuda {
namespace {

struct SwigluArgs {
  bf16* out;  // forward: out; backward: dgate
  int64_t ld_out;
  bf16* out2;  // backward: dup
  int64_t ld_out2;
  const bf16* dout;
  int64_t ld_dout;
  const bf16* gate;
  int64_t ld_gate;
  const bf16* up;
  int64_t ld_up;
  int64_t rows, cols;
};

template <int VW, bool BACKWARD>
__global__ void swiglu_kernel(SwigluArgs a) {
  const int64_t cpr = a.cols / VW, n = a.rows * cpr;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cpr, c = (i - r * cpr) * VW;
    float g[VW], u[VW];
    loadv<VW>(a.gate + r * a.ld_gate + c, g);
    loadv<VW>(a.up + r * a.ld_up + c, u);
    if constexpr (!BACKWARD) {
#pragma unroll
      for (int k = 0; k < VW; ++k) g[k] = g[k] / (1.f + expf(-g[k])) * u[k];
      storev<VW>(a.out + r * a.ld_out + c, g);
    } else {
      float d[VW], du[VW];
      loadv<VW>(a.dout + r * a.ld_dout + c, d);
#pragma unroll
      for (int k = 0; k < VW; ++k) {
        const float e1 = 1.f + expf(-g[k]);
        const float sig = 1.f / e1, silu = g[k] / e1;
        du[k] = d[k] * silu;
        g[k] = d[k] * u[k] * (sig * (1.f + g[k] * (1.f - sig)));
      }
      storev<VW>(a.out + r * a.ld_out + c, g);
      storev<VW>(a.out2 + r * a.ld_out2 + c, du);
    }
  }
}

template <bool BACKWARD>
void launch(cudaStream_t s, const SwigluArgs& a, bool vec) {
  const int64_t n = a.rows * a.cols;
  if (vec)
    swiglu_kernel<8, BACKWARD><<<grid_for(n / 8, 256), 256, 0, s>>>(a);
  else
    swiglu_kernel<1, BACKWARD><<<grid_for(n, 256), 256, 0, s>>>(a);
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_swiglu_forward(cudaStream_t s, Mat out, Mat gate, Mat up) {
  NVTX_RANGE("swiglu_forward");
  check_mat(gate, DType::bf16, -1, -1, "swiglu_forward", "gate");
  check_mat(up, DType::bf16, gate.rows, gate.cols, "swiglu_forward", "up");
  check_mat(out, DType::bf16, gate.rows, gate.cols, "swiglu_forward", "out");
  if (gate.numel() == 0) return;
  SwigluArgs a{out.as<bf16>(), out.ld, nullptr, 0, nullptr, 0, gate.as<const bf16>(), gate.ld,
               up.as<const bf16>(), up.ld, gate.rows, gate.cols};
  launch<false>(s, a, vec8_ok(out) && vec8_ok(gate) && vec8_ok(up));
}

void launch_swiglu_backward(cudaStream_t s, Mat dgate, Mat dup, Mat dout, Mat gate, Mat up) {
  NVTX_RANGE("swiglu_backward");
  const char* op = "swiglu_backward";
  check_mat(gate, DType::bf16, -1, -1, op, "gate");
  check_mat(up, DType::bf16, gate.rows, gate.cols, op, "up");
  check_mat(dout, DType::bf16, gate.rows, gate.cols, op, "dout");
  check_mat(dgate, DType::bf16, gate.rows, gate.cols, op, "dgate");
  check_mat(dup, DType::bf16, gate.rows, gate.cols, op, "dup");
  if (gate.numel() == 0) return;
  SwigluArgs a{dgate.as<bf16>(), dgate.ld, dup.as<bf16>(), dup.ld, dout.as<const bf16>(), dout.ld,
               gate.as<const bf16>(), gate.ld, up.as<const bf16>(), up.ld, gate.rows, gate.cols};
  launch<true>(s, a, vec8_ok(dgate) && vec8_ok(dup) && vec8_ok(dout) && vec8_ok(gate) &&
                         vec8_ok(up));
}

}  // namespace sf::cuda
