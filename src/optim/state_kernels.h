// Internal to src/optim: the per-ISA kernels behind state_adamw.h (compact AdamW state).
//
// Same rules as kernels.h: state_kernels_avx2.cpp / state_kernels_avx512.cpp are compiled
// with ISA flags and include only <immintrin.h>, kernels.h, this header and
// state_kernels_simd.inl; this header stays free of inline functions and templates, and the
// front end reaches a variant only through state_kernel_table.h.
//
// A kernel does one AdamW step (adamw.h's arithmetic, no FMA) on each of n_tasks tasks of one
// parameter range, in order: decode master, m, v; update in fp32; encode them back; write the
// bf16 copy. For int8 moments a task is exactly one block (n <= 256), whose scales are
// *m_scale, *v_scale (overwritten). Tails go through the scalar kernels. A call takes the
// blocks of a whole chunk so that the constants' setup (int8: the code tables) is paid once
// per chunk, not per 256-element block.
#pragma once
#include <cstdint>

#include "optim/kernels.h"

namespace sf::optim_kernels {

// state_format.h's kStateBlock and the m map's zero code (repeated so the ISA files need not
// include it; state_kernels_scalar.cpp checks they agree).
constexpr int64_t kBlock = 256;
constexpr int kZeroCodeM = 127;

// One task; every pointer is at the task's first element (scales: at its block's scale).
struct StateTask {
  const void* g;   // float or uint16_t (bf16 bits), per the kernel
  uint16_t* out;   // bf16 copy (may be null; may alias a bf16 g exactly)
  void* master;    // float or uint16_t (bf16 bits)
  void* m;         // float, uint16_t (bf16 bits) or uint8_t codes
  void* v;
  float* m_scale;  // int8 only
  float* v_scale;
  int64_t n;
  uint32_t index;  // the first element's index in its unit (stochastic rounding)
};

struct StateConsts {
  Consts adam;
  uint32_t round_key;  // stochastic_round_key(seed, unit, step)
  const float* map_m;  // int8 maps and midpoints (state_format.h)
  const float* mid_m;
  const float* map_v;
  const float* mid_v;
};

using StateKernel = void (*)(const StateTask* tasks, int64_t n_tasks, const StateConsts&);

// Kernel names: state_<grad>_<moments>_<master>_<isa>, grad f32|bf16, moments f32|bf16|int8,
// master f32|bf16 (bf16: stochastic rounding). int8_encode / int8_decode: one block (n <=
// kBlock) of the v map (is_v) or the m map to / from fp32, as int8_encode_block /
// int8_decode_block below (the state_from_f32 / state_to_f32 conversions).
#define SF_STATE_KERNELS_FOR(ISA)                                          \
  void state_f32_f32_f32_##ISA(const StateTask*, int64_t, const StateConsts&);     \
  void state_f32_f32_bf16_##ISA(const StateTask*, int64_t, const StateConsts&);    \
  void state_f32_bf16_f32_##ISA(const StateTask*, int64_t, const StateConsts&);    \
  void state_f32_bf16_bf16_##ISA(const StateTask*, int64_t, const StateConsts&);   \
  void state_f32_int8_f32_##ISA(const StateTask*, int64_t, const StateConsts&);    \
  void state_f32_int8_bf16_##ISA(const StateTask*, int64_t, const StateConsts&);   \
  void state_bf16_f32_f32_##ISA(const StateTask*, int64_t, const StateConsts&);    \
  void state_bf16_f32_bf16_##ISA(const StateTask*, int64_t, const StateConsts&);   \
  void state_bf16_bf16_f32_##ISA(const StateTask*, int64_t, const StateConsts&);   \
  void state_bf16_bf16_bf16_##ISA(const StateTask*, int64_t, const StateConsts&);  \
  void state_bf16_int8_f32_##ISA(const StateTask*, int64_t, const StateConsts&);   \
  void state_bf16_int8_bf16_##ISA(const StateTask*, int64_t, const StateConsts&); \
  void int8_encode_##ISA(const float* x, int64_t n, bool is_v, const StateConsts& c, \
                         uint8_t* codes, float* scale);                               \
  void int8_decode_##ISA(const uint8_t* codes, int64_t n, bool is_v, float scale,     \
                         const StateConsts& c, float* x);
SF_STATE_KERNELS_FOR(scalar)
SF_STATE_KERNELS_FOR(avx2)
SF_STATE_KERNELS_FOR(avx512)
#undef SF_STATE_KERNELS_FOR

// Block codecs (scalar; also the SIMD kernels' reference): x (n <= 256 floats) <-> codes and
// the block's scale, with map / mid one of state_format.h's int8 maps.
void int8_encode_block(const float* x, int64_t n, const float* mid, uint8_t* codes,
                       float* scale);
void int8_decode_block(const uint8_t* codes, int64_t n, const float* map, float scale,
                       float* x);

}  // namespace sf::optim_kernels
