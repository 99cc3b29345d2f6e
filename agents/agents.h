// The agent registry's learning half: what the learner and launch's checks
// get from the agent a config names (ExperimentConfig.agent), without
// naming it. The acting half (policies, what actors write) is
// agents/policies.h.
#ifndef TROUPE_AGENTS_AGENTS_H_
#define TROUPE_AGENTS_AGENTS_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agents/agent.h"
#include "agents/policies.h"
#include "engine/replicator/replicator.h"
#include "proto/config.pb.h"

namespace troupe::agents {

// The config's agent on every local replica of `replicator` (which must
// outlive it), identically initialised from learner.engine.seed. Errors:
// ValidateAgent's; InvalidArgument for a batch the replicas cannot share.
absl::StatusOr<std::unique_ptr<Agent>> CreateAgent(const config::ExperimentConfig& config, const ObservationSpec& spec,
                                                   int action_size, replicator::Replicator* replicator);

// The replay table the agent's actors fill and its learner samples, when
// the config's replay section lists none: its item's signature, size,
// selector, sampling limits and rate limiter from the learner section.
config::ReplayTableConfig AgentReplayTable(const config::ExperimentConfig& config, const ObservationSpec& spec,
                                           int action_size);

// The learner's memory for the agent's step at the config's batch and
// replicas against this machine's, before anything starts:
// InvalidArgument naming the settings that ask for too much.
absl::Status CheckAgentStepFits(const config::ExperimentConfig& config, const ObservationSpec& spec, int action_size);

}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_AGENTS_H_
