#include "envs/tolerance.h"

#include <cmath>

#include "gtest/gtest.h"

namespace troupe::envs {
namespace {

TEST(ToleranceTest, IsOneInsideTheBounds) {
  EXPECT_EQ(Tolerance(0.5, /*lower=*/0.0, /*upper=*/1.0, /*margin=*/0.3), 1.0);
  EXPECT_EQ(Tolerance(1.0, /*lower=*/0.0, /*upper=*/1.0, /*margin=*/0.3), 1.0);
}

TEST(ToleranceTest, HardIndicatorWithoutMargin) {
  EXPECT_EQ(Tolerance(1.01, /*lower=*/0.0, /*upper=*/1.0), 0.0);
  EXPECT_EQ(Tolerance(-0.01, /*lower=*/0.0, /*upper=*/1.0), 0.0);
}

TEST(ToleranceTest, EqualsValueAtMarginOneMarginAway) {
  for (Sigmoid s : {Sigmoid::kGaussian, Sigmoid::kLinear, Sigmoid::kQuadratic, Sigmoid::kLongTail,
                    Sigmoid::kReciprocal, Sigmoid::kCosine, Sigmoid::kTanhSquared, Sigmoid::kHyperbolic}) {
    // Above the upper bound and below the lower bound alike.
    EXPECT_NEAR(Tolerance(3.0, 0.0, 1.0, /*margin=*/2.0, s, /*value_at_margin=*/0.25), 0.25, 1e-9) << int(s);
    EXPECT_NEAR(Tolerance(-2.0, 0.0, 1.0, /*margin=*/2.0, s, /*value_at_margin=*/0.25), 0.25, 1e-9) << int(s);
  }
}

TEST(ToleranceTest, FallsMonotonicallyAwayFromTheBounds) {
  for (Sigmoid s : {Sigmoid::kGaussian, Sigmoid::kLinear, Sigmoid::kQuadratic, Sigmoid::kLongTail}) {
    double previous = 1.0;
    for (double x = 1.0; x < 5.0; x += 0.1) {
      const double v = Tolerance(x, 0.0, 1.0, /*margin=*/1.0, s, /*value_at_margin=*/0.1);
      EXPECT_LE(v, previous + 1e-12) << int(s) << " at " << x;
      EXPECT_GE(v, 0.0);
      previous = v;
    }
  }
}

TEST(ToleranceTest, LinearReachesZeroAndStays) {
  // value_at_margin 0: linear hits 0 at exactly one margin.
  EXPECT_NEAR(Tolerance(1.5, 0.0, 1.0, /*margin=*/1.0, Sigmoid::kLinear, /*value_at_margin=*/0.0), 0.5, 1e-12);
  EXPECT_EQ(Tolerance(2.5, 0.0, 1.0, /*margin=*/1.0, Sigmoid::kLinear, /*value_at_margin=*/0.0), 0.0);
}

}  // namespace
}  // namespace troupe::envs
