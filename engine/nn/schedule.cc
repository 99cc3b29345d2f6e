#include "engine/nn/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/strings/str_cat.h"

namespace troupe::nn {

absl::Status ScheduleOptions::Validate() const {
  if (!(base_lr > 0)) return absl::InvalidArgumentError(absl::StrCat("schedule base_lr ", base_lr, " must be > 0"));
  if (warmup_steps < 0) return absl::InvalidArgumentError(absl::StrCat("schedule warmup_steps ", warmup_steps, " < 0"));
  if (decay == Decay::kCosine && total_steps <= 0) {
    return absl::InvalidArgumentError("schedule: cosine decay needs total_steps > 0");
  }
  if (decay == Decay::kExponential && (decay_steps <= 0 || !(decay_rate > 0 && decay_rate <= 1))) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule: exponential decay needs decay_steps > 0 and decay_rate in (0, 1], got ", decay_steps,
                     " and ", decay_rate));
  }
  return absl::OkStatus();
}

float LearningRate(const ScheduleOptions& o, int64_t step) {
  // Warmup: linear ramp over the first warmup_steps updates.
  if (step < o.warmup_steps) return o.base_lr * static_cast<float>(step + 1) / static_cast<float>(o.warmup_steps);
  const double t = static_cast<double>(step - o.warmup_steps);
  switch (o.decay) {
    case ScheduleOptions::Decay::kConstant:
      return o.base_lr;
    case ScheduleOptions::Decay::kCosine: {
      const double progress = std::min(1.0, t / static_cast<double>(o.total_steps));
      const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
      return static_cast<float>(o.base_lr * (o.final_fraction + (1.0 - o.final_fraction) * cosine));
    }
    case ScheduleOptions::Decay::kExponential:
      return static_cast<float>(o.base_lr * std::pow(o.decay_rate, t / static_cast<double>(o.decay_steps)));
  }
  return o.base_lr;
}

float LinearScalingRule(float base_lr, int64_t base_batch, int64_t batch) {
  return base_lr * static_cast<float>(batch) / static_cast<float>(base_batch);
}

}  // namespace troupe::nn
