#include "launch/experiment.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "actors/actor.h"
#include "actors/evaluator.h"
#include "agents/agents.h"
#include "common/files.h"
#include "common/limits.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "envs/env.h"
#include "envs/env_pool.h"
#include "gan/data.h"
#include "gan/trainer.h"
#include "launch/slurm.h"
#include "learner/rl_learner.h"
#include "replay/replay.h"

namespace troupe::launch {
namespace {

// Where the run directory goes: a directory, or a path that can become one.
absl::Status ValidateRunsDir(const std::string& runs_dir) {
  if (runs_dir.empty()) return absl::InvalidArgumentError("runs_dir: empty; the folder run directories go in");
  std::error_code ec;
  if (std::filesystem::exists(runs_dir, ec) && !std::filesystem::is_directory(runs_dir, ec)) {
    return absl::InvalidArgumentError(absl::StrCat("runs_dir ", runs_dir, ": exists and is not a directory"));
  }
  return absl::OkStatus();
}

// What the env pools of every actor process hold up front: each env's
// observation a few times over (its own, the pool's batch, the stacks).
absl::Status CheckEnvsFit(const envs::EnvSpec& env, const config::ExperimentConfig& config, int processes) {
  const double observation_bytes =
      env.pixel_bytes() > 0 ? static_cast<double>(env.pixel_bytes()) : 4.0 * env.state_size;
  const double bytes = 4.0 * observation_bytes * config.pool().num_envs() * processes;
  return CheckFitsInMemory(absl::StrCat("pool.num_envs ", config.pool().num_envs(), " x ", processes,
                                        " processes with env.render ", env.width, "x", env.height),
                           bytes);
}

// A GAN step's memory, roughly: generator and discriminator activations of
// n_critic + 1 batches of 28x28 images, and the evaluation samples.
absl::Status CheckGanStepFits(const config::GanConfig& gan) {
  const double g = gan.generator_channels(), d = gan.discriminator_channels();
  const double per_image = 784 + gan.noise_size() + g * (2 * 49 + 196) + d * (196 + 2 * 49);
  const double bytes = 4.0 * (6 * per_image * gan.batch_size() * (gan.n_critic() + 1) +
                              (784.0 + 4096) * gan.eval_samples() + 60000.0 * 784 * 3);
  return CheckFitsInMemory(absl::StrCat("gan.batch_size ", gan.batch_size(),
                                        " with gan.generator_channels, discriminator_channels, n_critic, eval_samples"),
                           bytes);
}

}  // namespace

absl::Status ValidateExperiment(const config::ExperimentConfig& config) {
  // Where the run goes: one plain name inside runs_dir.
  RETURN_IF_ERROR(ValidateRunName(config.name()));
  RETURN_IF_ERROR(ValidateRunsDir(config.runs_dir()));
  // The slurm section, whether or not this run goes to Slurm: a bad one is
  // found when it is written, not when a job is submitted.
  RETURN_IF_ERROR(ValidateSlurmConfig(config.slurm()));
  if (config.mode() == config::ExperimentConfig::GAN) {
    RETURN_IF_ERROR(gan::ValidateGanConfig(config.gan()));
    RETURN_IF_ERROR(CheckGanStepFits(config.gan()));
    RETURN_IF_ERROR(gan::CheckGanDataFiles(config.gan().data_dir()));
    return engine::CheckDeviceAvailable(config.gan().engine(), "gan");
  }
  // Envs: scripted and RL runs alike.
  if (config.total_frames() <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("total_frames ", config.total_frames(), ": must be positive"));
  }
  ASSIGN_OR_RETURN(const envs::EnvSpec env, envs::DescribeEnv(config.env()));
  ASSIGN_OR_RETURN(const envs::EnvPoolOptions pool, envs::EnvPoolOptions::FromConfig(config.env(), config.pool()));
  if (config.mode() == config::ExperimentConfig::SCRIPTED) {
    if (pool.batch_size != 0 && pool.batch_size != pool.num_envs) {
      return absl::InvalidArgumentError(absl::StrCat("pool.batch_size ", pool.batch_size,
                                                     ": a scripted run steps the pool in sync mode; leave it 0"));
    }
    return CheckEnvsFit(env, config, /*processes=*/1);
  }
  // RL: actors, evaluator, the agent for this env, the learner, replay.
  RETURN_IF_ERROR(actors::ValidateActorsConfig(config.actors()));
  RETURN_IF_ERROR(actors::ValidateEvaluatorConfig(config.evaluator()));
  RETURN_IF_ERROR(actors::ValidateEvaluationVideoSize(config));
  RETURN_IF_ERROR(CheckEnvsFit(env, config, config.actors().count() + 1));
  const agents::ObservationSpec spec = agents::ObservationSpecOf(env);
  RETURN_IF_ERROR(agents::ValidateAgent(config, spec, env.action_size));
  RETURN_IF_ERROR(learner::ValidateLearnerConfig(config.learner()));
  RETURN_IF_ERROR(agents::ValidateDeviceFrames(config, spec));
  RETURN_IF_ERROR(agents::CheckAgentStepFits(config, spec, env.action_size));
  // The replay section: the learner adds its transitions table when it
  // lists none.
  RETURN_IF_ERROR(replay::ValidateReplayConfig(config.replay(), /*tables_required=*/false));
  return engine::CheckDeviceAvailable(config.learner().engine(), "learner");
}

}  // namespace troupe::launch
