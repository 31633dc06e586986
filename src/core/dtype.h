// Element types and the bit-exact conversions between them (round to nearest even).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace sf {

// u8: opaque bytes (e.g. int8 optimizer-state codes in a resume file), never a weight.
enum class DType : uint8_t { f32, bf16, f16, i32, u32, i64, u8 };

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: case DType::u32: return 4;
    case DType::bf16: case DType::f16: return 2;
    case DType::i64: return 8;
    case DType::u8: return 1;
  }
  return 0;
}
std::string_view dtype_name(DType t);  // "f32", "bf16", ...

// bfloat16 / float16 are carried as raw uint16_t bits.
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);                                           // RNE
  return uint16_t(u >> 16);
}
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

// Round-trip through bf16 (what a bf16 store then load does to a value).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

// Bulk conversions (n elements), used by I/O and tests.
void convert_to_f32(const void* src, DType src_type, float* dst, size_t n);
void convert_from_f32(const float* src, void* dst, DType dst_type, size_t n);

}  // namespace sf
