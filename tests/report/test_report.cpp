// What a run reports: the PNG writer (decoded back with zlib), the loss plot, the progress line
// and FLOP count.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "model/model_init.h"  // tiny_config
#include "report/plot.h"
#include "report/png.h"
#include "report/progress.h"
#include "test_util.h"

namespace sf::test {
namespace {

// ---- PNG -----------------------------------------------------------------------------------

uint32_t be32(const std::string& s, size_t at) {
  return uint32_t(uint8_t(s[at])) << 24 | uint32_t(uint8_t(s[at + 1])) << 16 |
         uint32_t(uint8_t(s[at + 2])) << 8 | uint32_t(uint8_t(s[at + 3]));
}

// Parses a PNG written by encode_png, checks every chunk's CRC, inflates and un-filters it.
RgbImage decode_png(const std::string& png) {
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  size_t at = 8;
  RgbImage img;
  std::string idat;
  std::vector<std::string> types;
  while (at + 12 <= png.size()) {
    uint32_t len = be32(png, at);
    std::string type = png.substr(at + 4, 4);
    types.push_back(type);
    std::string body = png.substr(at + 4, 4 + len);
    uint32_t crc = be32(png, at + 8 + len);
    EXPECT_EQ(crc, uint32_t(::crc32(0, reinterpret_cast<const Bytef*>(body.data()), uInt(body.size()))))
        << type;
    EXPECT_EQ(crc, png_crc32(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
    std::string data = png.substr(at + 8, len);
    if (type == "IHDR") {
      EXPECT_EQ(len, 13u);
      img.width = int(be32(data, 0));
      img.height = int(be32(data, 4));
      EXPECT_EQ(data.substr(8), std::string("\x08\x02\x00\x00\x00", 5));  // 8-bit RGB
    } else if (type == "IDAT") {
      idat += data;
    }
    at += 12 + len;
  }
  EXPECT_EQ(at, png.size());
  EXPECT_EQ(types.front(), "IHDR");
  EXPECT_EQ(types.back(), "IEND");
  const size_t stride = size_t(img.width) * 3;
  std::vector<uint8_t> raw((stride + 1) * size_t(img.height));
  uLongf n = uLongf(raw.size());
  EXPECT_EQ(Z_OK, ::uncompress(raw.data(), &n, reinterpret_cast<const Bytef*>(idat.data()),
                               uLong(idat.size())));
  EXPECT_EQ(n, raw.size());
  img.rgb.resize(stride * size_t(img.height));
  for (int y = 0; y < img.height; ++y) {
    uint8_t filter = raw[size_t(y) * (stride + 1)];
    const uint8_t* src = &raw[size_t(y) * (stride + 1) + 1];
    uint8_t* dst = &img.rgb[size_t(y) * stride];
    for (size_t i = 0; i < stride; ++i) {
      uint8_t up = y > 0 ? dst[i - stride] : 0;
      if (filter == 0) dst[i] = src[i];
      else if (filter == 2) dst[i] = uint8_t(src[i] + up);
      else ADD_FAILURE() << "filter " << int(filter);
    }
  }
  return img;
}

TEST(Png, RoundTripsThroughZlibWithValidChunks) {
  RgbImage img(37, 23, 0xffffff);
  std::mt19937 g(3);
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x)
      if (g() % 3) img.set(x, y, g() & 0xffffff);
  std::string png = encode_png(img);
  RgbImage back = decode_png(png);
  ASSERT_EQ(back.width, 37);
  ASSERT_EQ(back.height, 23);
  EXPECT_EQ(back.rgb, img.rgb);
  // The CRC of the standard check string.
  const char* check = "123456789";
  EXPECT_EQ(png_crc32(reinterpret_cast<const uint8_t*>(check), 9), 0xcbf43926u);
}

TEST(Plot, DrawsAxesCurvesAndLabels) {
  LossCurves c;
  for (int s = 1; s <= 60; ++s) c.train.push_back({double(s), 10.0 - 4.0 * std::log1p(s) / std::log(61.0) + 0.1 * std::sin(s)});
  for (int s = 0; s <= 60; s += 10) c.eval.push_back({double(s), 10.0 - 3.5 * s / 60.0});
  RgbImage img = plot_loss_curves(c, 640, 400);
  RgbImage back = decode_png(encode_png(img));
  EXPECT_EQ(back.rgb, img.rgb);
  size_t orange = 0, blue = 0, dark = 0;
  for (int y = 0; y < img.height; ++y)
    for (int x = 0; x < img.width; ++x) {
      uint32_t p = img.get(x, y);
      orange += p == 0xe8710a;
      blue += p == 0x1f5fa8;
      dark += p == 0x222222;
    }
  EXPECT_GT(orange, 500u);  // eval line and markers
  EXPECT_GT(blue, 500u);    // smoothed train line
  EXPECT_GT(dark, 1500u);   // axes, ticks, labels
  // Text renders glyph pixels (and unknown characters as boxes).
  RgbImage t(40, 10, 0xffffff);
  draw_text(t, 0, 0, "1.5", 0x000000);
  size_t ink = 0;
  for (int y = 0; y < 10; ++y)
    for (int x = 0; x < 40; ++x) ink += t.get(x, y) == 0;
  EXPECT_GT(ink, 10u);
  EXPECT_EQ(text_width("abc"), 17);
  EXPECT_EQ(nice_ticks(0, 60, 6), (std::vector<double>{0, 10, 20, 30, 40, 50, 60}));
  EXPECT_EQ(nice_ticks(6.2, 10.9, 5), (std::vector<double>{7, 8, 9, 10}));
}

// ---- progress ------------------------------------------------------------------------------

TEST(Progress, StatusLineFitsTheTerminalAndFlopsCount) {
  ProgressSnapshot s;
  s.step = 12;
  s.total = 400;
  s.loss = 3.14159;
  s.lr = 2e-4;
  s.tokens_per_second = 12345;
  s.tflops = 0.4;
  s.device_bytes = size_t(3) << 30;
  s.host_bytes = size_t(700) << 20;
  s.eta_seconds = 125;
  std::string wide = format_status(s, 200, true);
  for (const char* w : {"step  12/400", "loss 3.1416", "lr 2.00e-04", "12.3k tok/s", "0.4 TFLOP/s",
                        "dev 3.0G", "host 700M", "eta 2m05s", "[...."})
    EXPECT_NE(wide.find(w), std::string::npos) << w << " in " << wide;
  std::string narrow = format_status(s, 60, true);
  EXPECT_LE(narrow.size(), 60u);
  EXPECT_NE(narrow.find("eta 2m05s"), std::string::npos) << narrow;  // kept before the rest
  EXPECT_NE(narrow.find("loss 3.1416"), std::string::npos) << narrow;
  s.step = 200;
  EXPECT_NE(format_status(s, 200, true).find("[##########..........]"), std::string::npos);
  EXPECT_GT(host_rss_bytes(), size_t(1) << 20);

  // 6 N T + attention: one sequence of 4 tokens on tiny_config (untied: the embedding table
  // takes no part in products).
  ModelConfig c = tiny_config(Arch::qwen3);
  Batch b = Batch::from_rows({{1, 2, 3, 4}});
  std::vector<Batch> m = {b};
  double n = double(c.num_parameters()) - double(c.vocab_size * c.hidden_size);
  double expect = 6 * n * 4 + 6.0 * double(c.q_dim()) * 4 * 5 * double(c.num_hidden_layers);
  EXPECT_DOUBLE_EQ(step_model_flops(c, m), expect);

  std::ostringstream os;
  ProgressDisplay d(os, ProgressDisplay::Mode::lines, 5);
  for (int i = 1; i <= 12; ++i) {
    s.step = i;
    s.total = 12;
    d.update(s);
  }
  d.message("eval  step 12  loss 1.0");
  std::string log = os.str();
  EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 5);  // steps 1, 5, 10, 12 + message
  EXPECT_EQ(log.find('\r'), std::string::npos);
}

}  // namespace
}  // namespace sf::test
