// Learning-rate schedules: linear warmup, then constant, cosine or
// exponential decay; and the linear scaling rule for large batches.
#ifndef TROUPE_ENGINE_NN_SCHEDULE_H_
#define TROUPE_ENGINE_NN_SCHEDULE_H_

#include <cstdint>

#include "absl/status/status.h"

namespace troupe::nn {

struct ScheduleOptions {
  enum class Decay { kConstant, kCosine, kExponential };
  float base_lr = 1e-3f;
  int64_t warmup_steps = 0;   // linear from base_lr/warmup to base_lr
  Decay decay = Decay::kConstant;
  int64_t total_steps = 0;    // cosine: steps from end of warmup to the floor
  float final_fraction = 0.0f;  // cosine floor as a fraction of base_lr
  float decay_rate = 0.5f;    // exponential: multiply by this ...
  int64_t decay_steps = 1000;  // ... every decay_steps after warmup (smoothly)
  absl::Status Validate() const;
};

// The learning rate for update number `step` (0-based).
float LearningRate(const ScheduleOptions& options, int64_t step);

// Goyal et al. 2017 ("Accurate, Large Minibatch SGD"): lr scales with batch.
float LinearScalingRule(float base_lr, int64_t base_batch, int64_t batch);

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_SCHEDULE_H_
