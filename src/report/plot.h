// The loss-curve plot written next to metrics.jsonl: training loss (raw, and smoothed when
// there are many steps) and evaluation loss against the step, with axes, grid, tick labels
// and a legend, drawn with a built-in 5x7 bitmap font (with descenders) into an RgbImage
// (report/png.h).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "report/png.h"

namespace sf {

struct LossCurves {
  std::vector<std::pair<double, double>> train;  // (step, loss)
  std::vector<std::pair<double, double>> eval;   // (step, loss)
  std::string title = "loss";
};

RgbImage plot_loss_curves(const LossCurves& c, int width = 960, int height = 540);
void write_loss_plot(const std::filesystem::path& png, const LossCurves& c);

// Text drawing (exposed for tests): draws `text` with its top-left corner at (x, y), each
// font pixel a scale x scale square. Characters without a glyph draw as a box.
void draw_text(RgbImage& img, int x, int y, const std::string& text, uint32_t color,
               int scale = 1);
int text_width(const std::string& text, int scale = 1);

// "Nice" tick positions (1, 2 or 5 times a power of ten) covering [lo, hi], about `target`
// of them.
std::vector<double> nice_ticks(double lo, double hi, int target = 6);

}  // namespace sf
