#include "launch/experiment.h"

#include "absl/strings/str_cat.h"
#include "actors/actor.h"
#include "actors/evaluator.h"
#include "agents/d4pg_policy.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "envs/env.h"
#include "envs/env_pool.h"
#include "gan/trainer.h"
#include "learner/rl_learner.h"

namespace troupe::launch {

absl::Status ValidateExperiment(const config::ExperimentConfig& config) {
  if (config.mode() == config::ExperimentConfig::GAN) {
    RETURN_IF_ERROR(gan::ValidateGanConfig(config.gan()));
    return engine::CheckDeviceAvailable(config.gan().engine(), "gan");
  }
  // Envs: scripted and RL runs alike.
  if (config.total_frames() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("total_frames ", config.total_frames(), ": must be positive"));
  }
  ASSIGN_OR_RETURN(const envs::EnvSpec env, envs::DescribeEnv(config.env()));
  RETURN_IF_ERROR(envs::EnvPoolOptions::FromConfig(config.env(), config.pool()).status());
  if (config.mode() == config::ExperimentConfig::SCRIPTED) return absl::OkStatus();
  // RL: actors, evaluator, the agent for this env, the learner.
  RETURN_IF_ERROR(actors::ValidateActorsConfig(config.actors()));
  RETURN_IF_ERROR(actors::ValidateEvaluatorConfig(config.evaluator()));
  RETURN_IF_ERROR(agents::ValidateD4pg(config.d4pg(), agents::ObservationSpecOf(env), env.action_size));
  RETURN_IF_ERROR(learner::ValidateLearnerConfig(config.learner()));
  return engine::CheckDeviceAvailable(config.learner().engine(), "learner");
}

}  // namespace troupe::launch
