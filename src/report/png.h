// A minimal PNG encoder for plots: 8-bit RGB, one zlib stream (deflate via zlib) in a single
// IDAT chunk, every row with the "Up" filter (plots are mostly flat colour, so rows that
// repeat their predecessor become zeros and compress to almost nothing).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace sf {

struct RgbImage {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // row-major, 3 bytes per pixel
  RgbImage() = default;
  RgbImage(int w, int h, uint32_t fill = 0xffffff);
  void set(int x, int y, uint32_t color);  // 0xRRGGBB; outside the image: ignored
  uint32_t get(int x, int y) const;
};

// The whole PNG file as bytes.
std::string encode_png(const RgbImage& img);
// encode_png written atomically (temporary name, fsync, rename).
void write_png(const std::filesystem::path& p, const RgbImage& img);
// CRC-32 as PNG chunks use it (ISO 3309, as zlib's crc32).
uint32_t png_crc32(const uint8_t* data, size_t n, uint32_t crc = 0);

}  // namespace sf
