#include "common/plot.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

namespace troupe {
namespace {

// 5x7 glyphs: 7 rows, the low 5 bits of each row, bit 4 = leftmost column.
struct Glyph {
  char c;
  uint8_t rows[7];
};
constexpr Glyph kFont[] = {
    {'0', {14, 17, 19, 21, 25, 17, 14}}, {'1', {4, 12, 4, 4, 4, 4, 14}},    {'2', {14, 17, 1, 2, 4, 8, 31}},
    {'3', {31, 2, 4, 2, 1, 17, 14}},     {'4', {2, 6, 10, 18, 31, 2, 2}},   {'5', {31, 16, 30, 1, 1, 17, 14}},
    {'6', {6, 8, 16, 30, 17, 17, 14}},   {'7', {31, 1, 2, 4, 8, 8, 8}},     {'8', {14, 17, 17, 14, 17, 17, 14}},
    {'9', {14, 17, 17, 15, 1, 2, 12}},   {'A', {14, 17, 17, 31, 17, 17, 17}}, {'B', {30, 17, 17, 30, 17, 17, 30}},
    {'C', {14, 17, 16, 16, 16, 17, 14}}, {'D', {28, 18, 17, 17, 17, 18, 28}}, {'E', {31, 16, 16, 30, 16, 16, 31}},
    {'F', {31, 16, 16, 30, 16, 16, 16}}, {'G', {14, 17, 16, 23, 17, 17, 15}}, {'H', {17, 17, 17, 31, 17, 17, 17}},
    {'I', {14, 4, 4, 4, 4, 4, 14}},      {'J', {7, 2, 2, 2, 2, 18, 12}},    {'K', {17, 18, 20, 24, 20, 18, 17}},
    {'L', {16, 16, 16, 16, 16, 16, 31}}, {'M', {17, 27, 21, 21, 17, 17, 17}}, {'N', {17, 17, 25, 21, 19, 17, 17}},
    {'O', {14, 17, 17, 17, 17, 17, 14}}, {'P', {30, 17, 17, 30, 16, 16, 16}}, {'Q', {14, 17, 17, 17, 21, 18, 13}},
    {'R', {30, 17, 17, 30, 20, 18, 17}}, {'S', {15, 16, 16, 14, 1, 1, 30}}, {'T', {31, 4, 4, 4, 4, 4, 4}},
    {'U', {17, 17, 17, 17, 17, 17, 14}}, {'V', {17, 17, 17, 17, 17, 10, 4}}, {'W', {17, 17, 17, 21, 21, 21, 10}},
    {'X', {17, 17, 10, 4, 10, 17, 17}},  {'Y', {17, 17, 10, 4, 4, 4, 4}},   {'Z', {31, 1, 2, 4, 8, 16, 31}},
    {'.', {0, 0, 0, 0, 0, 12, 12}},      {',', {0, 0, 0, 0, 12, 4, 8}},     {'-', {0, 0, 0, 31, 0, 0, 0}},
    {'+', {0, 4, 4, 31, 4, 4, 0}},       {':', {0, 12, 12, 0, 12, 12, 0}},  {'/', {0, 1, 2, 4, 8, 16, 0}},
    {'(', {2, 4, 8, 8, 8, 4, 2}},        {')', {8, 4, 2, 2, 2, 4, 8}},      {'=', {0, 0, 31, 0, 31, 0, 0}},
    {'%', {24, 25, 2, 4, 8, 19, 3}},     {'_', {0, 0, 0, 0, 0, 0, 31}},     {'x', {0, 17, 10, 4, 10, 17, 0}},
    {'[', {14, 8, 8, 8, 8, 8, 14}},      {']', {14, 2, 2, 2, 2, 2, 14}},    {'|', {4, 4, 4, 4, 4, 4, 4}},
    {'<', {2, 4, 8, 16, 8, 4, 2}},       {'>', {8, 4, 2, 1, 2, 4, 8}},      {'?', {14, 17, 1, 2, 4, 0, 4}},
};

const uint8_t* GlyphRows(char c) {
  if (c != 'x') c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const Glyph& g : kFont) {
    if (g.c == c) return g.rows;
  }
  return nullptr;  // space and unknown characters draw nothing
}

void SetPixel(Image& image, int x, int y, std::array<uint8_t, 3> color) {
  if (x < 0 || y < 0 || x >= image.width || y >= image.height) return;
  uint8_t* p = image.at(x, y);
  for (int c = 0; c < std::min(3, image.channels); ++c) p[c] = color[c];
}

// Bresenham's line.
void DrawLine(Image& image, int x0, int y0, int x1, int y1, std::array<uint8_t, 3> color) {
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
  const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  int error = dx + dy;
  for (;;) {
    SetPixel(image, x0, y0, color);
    if (x0 == x1 && y0 == y1) return;
    const int e2 = 2 * error;
    if (e2 >= dy) {
      error += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      error += dx;
      y0 += sy;
    }
  }
}

// A tick label: short, e.g. 1.2M, 350k, 0.25.
std::string FormatTick(double v) {
  char buffer[32];
  const double a = std::abs(v);
  if (a >= 1e6) {
    std::snprintf(buffer, sizeof(buffer), "%gM", std::round(v / 1e5) / 10);
  } else if (a >= 1e4) {
    std::snprintf(buffer, sizeof(buffer), "%gk", std::round(v / 1e2) / 10);
  } else {
    std::snprintf(buffer, sizeof(buffer), "%.4g", v);
  }
  return buffer;
}

// "Nice" tick spacing: 1, 2 or 5 times a power of ten, about `count` ticks.
double TickStep(double range, int count) {
  const double raw = range / count;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * power >= raw) return m * power;
  }
  return 10 * power;
}

}  // namespace

void DrawText(Image& image, int x, int y, const std::string& text, std::array<uint8_t, 3> color, int scale) {
  for (size_t i = 0; i < text.size(); ++i) {
    const uint8_t* rows = GlyphRows(text[i]);
    if (!rows) continue;
    for (int r = 0; r < 7; ++r) {
      for (int col = 0; col < 5; ++col) {
        if (!(rows[r] & (16 >> col))) continue;
        for (int sy = 0; sy < scale; ++sy) {
          for (int sx = 0; sx < scale; ++sx) {
            SetPixel(image, x + int(i) * 6 * scale + col * scale + sx, y + r * scale + sy, color);
          }
        }
      }
    }
  }
}

Image PlotLines(const std::vector<PlotSeries>& series, const PlotOptions& options) {
  Image image(options.width, options.height, 3);
  std::fill(image.pixels.begin(), image.pixels.end(), 255);
  const std::array<uint8_t, 3> black = {0, 0, 0}, grey = {225, 225, 225};
  const int left = 60, right = options.width - 15, top = 30, bottom = options.height - 40;

  // The data's extent (finite points only), padded a little vertically.
  double x_min = INFINITY, x_max = -INFINITY, y_min = INFINITY, y_max = -INFINITY;
  for (const auto& s : series) {
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
      x_min = std::min(x_min, s.x[i]);
      x_max = std::max(x_max, s.x[i]);
      y_min = std::min(y_min, s.y[i]);
      y_max = std::max(y_max, s.y[i]);
    }
  }
  if (!std::isfinite(x_min)) x_min = 0, x_max = 1, y_min = 0, y_max = 1;
  if (x_max - x_min < 1e-12) x_max = x_min + 1;
  if (y_max - y_min < 1e-12) y_max = y_min + 1;
  const double pad = 0.05 * (y_max - y_min);
  y_min -= pad;
  y_max += pad;
  auto px = [&](double x) { return left + int(std::lround((x - x_min) / (x_max - x_min) * (right - left))); };
  auto py = [&](double y) { return bottom - int(std::lround((y - y_min) / (y_max - y_min) * (bottom - top))); };

  // Grid, ticks and their labels.
  const double x_step = TickStep(x_max - x_min, 6), y_step = TickStep(y_max - y_min, 5);
  for (double t = std::ceil(x_min / x_step) * x_step; t <= x_max + 1e-9 * x_step; t += x_step) {
    DrawLine(image, px(t), top, px(t), bottom, grey);
    const std::string label = FormatTick(t);
    DrawText(image, px(t) - int(label.size()) * 3, bottom + 6, label, black);
  }
  for (double t = std::ceil(y_min / y_step) * y_step; t <= y_max + 1e-9 * y_step; t += y_step) {
    DrawLine(image, left, py(t), right, py(t), grey);
    const std::string label = FormatTick(t);
    DrawText(image, left - 6 - int(label.size()) * 6, py(t) - 3, label, black);
  }
  DrawLine(image, left, bottom, right, bottom, black);
  DrawLine(image, left, top, left, bottom, black);

  // The series, then the title, axis labels and legend.
  for (const auto& s : series) {
    int last_x = 0, last_y = 0;
    bool have_last = false;
    for (size_t i = 0; i < std::min(s.x.size(), s.y.size()); ++i) {
      if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) {
        have_last = false;
        continue;
      }
      const int x = px(s.x[i]), y = py(s.y[i]);
      if (have_last) {
        DrawLine(image, last_x, last_y, x, y, s.color);
        DrawLine(image, last_x, last_y + 1, x, y + 1, s.color);
      } else {
        SetPixel(image, x, y, s.color);
      }
      last_x = x, last_y = y, have_last = true;
    }
  }
  DrawText(image, left, 4, options.title, black, 2);
  DrawText(image, (left + right) / 2 - int(options.x_label.size()) * 3, options.height - 16, options.x_label, black);
  DrawText(image, 4, top - 10, options.y_label, black);
  int legend_y = top + 6;
  for (const auto& s : series) {
    if (s.label.empty()) continue;
    const int x = right - 10 - int(s.label.size()) * 6 - 16;
    DrawLine(image, x, legend_y + 3, x + 12, legend_y + 3, s.color);
    DrawLine(image, x, legend_y + 4, x + 12, legend_y + 4, s.color);
    DrawText(image, x + 16, legend_y, s.label, black);
    legend_y += 12;
  }
  return image;
}

}  // namespace troupe
