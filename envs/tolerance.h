// Smooth reward shaping, after the tolerance function described with the
// DeepMind Control Suite (Tassa et al. 2018, "DeepMind Control Suite", sec. 3):
// 1 inside [lower, upper], falling off smoothly outside over `margin`.
#ifndef TROUPE_ENVS_TOLERANCE_H_
#define TROUPE_ENVS_TOLERANCE_H_

namespace troupe::envs {

enum class Sigmoid { kGaussian, kLinear, kQuadratic, kLongTail, kReciprocal, kCosine, kTanhSquared, kHyperbolic };

// Returns 1 when lower <= x <= upper. Outside, with d the distance to the
// nearest bound, returns sigmoid(d / margin) scaled so that the value at
// d == margin is `value_at_margin` (in (0, 1); linear/quadratic/cosine reach
// 0 at 1/(1-value_at_margin)-ish and stay there). margin == 0 gives a hard
// 0/1 indicator. Result is always in [0, 1].
double Tolerance(double x, double lower, double upper, double margin = 0.0,
                 Sigmoid sigmoid = Sigmoid::kGaussian, double value_at_margin = 0.1);

}  // namespace troupe::envs

#endif  // TROUPE_ENVS_TOLERANCE_H_
