// HostBackend SwiGLU: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)) (overwrite).
// Backward (overwrite, exact): with sig = 1/(1+exp(-g)),
//   dgate = dout * up * sig * (1 + g * (1 - sig)),  dup = dout * silu(g).
// Every element is read before its outputs are written, so dgate/dup may alias gate/up (and
// dout). gate/up are usually strided column blocks of the fused gate_up output.
#include <cmath>

#include "backend/host/host_backend.h"
#include "core/thread_pool.h"

namespace sf {

using namespace host_detail;

void HostBackend::swiglu_forward(Stream&, Mat out, Mat gate, Mat up) {
  check_f32(out, "swiglu_forward", "out");
  check_f32(gate, "swiglu_forward", "gate");
  check_f32(up, "swiglu_forward", "up");
  check_shape(up, gate.rows, gate.cols, "swiglu_forward", "up");
  check_shape(out, gate.rows, gate.cols, "swiglu_forward", "out");
  host_pool().parallel_for(gate.rows, [&](int64_t r0, int64_t r1) {
    for (int64_t t = r0; t < r1; ++t) {
      const float* g = frow(gate, t);
      const float* u = frow(up, t);
      float* o = frow(out, t);
      for (int64_t c = 0; c < gate.cols; ++c) {
        const float gv = g[c];
        o[c] = gv / (1.f + std::exp(-gv)) * u[c];
      }
    }
  }, row_grain(gate.cols) / 4 + 1);
}

void HostBackend::swiglu_backward(Stream&, Mat dgate, Mat dup, Mat dout, Mat gate, Mat up) {
  check_f32(dgate, "swiglu_backward", "dgate");
  check_f32(dup, "swiglu_backward", "dup");
  check_f32(dout, "swiglu_backward", "dout");
  check_f32(gate, "swiglu_backward", "gate");
  check_f32(up, "swiglu_backward", "up");
  for (const Mat* m : {&dgate, &dup, &dout, &up})
    check_shape(*m, gate.rows, gate.cols, "swiglu_backward", "dgate/dup/dout/up");
  host_pool().parallel_for(gate.rows, [&](int64_t r0, int64_t r1) {
    for (int64_t t = r0; t < r1; ++t) {
      const float* g = frow(gate, t);
      const float* u = frow(up, t);
      const float* d = frow(dout, t);
      float* dg = frow(dgate, t);
      float* du = frow(dup, t);
      for (int64_t c = 0; c < gate.cols; ++c) {
        const float gv = g[c], uv = u[c], dv = d[c];
        const float e1 = 1.f + std::exp(-gv);
        const float sig = 1.f / e1;
        const float silu = gv / e1;  // the forward's value, bit for bit
        dg[c] = dv * uv * (sig * (1.f + gv * (1.f - sig)));
        du[c] = dv * silu;
      }
    }
  }, row_grain(gate.cols) / 4 + 1);
}

}  // namespace sf
