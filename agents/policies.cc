#include "agents/policies.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agents/appo_policy.h"
#include "agents/d4pg_policy.h"
#include "agents/random_policy.h"
#include "common/status_macros.h"

namespace troupe::agents {

ObservationSpec ObservationSpecOf(const envs::EnvSpec& spec) {
  ObservationSpec observation;
  if (spec.channels > 0) {
    observation.frames = spec.channels / 3;
    observation.height = spec.height;
    observation.width = spec.width;
  } else {
    observation.state_size = spec.state_size;
  }
  return observation;
}

absl::Status CheckObservationAndActions(const ObservationSpec& spec, int action_size) {
  if (spec.pixels() == (spec.state_size > 0)) {
    return absl::InvalidArgumentError(absl::StrCat("observation spec: set exactly one of state_size (", spec.state_size,
                                                   ") and frames (", spec.frames, ")"));
  }
  if (action_size < 1) return absl::InvalidArgumentError(absl::StrCat("action_size ", action_size, " must be >= 1"));
  return absl::OkStatus();
}

absl::Status CheckActInputs(const ObservationSpec& spec, const float* state, const uint8_t* pixels, int batch) {
  if (batch < 1) return absl::InvalidArgumentError(absl::StrCat("policy Act: batch ", batch, " must be >= 1"));
  if (spec.pixels() ? pixels == nullptr : state == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy Act: this policy observes ", spec.pixels() ? "pixels" : "state", " but got null"));
  }
  return absl::OkStatus();
}

std::string AgentName(const config::ExperimentConfig& config) {
  switch (config.agent()) {
    case config::ExperimentConfig::D4PG:
      return "D4PG";
    case config::ExperimentConfig::RANDOM:
      return "RANDOM";
    case config::ExperimentConfig::APPO:
      return "APPO";
  }
  return config::ExperimentConfig::Agent_Name(config.agent());
}

absl::Status ValidateAgent(const config::ExperimentConfig& config, const ObservationSpec& spec, int action_size) {
  switch (config.agent()) {
    case config::ExperimentConfig::D4PG:
      return ValidateD4pg(config.d4pg(), spec, action_size);
    case config::ExperimentConfig::RANDOM:
      return CheckObservationAndActions(spec, action_size);
    case config::ExperimentConfig::APPO:
      return ValidateAppo(config.appo(), spec, action_size);
  }
  return absl::InvalidArgumentError(absl::StrCat("agent ", int(config.agent()), ": no such agent"));
}

absl::StatusOr<std::unique_ptr<Policy>> CreatePolicy(const config::ExperimentConfig& config,
                                                     const ObservationSpec& spec, int action_size, int num_threads) {
  RETURN_IF_ERROR(ValidateAgent(config, spec, action_size));
  if (config.agent() == config::ExperimentConfig::RANDOM) {
    return std::make_unique<RandomPolicy>(spec, action_size, config.env().seed());
  }
  if (config.agent() == config::ExperimentConfig::APPO) {
    ASSIGN_OR_RETURN(std::unique_ptr<AppoPolicy> policy, AppoPolicy::Create(config.appo(), spec, action_size, num_threads));
    return policy;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<D4pgPolicy> policy,
                   D4pgPolicy::Create(config.d4pg(), spec, action_size, num_threads));
  policy->SetExploration(config.actors());
  return policy;
}

ReplayItem ActorReplayItem(const config::ExperimentConfig& config) {
  if (config.agent() == config::ExperimentConfig::RANDOM) return {};
  if (config.agent() == config::ExperimentConfig::APPO) {
    return {.kind = ReplayItem::Kind::kTrajectories,
            .discount = config.appo().discount(),
            .unroll_length = config.appo().unroll_length()};
  }
  return {.n_step = config.d4pg().n_step(), .discount = config.d4pg().discount()};
}

std::string DescribeArchitecture(const config::ExperimentConfig& config) {
  if (config.agent() == config::ExperimentConfig::RANDOM) return "agent RANDOM";
  if (config.agent() == config::ExperimentConfig::APPO) {
    return absl::StrCat("appo.hidden [", absl::StrJoin(config.appo().hidden(), ", "), "]");
  }
  return absl::StrCat("d4pg.hidden [", absl::StrJoin(config.d4pg().hidden(), ", "), "]");
}

std::vector<std::string> ArchitectureDifferences(const config::ExperimentConfig& trained,
                                                 const config::ExperimentConfig& config) {
  std::vector<std::string> differences;
  auto compare = [&](const std::string& field, const std::string& checkpoint, const std::string& run) {
    if (checkpoint != run) differences.push_back(absl::StrCat(field, ": checkpoint ", checkpoint, ", run ", run));
  };
  auto list = [](const auto& values) { return absl::StrCat("[", absl::StrJoin(values, ", "), "]"); };
  compare("agent", AgentName(trained), AgentName(config));
  if (trained.agent() != config.agent()) return differences;
  if (config.agent() == config::ExperimentConfig::APPO) {
    compare("appo.hidden", list(trained.appo().hidden()), list(config.appo().hidden()));
    return differences;
  }
  if (config.agent() != config::ExperimentConfig::D4PG) return differences;
  const config::D4pgConfig& a = trained.d4pg();
  const config::D4pgConfig& b = config.d4pg();
  if (trained.env().observation() == config::EnvConfig::PIXELS && config.env().observation() == config::EnvConfig::PIXELS) {
    compare("d4pg.encoder_features", absl::StrCat(a.encoder_features()), absl::StrCat(b.encoder_features()));
    compare("d4pg.conv_channels", absl::StrCat(a.conv_channels()), absl::StrCat(b.conv_channels()));
  }
  compare("d4pg.hidden", list(a.hidden()), list(b.hidden()));
  compare("d4pg.atoms", absl::StrCat(a.atoms()), absl::StrCat(b.atoms()));
  return differences;
}

std::string SaturationHint(const config::ExperimentConfig& config) {
  if (config.agent() == config::ExperimentConfig::RANDOM) return "a uniform random policy's draws";
  if (config.agent() == config::ExperimentConfig::APPO) return "try a lower appo.learning_rate or appo.initial_log_std";
  return "try a lower d4pg.actor_learning_rate or wider early noise, actors.noise_decay_frames";
}

}  // namespace troupe::agents
