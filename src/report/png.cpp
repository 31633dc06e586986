#include "report/png.h"

#include <zlib.h>

#include "core/error.h"
#include "io/atomic_file.h"

namespace sf {

RgbImage::RgbImage(int w, int h, uint32_t fill) : width(w), height(h) {
  SF_CHECK(w > 0 && h > 0, "image size ", w, "x", h);
  rgb.resize(size_t(w) * size_t(h) * 3);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) set(x, y, fill);
}

void RgbImage::set(int x, int y, uint32_t color) {
  if (x < 0 || y < 0 || x >= width || y >= height) return;
  uint8_t* p = &rgb[(size_t(y) * size_t(width) + size_t(x)) * 3];
  p[0] = uint8_t(color >> 16);
  p[1] = uint8_t(color >> 8);
  p[2] = uint8_t(color);
}

uint32_t RgbImage::get(int x, int y) const {
  const uint8_t* p = &rgb[(size_t(y) * size_t(width) + size_t(x)) * 3];
  return uint32_t(p[0]) << 16 | uint32_t(p[1]) << 8 | p[2];
}

uint32_t png_crc32(const uint8_t* data, size_t n, uint32_t crc) {
  static const auto table = [] {
    std::vector<uint32_t> t(256);
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ data[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

namespace {

void put_u32(std::string& s, uint32_t v) {
  s.push_back(char(v >> 24));
  s.push_back(char(v >> 16));
  s.push_back(char(v >> 8));
  s.push_back(char(v));
}

void chunk(std::string& out, const char type[4], const std::string& data) {
  put_u32(out, uint32_t(data.size()));
  std::string body(type, 4);
  body += data;
  out += body;
  put_u32(out, png_crc32(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
}

}  // namespace

std::string encode_png(const RgbImage& img) {
  SF_CHECK(img.width > 0 && img.height > 0 &&
               img.rgb.size() == size_t(img.width) * size_t(img.height) * 3,
           "encode_png: bad image");
  const size_t stride = size_t(img.width) * 3;
  std::vector<uint8_t> raw;
  raw.reserve((stride + 1) * size_t(img.height));
  for (int y = 0; y < img.height; ++y) {
    const uint8_t* row = &img.rgb[size_t(y) * stride];
    if (y == 0) {
      raw.push_back(0);  // filter None
      raw.insert(raw.end(), row, row + stride);
    } else {
      raw.push_back(2);  // filter Up: difference to the row above
      const uint8_t* up = row - stride;
      for (size_t i = 0; i < stride; ++i) raw.push_back(uint8_t(row[i] - up[i]));
    }
  }
  uLongf zn = compressBound(uLong(raw.size()));
  std::string z(zn, '\0');
  int rc = compress2(reinterpret_cast<Bytef*>(z.data()), &zn, raw.data(), uLong(raw.size()), 9);
  SF_CHECK(rc == Z_OK, "zlib compress2 failed (", rc, ")");
  z.resize(zn);

  std::string out("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  put_u32(ihdr, uint32_t(img.width));
  put_u32(ihdr, uint32_t(img.height));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8 bits, RGB, deflate, filter 0, no interlace
  chunk(out, "IHDR", ihdr);
  chunk(out, "IDAT", z);
  chunk(out, "IEND", "");
  return out;
}

void write_png(const std::filesystem::path& p, const RgbImage& img) {
  write_file_atomic(p, encode_png(img));
}

}  // namespace sf
