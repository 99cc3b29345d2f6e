// V-trace (Espeholt et al. 2018, "IMPALA", section 4.1): off-policy value
// targets and policy-gradient advantages for trajectories an actor wrote
// with an older (behaviour) policy mu, corrected towards the learner's
// policy pi by truncated importance ratios.
//
// For one trajectory of T steps, with d_t the discount after step t
// (gamma, 0 where an episode ended: the next observation is a new
// episode's first), rho_t = min(rho_bar, pi/mu), c_t = lambda * min(c_bar, pi/mu):
//   delta_t   = rho_t (r_t + d_t V(x_t+1) - V(x_t))
//   vs_t      = V(x_t) + delta_t + d_t c_t (vs_t+1 - V(x_t+1)),  vs_T = V(x_T)
//   A_t       = min(pg_rho_bar, pi/mu) (r_t + d_t vs_t+1 - V(x_t))
// Computed on the host, backwards in time, in double.
//
//   Vtrace(b, t, log_rhos, rewards, discounts, values, {}, vs.data(), adv.data());
#ifndef TROUPE_AGENTS_VTRACE_H_
#define TROUPE_AGENTS_VTRACE_H_

#include <cstdint>

namespace troupe::agents {

struct VtraceOptions {
  float rho_bar = 1.0f;     // truncates the ratio in delta_t (the fixed point's policy)
  float c_bar = 1.0f;       // truncates the traces c_t (the contraction's speed)
  float pg_rho_bar = 1.0f;  // truncates the ratio in the advantage
  float lambda = 1.0f;      // scales the traces (Retrace's lambda)
};

// `batch` trajectories of `steps` steps, batch-major: log_rhos, rewards and
// discounts [batch, steps] (log pi(a_t|x_t) - log mu(a_t|x_t)), values
// [batch, steps + 1] (V(x_t) under the learner's value function, the last
// the bootstrap). Writes vs and advantages [batch, steps].
void Vtrace(int64_t batch, int64_t steps, const float* log_rhos, const float* rewards, const float* discounts,
            const float* values, const VtraceOptions& options, float* vs, float* advantages);

}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_VTRACE_H_
