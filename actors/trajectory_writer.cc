#include "actors/trajectory_writer.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agents/trajectory.h"
#include "common/status_macros.h"

namespace troupe::actors {

TrajectoryWriter::TrajectoryWriter(replay::Writer* writer, int num_envs, const replay::Signature& signature,
                                   float discount)
    : writer_(writer), discount_(discount), envs_(num_envs) {
  const std::vector<replay::FieldSpec>& fields = signature.fields;
  TROUPE_CHECK(fields.size() == agents::kNumTrajectoryFields);
  length_ = fields[agents::kTrajectoryAction].shape[0];
  action_size_ = fields[agents::kTrajectoryAction].shape[1];
  const replay::FieldSpec& observation = fields[agents::kTrajectoryObservation];
  if (observation.frames > 0) {
    stack_ = observation.frames / (length_ + 1);
    frame_shape_ = observation.shape;
    TROUPE_CHECK(stack_ >= 1 && stack_ * (length_ + 1) == observation.frames);
  } else {
    state_size_ = observation.shape[1];
  }
  for (EnvState& env : envs_) {
    env.observation.resize((length_ + 1) * state_size_);
    env.frames.resize((length_ + 1) * stack_);
    env.action.resize(length_ * action_size_);
    env.reward.resize(length_);
    env.discount.resize(length_);
    env.log_prob.resize(length_);
  }
  for (const replay::FieldSpec& field : fields) {
    values_.push_back(field.frames > 0 ? replay::FieldValue::Frames({})
                                       : replay::FieldValue::Dense(field.dtype, field.shape, nullptr));
  }
}

absl::Status TrajectoryWriter::Observe(EnvState& env, int64_t index, const float* state, const uint8_t* frame,
                                       bool first) {
  if (stack_ == 0) {
    std::copy_n(state, state_size_, env.observation.data() + index * state_size_);
    return absl::OkStatus();
  }
  // The previous observation's stack is the one before this one's.
  uint64_t* stack = env.frames.data() + index * stack_;
  return StackNewFrame(*writer_, frame, frame_shape_, first ? nullptr : stack - stack_, first,
                       {stack, static_cast<size_t>(stack_)});
}

absl::Status TrajectoryWriter::Start(int env_index, const float* state, const uint8_t* frame) {
  EnvState& env = envs_[env_index];
  // The episode's first observation: where the trajectory goes on (after its
  // last episode's end) or begins.
  RETURN_IF_ERROR(Observe(env, env.steps, state, frame, /*first=*/true));
  env.started = true;
  return absl::OkStatus();
}

absl::Status TrajectoryWriter::Step(int env_index, const ActorStep& step) {
  EnvState& env = envs_[env_index];
  if (!env.started) {
    return absl::FailedPreconditionError(absl::StrCat("TrajectoryWriter: env ", env_index, " stepped before Start"));
  }
  const int64_t t = env.steps;
  if (t == 0 || step.policy_version < env.version) env.version = step.policy_version;
  std::copy_n(step.action, action_size_, &env.action[t * action_size_]);
  // The bootstrap at an episode's end: nothing at a true terminal (the env's discount 0).
  env.reward[t] = step.reward + (step.last ? discount_ * step.discount * step.bootstrap_value : 0.0f);
  env.discount[t] = step.last ? 0.0f : discount_ * step.discount;
  env.log_prob[t] = step.log_prob;
  RETURN_IF_ERROR(Observe(env, t + 1, step.state, step.frame, /*first=*/false));
  env.steps = t + 1;
  if (step.last) env.started = false;  // the next episode's Start comes first
  if (env.steps < length_) return absl::OkStatus();

  // A whole trajectory: inserted, and its last observation the next one's first.
  if (stack_ > 0) {
    values_[agents::kTrajectoryObservation].frame_keys.assign(env.frames.begin(), env.frames.end());
  } else {
    values_[agents::kTrajectoryObservation].data = env.observation.data();
  }
  values_[agents::kTrajectoryAction].data = env.action.data();
  values_[agents::kTrajectoryReward].data = env.reward.data();
  values_[agents::kTrajectoryDiscount].data = env.discount.data();
  values_[agents::kTrajectoryLogProb].data = env.log_prob.data();
  values_[agents::kTrajectoryVersion].data = &env.version;
  const int64_t queued = writer_->items_queued();
  const absl::Status status = writer_->Insert(agents::kTrajectoryTable, /*priority=*/1.0, values_);
  env.steps = 0;
  // (One of the two is empty: state or pixels.)
  std::copy_n(env.observation.data() + length_ * state_size_, state_size_, env.observation.data());
  std::copy_n(env.frames.data() + length_ * stack_, stack_, env.frames.data());
  // Not queued: a bad item; queued but not sent: the writer keeps it.
  if (writer_->items_queued() == queued) return status;
  ++inserted_;
  return status;
}

void TrajectoryWriter::Clear() {
  for (EnvState& env : envs_) {
    env.steps = 0;
    env.started = false;
  }
}

}  // namespace troupe::actors
