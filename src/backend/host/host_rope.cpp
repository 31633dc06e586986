// HostBackend RoPE, Hugging Face rotate_half convention, in place (x / dx overwritten).
// For head h and i < D/2, with angle = float(pos[t]) * inv_freq[i] (fp32, as transformers
// computes inv_freq @ position_ids), c = cos(angle), s = sin(angle):
//   forward : (x_i, x_{i+D/2}) -> (x_i c - x_{i+D/2} s, x_{i+D/2} c + x_i s)
//   backward: the transpose, i.e. rotation by -angle.
// x is [T, H*D] and may be a strided column block (q or k of the fused qkv output).
#include <cmath>
#include <vector>

#include "backend/host/host_backend.h"
#include "core/thread_pool.h"

namespace sf {

using namespace host_detail;

namespace {

void rope_apply(Mat x, int n_heads, int head_dim, const int32_t* pos, const float* inv_freq,
                float sign, const char* op) {
  check_f32(x, op, "x");
  SF_CHECK(n_heads > 0 && head_dim > 0 && head_dim % 2 == 0, "host ", op, ": n_heads ",
           n_heads, ", head_dim ", head_dim, " (head_dim must be even)");
  SF_CHECK(x.cols == int64_t(n_heads) * head_dim, "host ", op, ": x has ", x.cols,
           " columns, expected n_heads * head_dim = ", int64_t(n_heads) * head_dim);
  SF_CHECK((pos && inv_freq) || x.rows == 0, "host ", op, ": null positions or inv_freq");
  const int half = head_dim / 2;
  host_pool().parallel_for(x.rows, [&](int64_t r0, int64_t r1) {
    std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
    for (int64_t t = r0; t < r1; ++t) {
      const float p = float(pos[t]);
      for (int i = 0; i < half; ++i) {
        const float angle = p * inv_freq[i];
        cs[size_t(i)] = std::cos(angle);
        sn[size_t(i)] = sign * std::sin(angle);
      }
      float* row = frow(x, t);
      for (int h = 0; h < n_heads; ++h) {
        float* x1 = row + int64_t(h) * head_dim;
        float* x2 = x1 + half;
        for (int i = 0; i < half; ++i) {
          const float a = x1[i], b = x2[i], c = cs[size_t(i)], s = sn[size_t(i)];
          x1[i] = a * c - b * s;
          x2[i] = b * c + a * s;
        }
      }
    }
  }, row_grain(x.cols) / 4 + 1);  // cos/sin per row make a row costlier than a copy
}

}  // namespace

void HostBackend::rope_forward(Stream&, Mat x, int n_heads, int head_dim, const int32_t* pos,
                               const float* inv_freq) {
  rope_apply(x, n_heads, head_dim, pos, inv_freq, 1.f, "rope_forward");
}

void HostBackend::rope_backward(Stream&, Mat dx, int n_heads, int head_dim, const int32_t* pos,
                                const float* inv_freq) {
  rope_apply(dx, n_heads, head_dim, pos, inv_freq, -1.f, "rope_backward");
}

}  // namespace sf
