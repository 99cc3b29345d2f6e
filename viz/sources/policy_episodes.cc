#include "viz/sources/policy_episodes.h"

#include "common/status_macros.h"

namespace troupe::viz {

absl::StatusOr<std::unique_ptr<PolicyEpisodes>> PolicyEpisodes::Create(const envs::EnvOptions& options,
                                                                       std::unique_ptr<PolicySource> policy) {
  RETURN_IF_ERROR(options.Validate());
  ASSIGN_OR_RETURN(const envs::TaskInfo* info, envs::FindTask(options.task));
  ASSIGN_OR_RETURN(std::unique_ptr<envs::Environment> env, envs::MakeEnv(options));
  const double step_seconds = env->model()->opt.timestep * info->control_substeps * options.action_repeat;
  return std::unique_ptr<PolicyEpisodes>(new PolicyEpisodes(std::move(env), std::move(policy), step_seconds));
}

PolicyEpisodes::PolicyEpisodes(std::unique_ptr<envs::Environment> env, std::unique_ptr<PolicySource> policy,
                               double step_seconds)
    : env_(std::move(env)), policy_(std::move(policy)), step_seconds_(step_seconds) {
  const envs::EnvSpec& spec = env_->spec();
  state_.resize(spec.state_size);
  pixels_.resize(spec.pixel_bytes());
  last_frame_.resize(size_t(spec.width) * spec.height * 3);
  action_.resize(spec.action_size);
}

SourceStep PolicyEpisodes::Outcome(const envs::TimeStep& step, bool with_action) {
  const envs::EnvSpec& spec = env_->spec();
  SourceStep out;
  out.step_type = step.step_type;
  out.reward = step.reward;
  if (with_action) out.action = action_;
  // The newest frame is the last 3 of each pixel's stacked channels.
  if (spec.channels > 0) {
    const size_t pixels = size_t(spec.width) * spec.height;
    for (size_t i = 0; i < pixels; ++i) {
      const uint8_t* src = pixels_.data() + i * spec.channels + spec.channels - 3;
      std::copy(src, src + 3, last_frame_.data() + 3 * i);
    }
    out.pixels = last_frame_;
    out.pixel_width = spec.width;
    out.pixel_height = spec.height;
  }
  return out;
}

absl::StatusOr<SourceStep> PolicyEpisodes::ApplyReset() {
  ASSIGN_OR_RETURN(envs::TimeStep step, env_->Reset({state_.data(), pixels_.empty() ? nullptr : pixels_.data()}));
  policy_->BeginEpisode();
  return Outcome(step, /*with_action=*/false);
}

absl::Status PolicyEpisodes::PrepareStep() {
  return policy_->Act(*env_, Observation{state_, pixels_}, action_);
}

absl::StatusOr<SourceStep> PolicyEpisodes::ApplyStep() {
  ASSIGN_OR_RETURN(envs::TimeStep step,
                   env_->Step(action_, {state_.data(), pixels_.empty() ? nullptr : pixels_.data()}));
  return Outcome(step, /*with_action=*/true);
}

}  // namespace troupe::viz
