#include "common/plot.h"

#include "gtest/gtest.h"

namespace troupe {
namespace {

int CountColor(const Image& image, std::array<uint8_t, 3> color) {
  int n = 0;
  for (int y = 0; y < image.height; ++y) {
    for (int x = 0; x < image.width; ++x) {
      const uint8_t* p = image.at(x, y);
      n += p[0] == color[0] && p[1] == color[1] && p[2] == color[2];
    }
  }
  return n;
}

TEST(PlotTest, RisingSeriesIsDrawnFromLowerLeftToUpperRight) {
  PlotSeries s{"return", {0, 1, 2, 3}, {0, 10, 20, 30}, {200, 0, 0}};
  Image image = PlotLines({s}, PlotOptions{/*width=*/300, /*height=*/200, "curve", "frames", "return"});
  ASSERT_EQ(image.width, 300);
  ASSERT_EQ(image.height, 200);
  // The line's leftmost red pixel is lower (larger y) than its rightmost.
  int left_x = 1 << 30, left_y = 0, right_x = -1, right_y = 0;
  for (int y = 0; y < image.height; ++y) {
    for (int x = 0; x < image.width - 60; ++x) {  // the legend sits at the right
      const uint8_t* p = image.at(x, y);
      if (p[0] == 200 && p[1] == 0 && p[2] == 0) {
        if (x < left_x) left_x = x, left_y = y;
        if (x > right_x) right_x = x, right_y = y;
      }
    }
  }
  ASSERT_GE(right_x, 0) << "no line drawn";
  EXPECT_GT(left_y, right_y + 50);
  EXPECT_GT(right_x - left_x, 150);
}

TEST(PlotTest, NonFinitePointsAreSkippedAndTextIsDrawn) {
  PlotSeries s{"", {0, 1, 2}, {1, NAN, 3}, {0, 0, 255}};
  Image with_title = PlotLines({s}, PlotOptions{200, 150, "FID", "", ""});
  Image without = PlotLines({s}, PlotOptions{200, 150, "", "", ""});
  EXPECT_GT(CountColor(with_title, {0, 0, 0}), CountColor(without, {0, 0, 0}));
  EXPECT_GT(CountColor(with_title, {0, 0, 255}), 0);
}

TEST(PlotTest, EmptyInputDrawsAxesOnly) {
  Image image = PlotLines({}, PlotOptions{120, 80, "", "", ""});
  EXPECT_GT(CountColor(image, {0, 0, 0}), 100);
}

}  // namespace
}  // namespace troupe
