#include "report/plot.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>

#include "core/error.h"

namespace sf {

namespace {

// 5x7 glyphs with 2 rows below the baseline for descenders (g, j, p, q, y, ','): one string
// of 9 rows x 5 columns each ('#' = ink). Upper case draws as lower case.
const std::map<char, const char*>& font() {
  static const std::map<char, const char*> f = {
      {'0', ".###.#...##..###.#.###..##...#.###..........."}, {'1', "..#...##....#....#....#....#...###..........."},
      {'2', ".###.#...#....#...#...#...#...#####.........."}, {'3', "#####...#...#.....#.....##...#.###..........."},
      {'4', "...#...##..#.#.#..#.#####...#....#..........."}, {'5', "######....####.....#....##...#.###..........."},
      {'6', "..##..#...#....####.#...##...#.###..........."}, {'7', "#####....#...#...#...#....#....#............."},
      {'8', ".###.#...##...#.###.#...##...#.###..........."}, {'9', ".###.#...##...#.####....#...#..##............"},
      {'.', "..........................##...##............"}, {'-', "................###.........................."},
      {'+', ".......#....#..#####..#....#................."}, {':', "......##...##........##...##................."},
      {'(', "...#...#...#....#....#.....#.....#..........."}, {')', ".#.....#.....#....#....#...#...#............."},
      {'/', ".........#...#...#...#...#..................."}, {',', "..........................##...##....#...#..."},
      {'=', "..........#####.....#####...................."}, {'_', "..............................#####.........."},
      {' ', "............................................."}, {'a', "...........###.....#.#####...#.####.........."},
      {'b', "#....#....#.##.##..##...##...#####..........."}, {'c', "...........###.#....#....#...#.###..........."},
      {'d', "....#....#.##.##..###...##...#.####.........."}, {'e', "...........###.#...#######.....###..........."},
      {'f', "..##..#..#.#...###...#....#....#............."}, {'g', "...........#####...##...##...#.####....#.###."},
      {'h', "#....#....#.##.##..##...##...##...#.........."}, {'i', "..#........##....#....#....#...###..........."},
      {'j', "...#........##....#....#....#....#.#..#..##.."}, {'k', "#....#....#..#.#.#..##...#.#..#..#..........."},
      {'l', ".##....#....#....#....#....#...###..........."}, {'m', "..........##.#.#.#.##.#.##...##...#.........."},
      {'n', "..........#.##.##..##...##...##...#.........."}, {'o', "...........###.#...##...##...#.###..........."},
      {'p', "..........####.#...##...##...#####.#....#...."}, {'q', "...........#####...##...##...#.####....#....#"},
      {'r', "..........#.##.##..##....#....#.............."}, {'s', "...........###.#.....###.....#####..........."},
      {'t', ".#....#...###...#....#....#..#..##..........."}, {'u', "..........#...##...##...##..##.##.#.........."},
      {'v', "..........#...##...##...#.#.#...#............"}, {'w', "..........#...##...##.#.##.#.#.#.#..........."},
      {'x', "..........#...#.#.#...#...#.#.#...#.........."}, {'y', "..........#...##...##...##..##.##.#....#.###."},
      {'z', "..........#####...#...#...#...#####.........."},
  };
  return f;
}

constexpr int kGlyphW = 5, kGlyphH = 9, kAdvance = 6;

void fill_rect(RgbImage& img, int x0, int y0, int w, int h, uint32_t c) {
  for (int y = y0; y < y0 + h; ++y)
    for (int x = x0; x < x0 + w; ++x) img.set(x, y, c);
}

// Bresenham line, each point a t x t square.
void draw_line(RgbImage& img, int x0, int y0, int x1, int y1, uint32_t c, int t = 1) {
  int dx = std::abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
  int dy = -std::abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
  int err = dx + dy;
  for (;;) {
    fill_rect(img, x0 - t / 2, y0 - t / 2, t, t, c);
    if (x0 == x1 && y0 == y1) break;
    int e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      err += dx;
      y0 += sy;
    }
  }
}

std::string tick_label(double v, double step) {
  int decimals = std::max(0, int(-std::floor(std::log10(step) + 1e-9)));
  if (std::fabs(v) >= 1e6 || (v != 0 && std::fabs(v) < 1e-4)) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2g", v);
    return buf;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", std::min(decimals, 6), v);
  std::string s = buf;
  if (s == "-0") s = "0";
  return s;
}

}  // namespace

int text_width(const std::string& text, int scale) {
  return text.empty() ? 0 : (int(text.size()) * kAdvance - 1) * scale;
}

void draw_text(RgbImage& img, int x, int y, const std::string& text, uint32_t color, int scale) {
  for (char ch : text) {
    char c = char(std::tolower(static_cast<unsigned char>(ch)));
    auto it = font().find(c);
    const char* g = it == font().end() ? nullptr : it->second;
    for (int r = 0; r < kGlyphH; ++r)
      for (int col = 0; col < kGlyphW; ++col) {
        bool ink = g ? g[r * kGlyphW + col] == '#'
                     : r < 7 && (r == 0 || r == 6 || col == 0 || col == kGlyphW - 1);
        if (ink) fill_rect(img, x + col * scale, y + r * scale, scale, scale, color);
      }
    x += kAdvance * scale;
  }
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  if (!(hi > lo)) hi = lo + 1;
  double raw = (hi - lo) / std::max(1, target);
  double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double mult = 10;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * mag * 1.0000001) {
      mult = m;
      break;
    }
  const double step = mult * mag;
  // Tick k is k * mult * mag, computed as a division by 1/mag when mag < 1 so that it is the
  // double nearest the decimal (0.3, not 0.30000000000000004).
  const double inv = mag < 1 ? std::round(1 / mag) : 0;
  auto tick = [&](double k) { return inv > 0 ? k * mult / inv : k * mult * mag; };
  std::vector<double> t;
  for (double k = std::ceil(lo / step - 1e-9); tick(k) <= hi + step * 1e-9; k += 1)
    t.push_back(k == 0 ? 0.0 : tick(k));
  return t;
}

RgbImage plot_loss_curves(const LossCurves& c, int width, int height) {
  RgbImage img(width, height, 0xffffff);
  const int scale = 2;  // font pixels
  const int left = 100, right = 30, top = 56, bottom = 70;
  const int pw = width - left - right, ph = height - top - bottom;
  SF_CHECK(pw > 50 && ph > 50, "plot too small");

  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  auto extend = [&](const std::vector<std::pair<double, double>>& s) {
    for (auto& [x, y] : s) {
      if (!std::isfinite(y)) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  };
  extend(c.train);
  extend(c.eval);
  if (x0 > x1) x0 = 0, x1 = 1, y0 = 0, y1 = 1;  // nothing to plot: empty axes
  if (x1 - x0 < 1) x1 = x0 + 1;
  if (y1 - y0 < 1e-6) y0 -= 0.5, y1 += 0.5;
  const double pad = 0.05 * (y1 - y0);
  y0 -= pad, y1 += pad;
  auto xt = nice_ticks(x0, x1, 8), yt = nice_ticks(y0, y1, 6);
  // Widen to the outer ticks so that the curve sits inside labelled gridlines.
  if (!yt.empty()) {
    double ys = yt.size() > 1 ? yt[1] - yt[0] : 1;
    if (yt.front() > y0) yt.insert(yt.begin(), yt.front() - ys);
    if (yt.back() < y1) yt.push_back(yt.back() + ys);
    y0 = yt.front(), y1 = yt.back();
  }
  auto px = [&](double x) { return left + int(std::lround((x - x0) / (x1 - x0) * (pw - 1))); };
  auto py = [&](double y) { return top + int(std::lround((y1 - y) / (y1 - y0) * (ph - 1))); };

  // Grid and tick labels.
  const uint32_t grid = 0xe6e6e6, ink = 0x222222;
  for (double v : yt) {
    int y = py(v);
    draw_line(img, left, y, left + pw - 1, y, grid);
    draw_line(img, left - 6, y, left, y, ink);
    std::string s = tick_label(v, yt.size() > 1 ? yt[1] - yt[0] : 1);
    draw_text(img, left - 10 - text_width(s, scale), y - 7, s, ink, scale);
  }
  double xs = xt.size() > 1 ? xt[1] - xt[0] : 1;
  for (double v : xt) {
    if (v < x0 - 1e-9 || v > x1 + 1e-9) continue;
    int x = px(v);
    draw_line(img, x, top, x, top + ph - 1, grid);
    draw_line(img, x, top + ph, x, top + ph + 6, ink);
    std::string s = tick_label(v, xs);
    draw_text(img, x - text_width(s, scale) / 2, top + ph + 12, s, ink, scale);
  }
  // Axes.
  draw_line(img, left, top, left, top + ph, ink, 2);
  draw_line(img, left, top + ph, left + pw, top + ph, ink, 2);
  draw_text(img, left + pw / 2 - text_width("step", scale) / 2, height - 28, "step", ink, scale);
  draw_text(img, 12, top - 36, "loss", ink, scale);
  draw_text(img, left + pw / 2 - text_width(c.title, scale) / 2, 12, c.title, ink, scale);

  auto polyline = [&](const std::vector<std::pair<double, double>>& s, uint32_t color, int t) {
    bool have = false;
    int lx = 0, ly = 0;
    for (auto& [x, y] : s) {
      if (!std::isfinite(y)) {
        have = false;
        continue;
      }
      int X = px(x), Y = py(y);
      if (have) draw_line(img, lx, ly, X, Y, color, t);
      else fill_rect(img, X - t / 2, Y - t / 2, t, t, color);
      lx = X, ly = Y, have = true;
    }
  };

  struct Legend {
    std::string name;
    uint32_t color;
  };
  std::vector<Legend> legend;
  const uint32_t raw_blue = 0xa6c8e6, blue = 0x1f5fa8, orange = 0xe8710a;
  const bool smooth = c.train.size() >= 20;
  if (smooth) {
    // A centred moving average over ~1/20 of the run (no lag; the window shrinks at the ends).
    std::vector<std::pair<double, double>> pts, avg;
    for (auto& p : c.train)
      if (std::isfinite(p.second)) pts.push_back(p);
    const int64_t n = int64_t(pts.size()), h = std::max<int64_t>(1, n / 40);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = std::min({h, i, n - 1 - i});
      double sum = 0;
      for (int64_t j = i - r; j <= i + r; ++j) sum += pts[size_t(j)].second;
      avg.push_back({pts[size_t(i)].first, sum / double(2 * r + 1)});
    }
    polyline(c.train, raw_blue, 1);
    polyline(avg, blue, 3);
    legend.push_back({"train", raw_blue});
    legend.push_back({"train (smoothed)", blue});
  } else if (!c.train.empty()) {
    polyline(c.train, blue, 3);
    legend.push_back({"train", blue});
  }
  if (!c.eval.empty()) {
    polyline(c.eval, orange, 3);
    for (auto& [x, y] : c.eval)
      if (std::isfinite(y)) fill_rect(img, px(x) - 4, py(y) - 4, 9, 9, orange);
    legend.push_back({"eval", orange});
  }
  // Legend, top right inside the plot area.
  int lw = 0;
  for (auto& l : legend) lw = std::max(lw, text_width(l.name, scale));
  int lx = left + pw - lw - 60, ly = top + 12;
  if (!legend.empty()) {
    fill_rect(img, lx - 10, ly - 8, lw + 66, int(legend.size()) * 24 + 8, 0xffffff);
    for (auto& l : legend) {
      draw_line(img, lx, ly + 7, lx + 30, ly + 7, l.color, 3);
      draw_text(img, lx + 40, ly, l.name, ink, scale);
      ly += 24;
    }
  }
  return img;
}

void write_loss_plot(const std::filesystem::path& png, const LossCurves& c) {
  write_png(png, plot_loss_curves(c));
}

}  // namespace sf
