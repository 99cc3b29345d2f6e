#include "viz/policies/scripted.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace troupe::viz {

std::string ScriptedPolicy::Describe() const {
  switch (kind_) {
    case config::ScriptedPolicyConfig::CONTROLLER:
      return has_controller_ ? "controller (scripted)" : "random (task has no controller)";
    case config::ScriptedPolicyConfig::ZERO:
      return "zero actions";
    case config::ScriptedPolicyConfig::RANDOM:
      return "random actions";
  }
  return "";
}

absl::Status ScriptedPolicy::Act(const envs::Environment& env, const Observation& observation,
                                 std::span<float> action) {
  const envs::EnvSpec& spec = env.spec();
  // The task's controller, where asked for and where it has one.
  if (kind_ == config::ScriptedPolicyConfig::CONTROLLER && has_controller_) {
    command_.assign(spec.action_size, 0.0);
    if (env.task().Controller(env.model(), env.data(), command_.data())) {
      for (int i = 0; i < spec.action_size; ++i) action[i] = float(command_[i]);
      return absl::OkStatus();
    }
    has_controller_ = false;
  }
  // Zero, or uniform inside the spec (unbounded dimensions in [-1, 1]).
  for (int i = 0; i < spec.action_size; ++i) {
    if (kind_ == config::ScriptedPolicyConfig::ZERO) {
      action[i] = 0.0f;
      continue;
    }
    const float low = std::isfinite(spec.action_minimum[i]) ? spec.action_minimum[i] : -1.0f;
    const float high = std::isfinite(spec.action_maximum[i]) ? spec.action_maximum[i] : 1.0f;
    action[i] = std::uniform_real_distribution<float>(low, high)(rng_);
  }
  return absl::OkStatus();
}

}  // namespace troupe::viz
