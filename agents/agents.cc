#include "agents/agents.h"

#include "agents/appo_agent.h"
#include "agents/d4pg_agent.h"
#include "agents/random_agent.h"
#include "agents/trajectory.h"
#include "agents/transition.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"

namespace troupe::agents {

absl::StatusOr<std::unique_ptr<Agent>> CreateAgent(const config::ExperimentConfig& config, const ObservationSpec& spec,
                                                   int action_size, replicator::Replicator* replicator) {
  RETURN_IF_ERROR(ValidateAgent(config, spec, action_size));
  if (config.agent() == config::ExperimentConfig::RANDOM) {
    ASSIGN_OR_RETURN(std::unique_ptr<RandomAgent> agent, RandomAgent::Create(config, spec, action_size, replicator));
    return agent;
  }
  if (config.agent() == config::ExperimentConfig::APPO) {
    ASSIGN_OR_RETURN(std::unique_ptr<AppoAgent> agent, AppoAgent::Create(config, spec, action_size, replicator));
    return agent;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<D4pgAgent> agent, D4pgAgent::Create(config, spec, action_size, replicator));
  return agent;
}

config::ReplayTableConfig AgentReplayTable(const config::ExperimentConfig& config, const ObservationSpec& spec,
                                           int action_size) {
  if (config.agent() == config::ExperimentConfig::APPO) return TrajectoryTable(spec, action_size, config);
  return TransitionTable(spec, action_size, config);
}

absl::Status CheckAgentStepFits(const config::ExperimentConfig& config, const ObservationSpec& spec, int action_size) {
  RETURN_IF_ERROR(ValidateAgent(config, spec, action_size));
  if (config.agent() == config::ExperimentConfig::RANDOM) return absl::OkStatus();  // a batch's keys
  if (config.agent() == config::ExperimentConfig::APPO) {
    // The replicas are known before the start unless they are mpirun's ranks.
    const config::EngineConfig& engine = config.learner().engine();
    RETURN_IF_ERROR(CheckAppoEngine(config, engine::InProcessReplicas(engine) ? engine.replicas() : 0));
    return CheckAppoStepFits(config, spec, action_size);
  }
  RETURN_IF_ERROR(CheckD4pgCriticSplits(config, spec));
  RETURN_IF_ERROR(CheckD4pgStateFitsDevice(config, spec, action_size, config.learner().engine().replicas()));
  return CheckD4pgStepFits(config, spec, action_size);
}

}  // namespace troupe::agents
