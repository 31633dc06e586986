// Portable compact-state AdamW kernels (state_kernels.h) and the int8 block codecs: the
// reference every SIMD variant and the CUDA kernel must match bit for bit, and the tail
// handler of the SIMD variants. Built with -ffp-contract=off (no fused multiply-add).
#include <cmath>

#include "core/dtype.h"
#include "optim/adamw_element.h"
#include "optim/state_format.h"
#include "optim/state_kernels.h"

namespace sf::optim_kernels {

static_assert(kBlock == kStateBlock && kZeroCodeM == kInt8ZeroCodeM);

namespace {

enum Mom { kF32 = 0, kBf16 = 1, kInt8 = 2 };

inline float load_grad(const float* g, int64_t i) { return g[i]; }
inline float load_grad(const uint16_t* g, int64_t i) { return bf16_to_f32(g[i]); }

// The block's absmax; NaN is skipped (the comparison is false), as in every variant.
float absmax(const float* x, int64_t n) {
  float a = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    a = ax > a ? ax : a;
  }
  return a;
}

// The number of midpoints strictly below y: 8 halving steps over mid[0..254].
inline int int8_code(float y, const float* mid) {
  int c = 0;
  for (int b = 128; b >= 1; b >>= 1) c += y > mid[c + b - 1] ? b : 0;
  return c;
}

template <int kMom>
inline float load_moment(const void* a, int64_t i, const float* map, float scale) {
  if constexpr (kMom == kF32) return static_cast<const float*>(a)[i];
  if constexpr (kMom == kBf16) return bf16_to_f32(static_cast<const uint16_t*>(a)[i]);
  if constexpr (kMom == kInt8) return map[static_cast<const uint8_t*>(a)[i]] * scale;
}

template <int kMom>
inline void store_moment(void* a, int64_t i, float x) {
  if constexpr (kMom == kF32) static_cast<float*>(a)[i] = x;
  if constexpr (kMom == kBf16) static_cast<uint16_t*>(a)[i] = f32_to_bf16(x);
}

// One pass over the task; int8 moments are staged in mb / vb (one block) and encoded after.
template <class G, int kMom, bool kBf16Master>
void state_step(const StateTask& t, const StateConsts& c) {
  const G* g = static_cast<const G*>(t.g);
  const Consts k = c.adam;
  const float ms = kMom == kInt8 ? *t.m_scale : 0.0f, vs = kMom == kInt8 ? *t.v_scale : 0.0f;
  float mb[kMom == kInt8 ? kStateBlock : 1], vb[kMom == kInt8 ? kStateBlock : 1];
  for (int64_t i = 0; i < t.n; ++i) {
    const float graw = load_grad(g, i);
    float p = kBf16Master ? bf16_to_f32(static_cast<const uint16_t*>(t.master)[i])
                          : static_cast<const float*>(t.master)[i];
    float m = load_moment<kMom>(t.m, i, c.map_m, ms);
    float v = load_moment<kMom>(t.v, i, c.map_v, vs);
    update1(graw, p, m, v, k);
    uint16_t bits;
    if constexpr (kBf16Master) {
      bits = stochastic_round_bf16(p, stochastic_round_noise(c.round_key, t.index + uint32_t(i)));
      static_cast<uint16_t*>(t.master)[i] = bits;
    } else {
      static_cast<float*>(t.master)[i] = p;
      bits = f32_to_bf16(p);
    }
    if (t.out) t.out[i] = bits;
    if constexpr (kMom == kInt8) {
      mb[i] = m;
      vb[i] = v;
    } else {
      store_moment<kMom>(t.m, i, m);
      store_moment<kMom>(t.v, i, v);
    }
  }
  if constexpr (kMom == kInt8) {
    int8_encode_block(mb, t.n, c.mid_m, static_cast<uint8_t*>(t.m), t.m_scale);
    int8_encode_block(vb, t.n, c.mid_v, static_cast<uint8_t*>(t.v), t.v_scale);
  }
}

}  // namespace

void int8_encode_block(const float* x, int64_t n, const float* mid, uint8_t* codes,
                       float* scale) {
  const float a = absmax(x, n);
  const float d = a > 0.0f ? a : 1.0f;  // an all-zero block: 0 / 1 = 0, not 0 / 0
  for (int64_t i = 0; i < n; ++i) codes[i] = uint8_t(int8_code(x[i] / d, mid));
  *scale = a;
}

void int8_decode_block(const uint8_t* codes, int64_t n, const float* map, float scale,
                       float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] = map[codes[i]] * scale;
}

void int8_encode_scalar(const float* x, int64_t n, bool is_v, const StateConsts& c,
                        uint8_t* codes, float* scale) {
  int8_encode_block(x, n, is_v ? c.mid_v : c.mid_m, codes, scale);
}
void int8_decode_scalar(const uint8_t* codes, int64_t n, bool is_v, float scale,
                        const StateConsts& c, float* x) {
  int8_decode_block(codes, n, is_v ? c.map_v : c.map_m, scale, x);
}

#define SF_STATE_KERNEL(G, GN, MOM, MN, BM, BMN)                                   \
  void state_##GN##_##MN##_##BMN##_scalar(const StateTask* t, int64_t n, const StateConsts& c) { \
    for (int64_t i = 0; i < n; ++i) state_step<G, MOM, BM>(t[i], c);                             \
  }
#define SF_STATE_KERNELS_G(G, GN)                   \
  SF_STATE_KERNEL(G, GN, kF32, f32, false, f32)     \
  SF_STATE_KERNEL(G, GN, kF32, f32, true, bf16)     \
  SF_STATE_KERNEL(G, GN, kBf16, bf16, false, f32)   \
  SF_STATE_KERNEL(G, GN, kBf16, bf16, true, bf16)   \
  SF_STATE_KERNEL(G, GN, kInt8, int8, false, f32)   \
  SF_STATE_KERNEL(G, GN, kInt8, int8, true, bf16)
SF_STATE_KERNELS_G(float, f32)
SF_STATE_KERNELS_G(uint16_t, bf16)
#undef SF_STATE_KERNELS_G
#undef SF_STATE_KERNEL

}  // namespace sf::optim_kernels
