// The SIMD int8 encoders (state_kernels_simd.inl: bucketed octave search, folded zero / NaN /
// sign tests) against the scalar midpoint search (state_kernels_scalar.cpp), far beyond the
// tie probes of test_state_adamw.cpp: every float of the two top octaves (where the bucket
// tables decide), a strided sweep of every octave of (0, 1] of both signs (the exponent path
// and both maps' zero thresholds), and blocks of special values (inf, NaN, -0, denormals).
// Codes and scales must be equal bit for bit; no tolerance (the encoding is exact).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "optim/cpu_isa.h"
#include "optim/state_format.h"
#include "optim/state_kernel_table.h"

using namespace sf;
namespace ok = sf::optim_kernels;

namespace {

ok::StateConsts maps() {
  ok::StateConsts c{};
  c.map_m = int8_map(false);
  c.mid_m = int8_midpoints(false);
  c.map_v = int8_map(true);
  c.mid_v = int8_midpoints(true);
  return c;
}

// Encodes ys with the scalar and the `isa` codec, 255 per block behind a leading 1.0 (so
// the block's scale is 1 and each probe is divided by 1: the code of the probe itself), and
// returns the number of blocks checked; the first mismatch fails the test.
int64_t compare_codes(CpuIsa isa, bool is_v, const std::vector<float>& ys) {
  const ok::StateKernelTable& ref = ok::state_kernel_table(CpuIsa::scalar);
  const ok::StateKernelTable& t = ok::state_kernel_table(isa);
  const ok::StateConsts c = maps();
  float blk[256];
  int64_t blocks = 0;
  for (size_t b = 0; b < ys.size(); b += 255, ++blocks) {
    const size_t n = std::min<size_t>(255, ys.size() - b);
    blk[0] = 1.0f;
    for (size_t i = 0; i < n; ++i) blk[1 + i] = ys[b + i];
    uint8_t c1[256], c2[256];
    float s1 = -1, s2 = -2;
    ref.int8_encode(blk, int64_t(n + 1), is_v, c, c1, &s1);
    t.int8_encode(blk, int64_t(n + 1), is_v, c, c2, &s2);
    EXPECT_EQ(std::bit_cast<uint32_t>(s1), std::bit_cast<uint32_t>(s2));
    for (size_t i = 0; i <= n; ++i)
      if (c1[i] != c2[i]) {
        ADD_FAILURE() << cpu_isa_name(isa) << (is_v ? " v" : " m") << " map: y = " << blk[i]
                      << " (bits 0x" << std::hex << std::bit_cast<uint32_t>(blk[i]) << std::dec
                      << ") scalar code " << int(c1[i]) << ", SIMD " << int(c2[i]);
        return blocks;
      }
  }
  return blocks;
}

// Floats with biased exponent `exp`, every `stride`-th mantissa (and the last one), of the
// given sign.
void add_octave(std::vector<float>& ys, uint32_t exp, uint32_t stride, bool negative) {
  const uint32_t sign = negative ? 0x80000000u : 0u;
  for (uint32_t m = 0; m < (1u << 23); m += stride) ys.push_back(std::bit_cast<float>(sign | exp << 23 | m));
  ys.push_back(std::bit_cast<float>(sign | exp << 23 | 0x7fffffu));
}

std::vector<CpuIsa> simd_isas() {
  std::vector<CpuIsa> r;
  for (CpuIsa isa : {CpuIsa::avx2, CpuIsa::avx512})
    if (cpu_isa_supported(isa)) r.push_back(isa);
  return r;
}

// Every float of [0.25, 1): all 16 buckets of every mantissa in the two octaves next to the
// block's absmax, where most codes live.
TEST(StateInt8Codes, EveryFloatOfTheTopTwoOctaves) {
  for (bool is_v : {false, true}) {
    std::vector<float> ys;
    for (uint32_t exp : {126u, 125u})
      for (bool neg : {false, true})
        if (!neg || !is_v) add_octave(ys, exp, 1, neg);
    for (CpuIsa isa : simd_isas()) EXPECT_GT(compare_codes(isa, is_v, ys), 0);
  }
}

// Every octave of (0, 1] and the denormals, both signs, both maps (the v map's negatives all
// give code 0): the exponent arithmetic, the caps at the last magnitude and the zero
// thresholds (m: near 2^-16.9, v: near 2^-32.75). Stride 509 (a prime: the sampled mantissas
// fall in every bucket) keeps it to ~4M floats per map and sign.
TEST(StateInt8Codes, StridedSweepOfEveryOctave) {
  for (bool is_v : {false, true}) {
    std::vector<float> ys;
    for (bool neg : {false, true})
      for (uint32_t exp = 0; exp <= 126; ++exp) add_octave(ys, exp, 509, neg);
    for (float y : {1.0f, -1.0f}) ys.push_back(y);
    for (CpuIsa isa : simd_isas()) EXPECT_GT(compare_codes(isa, is_v, ys), 0);
  }
}

// Blocks whose absmax or values are special: infinities (scale inf: y = x / inf), NaN (no
// scale contribution, code 0), signed zeros, denormals, and an all-zero block (scale 0).
TEST(StateInt8Codes, SpecialValueBlocks) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::nanf("");
  const float den = std::numeric_limits<float>::denorm_min();
  const std::vector<std::vector<float>> blocks = {
      {inf, 1.0f, -0.5f, nan, 0.0f, -0.0f, den, -den, inf, -inf},
      {-inf, 0.25f, nan, -0.0f},
      {nan, nan, 3.0f, -2.0f, 1e-30f, -1e-30f, den, 0.0f},
      {0.0f, -0.0f, 0.0f},
      {den, -den, 2 * den, 1e-38f, -1e-38f},
      {-1e-3f, 1e-3f, 2.5e-7f, -7.5e-7f, nan, 1e-12f, 4e-13f},
  };
  const ok::StateConsts c = maps();
  const ok::StateKernelTable& ref = ok::state_kernel_table(CpuIsa::scalar);
  for (CpuIsa isa : simd_isas()) {
    const ok::StateKernelTable& t = ok::state_kernel_table(isa);
    for (bool is_v : {false, true})
      for (const std::vector<float>& x : blocks) {
        uint8_t c1[16], c2[16];
        float s1 = -1, s2 = -2;
        ref.int8_encode(x.data(), int64_t(x.size()), is_v, c, c1, &s1);
        t.int8_encode(x.data(), int64_t(x.size()), is_v, c, c2, &s2);
        EXPECT_EQ(std::bit_cast<uint32_t>(s1), std::bit_cast<uint32_t>(s2));
        for (size_t i = 0; i < x.size(); ++i)
          EXPECT_EQ(int(c1[i]), int(c2[i])) << cpu_isa_name(isa) << (is_v ? " v" : " m")
                                            << " x = " << x[i] << " scale " << s1;
      }
  }
}

}  // namespace
