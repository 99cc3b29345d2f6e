#include "agents/vtrace.h"

#include <algorithm>
#include <cmath>

namespace troupe::agents {

void Vtrace(int64_t batch, int64_t steps, const float* log_rhos, const float* rewards, const float* discounts,
            const float* values, const VtraceOptions& options, float* vs, float* advantages) {
  for (int64_t b = 0; b < batch; ++b) {
    const float* log_rho = log_rhos + b * steps;
    const float* r = rewards + b * steps;
    const float* d = discounts + b * steps;
    const float* v = values + b * (steps + 1);
    float* out_vs = vs + b * steps;
    float* out_adv = advantages + b * steps;
    // vs_t+1 - V(x_t+1), from the end (0 past the bootstrap).
    double correction = 0;
    double next_vs = v[steps];
    for (int64_t t = steps - 1; t >= 0; --t) {
      const double ratio = std::exp(static_cast<double>(log_rho[t]));
      const double rho = std::min<double>(options.rho_bar, ratio);
      const double c = options.lambda * std::min<double>(options.c_bar, ratio);
      const double delta = rho * (r[t] + d[t] * double(v[t + 1]) - v[t]);
      correction = delta + d[t] * c * correction;
      const double vs_t = v[t] + correction;
      out_adv[t] = static_cast<float>(std::min<double>(options.pg_rho_bar, ratio) * (r[t] + d[t] * next_vs - v[t]));
      out_vs[t] = static_cast<float>(vs_t);
      next_vs = vs_t;
    }
  }
}

}  // namespace troupe::agents
