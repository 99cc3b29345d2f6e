#include "envs/tolerance.h"

#include <cmath>

namespace troupe::envs {
namespace {

// A function of a non-negative distance x (in margins) with value 1 at 0 and
// `v` at 1.
double SigmoidValue(double x, Sigmoid sigmoid, double v) {
  switch (sigmoid) {
    case Sigmoid::kGaussian: {
      const double scale = std::sqrt(-2.0 * std::log(v));
      return std::exp(-0.5 * (x * scale) * (x * scale));
    }
    case Sigmoid::kHyperbolic: {
      const double scale = std::acosh(1.0 / v);
      return 1.0 / std::cosh(x * scale);
    }
    case Sigmoid::kLongTail: {
      const double scale = std::sqrt(1.0 / v - 1.0);
      return 1.0 / ((x * scale) * (x * scale) + 1.0);
    }
    case Sigmoid::kReciprocal: {
      const double scale = 1.0 / v - 1.0;
      return 1.0 / (std::abs(x) * scale + 1.0);
    }
    case Sigmoid::kCosine: {
      const double scale = std::acos(2.0 * v - 1.0) / M_PI;
      const double scaled = x * scale;
      return std::abs(scaled) < 1.0 ? (1.0 + std::cos(M_PI * scaled)) / 2.0 : 0.0;
    }
    case Sigmoid::kLinear: {
      const double scaled = x * (1.0 - v);
      return std::abs(scaled) < 1.0 ? 1.0 - scaled : 0.0;
    }
    case Sigmoid::kQuadratic: {
      const double scaled = x * std::sqrt(1.0 - v);
      return std::abs(scaled) < 1.0 ? 1.0 - scaled * scaled : 0.0;
    }
    case Sigmoid::kTanhSquared: {
      const double scale = std::atanh(std::sqrt(1.0 - v));
      const double t = std::tanh(x * scale);
      return 1.0 - t * t;
    }
  }
  return 0.0;
}

}  // namespace

double Tolerance(double x, double lower, double upper, double margin, Sigmoid sigmoid, double value_at_margin) {
  if (x >= lower && x <= upper) return 1.0;
  if (margin <= 0.0) return 0.0;
  const double distance = (x < lower ? lower - x : x - upper) / margin;
  return SigmoidValue(distance, sigmoid, value_at_margin);
}

}  // namespace troupe::envs
