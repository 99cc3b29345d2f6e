// Wrappers over an Environment: each owns the env it wraps.
#ifndef TROUPE_ENVS_WRAPPERS_H_
#define TROUPE_ENVS_WRAPPERS_H_

#include <memory>
#include <vector>

#include "envs/env.h"

namespace troupe::envs {

// Applies each action `repeat` times and sums the rewards. Only the last
// repeat produces an observation (pixels are rendered once per agent step);
// an episode that ends early is observed where it ended.
class ActionRepeat : public Environment {
 public:
  ActionRepeat(std::unique_ptr<Environment> inner, int repeat);
  // The spec of `inner` wrapped: episode_steps divided by `repeat` (rounded up).
  static EnvSpec WrapSpec(EnvSpec inner, int repeat);

  const EnvSpec& spec() const override { return spec_; }
  absl::StatusOr<TimeStep> Reset(ObservationBuffers out) override { return inner_->Reset(out); }
  absl::StatusOr<TimeStep> Step(std::span<const float> action, ObservationBuffers out) override;
  absl::Status Observe(ObservationBuffers out) override { return inner_->Observe(out); }
  int64_t physics_errors() const override { return inner_->physics_errors(); }
  const mjModel* model() const override { return inner_->model(); }
  const mjData* data() const override { return inner_->data(); }
  const Task& task() const override { return inner_->task(); }

 private:
  std::unique_ptr<Environment> inner_;
  int repeat_;
  EnvSpec spec_;
};

// Stacks the last `k` pixel frames along channels (H x W x 3k, oldest
// first); at the start of an episode the first frame fills every slot.
// State observations pass through unstacked.
class FrameStack : public Environment {
 public:
  FrameStack(std::unique_ptr<Environment> inner, int k);
  // The spec of `inner` (3 pixel channels) wrapped: 3k channels.
  static EnvSpec WrapSpec(EnvSpec inner, int k);

  const EnvSpec& spec() const override { return spec_; }
  absl::StatusOr<TimeStep> Reset(ObservationBuffers out) override;
  absl::StatusOr<TimeStep> Step(std::span<const float> action, ObservationBuffers out) override;
  absl::Status Observe(ObservationBuffers out) override;
  int64_t physics_errors() const override { return inner_->physics_errors(); }
  const mjModel* model() const override { return inner_->model(); }
  const mjData* data() const override { return inner_->data(); }
  const Task& task() const override { return inner_->task(); }

 private:
  // Writes the k frames, oldest first, interleaved per pixel into `out`.
  void WriteStack(uint8_t* out) const;
  uint8_t* frame(int i) { return frames_.data() + size_t(i) * frame_bytes_; }

  std::unique_ptr<Environment> inner_;
  int k_;
  EnvSpec spec_;
  size_t frame_bytes_;
  std::vector<uint8_t> frames_;  // k frames of H x W x 3, a ring
  int newest_ = 0;               // ring index of the newest frame
};

}  // namespace troupe::envs

#endif  // TROUPE_ENVS_WRAPPERS_H_
