#include "envs/wrappers.h"

#include <cstring>

#include "common/status_macros.h"

namespace troupe::envs {

ActionRepeat::ActionRepeat(std::unique_ptr<Environment> inner, int repeat)
    : inner_(std::move(inner)), repeat_(repeat), spec_(WrapSpec(inner_->spec(), repeat)) {}

EnvSpec ActionRepeat::WrapSpec(EnvSpec spec, int repeat) {
  TROUPE_CHECK(repeat >= 1);
  spec.episode_steps = (spec.episode_steps + repeat - 1) / repeat;
  spec.action_repeat *= repeat;
  return spec;
}

absl::StatusOr<TimeStep> ActionRepeat::Step(std::span<const float> action, ObservationBuffers out) {
  TimeStep total{StepType::kMid, 0.0f, 1.0f};
  for (int r = 0; r < repeat_; ++r) {
    const bool last_repeat = r == repeat_ - 1;
    ASSIGN_OR_RETURN(TimeStep t, inner_->Step(action, last_repeat ? out : ObservationBuffers{}));
    total.reward += t.reward;
    total.discount *= t.discount;
    if (t.step_type == StepType::kLast) {
      total.step_type = StepType::kLast;
      if (!last_repeat) RETURN_IF_ERROR(inner_->Observe(out));
      break;
    }
  }
  return total;
}

FrameStack::FrameStack(std::unique_ptr<Environment> inner, int k)
    : inner_(std::move(inner)), k_(k), spec_(WrapSpec(inner_->spec(), k)), frame_bytes_(inner_->spec().pixel_bytes()) {
  frames_.resize(frame_bytes_ * k_);
}

EnvSpec FrameStack::WrapSpec(EnvSpec spec, int k) {
  TROUPE_CHECK(k >= 1 && spec.channels == 3);
  spec.channels = 3 * k;
  return spec;
}

void FrameStack::WriteStack(uint8_t* out) const {
  const size_t pixels = size_t(spec_.height) * spec_.width;
  for (int j = 0; j < k_; ++j) {
    const uint8_t* src = frames_.data() + size_t((newest_ + 1 + j) % k_) * frame_bytes_;
    uint8_t* dst = out + 3 * j;
    for (size_t p = 0; p < pixels; ++p) {
      std::memcpy(dst + p * 3 * k_, src + p * 3, 3);
    }
  }
}

absl::StatusOr<TimeStep> FrameStack::Reset(ObservationBuffers out) {
  // The first frame fills the whole stack.
  ASSIGN_OR_RETURN(TimeStep t, inner_->Reset({out.state, frame(0)}));
  for (int i = 1; i < k_; ++i) std::memcpy(frame(i), frame(0), frame_bytes_);
  newest_ = 0;
  if (out.pixels) WriteStack(out.pixels);
  return t;
}

absl::StatusOr<TimeStep> FrameStack::Step(std::span<const float> action, ObservationBuffers out) {
  // Every frame enters the stack, asked for or not, so stacks stay contiguous in time.
  const int slot = (newest_ + 1) % k_;
  ASSIGN_OR_RETURN(TimeStep t, inner_->Step(action, {out.state, frame(slot)}));
  newest_ = slot;
  if (out.pixels) WriteStack(out.pixels);
  return t;
}

absl::Status FrameStack::Observe(ObservationBuffers out) {
  if (out.state) RETURN_IF_ERROR(inner_->Observe({out.state, nullptr}));
  if (out.pixels) WriteStack(out.pixels);
  return absl::OkStatus();
}

}  // namespace troupe::envs
