// Line plots as images (learning curves, FID curves), drawn with a built-in
// 5x7 bitmap font so they need no font files. Lowercase letters are drawn
// as capitals.
#ifndef TROUPE_COMMON_PLOT_H_
#define TROUPE_COMMON_PLOT_H_

#include <array>
#include <string>
#include <vector>

#include "common/image.h"

namespace troupe {

struct PlotSeries {
  std::string label;
  std::vector<double> x;
  std::vector<double> y;
  std::array<uint8_t, 3> color = {31, 119, 180};
};

struct PlotOptions {
  int width = 640;
  int height = 400;
  std::string title;
  std::string x_label;
  std::string y_label;
};

// Draws the series (points joined by lines) on axes that fit every finite
// point, with tick labels, a title and a legend. Empty series draw empty axes.
Image PlotLines(const std::vector<PlotSeries>& series, const PlotOptions& options);

// Draws `text` with its top-left corner at (x, y), `scale` pixels per font
// pixel, clipped to the image.
void DrawText(Image& image, int x, int y, const std::string& text, std::array<uint8_t, 3> color, int scale = 1);

}  // namespace troupe

#endif  // TROUPE_COMMON_PLOT_H_
