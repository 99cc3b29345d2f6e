// The agent registry's acting half: what the parts that act (actors, the
// evaluator, the viewer, Python) and launch's checks get from the agent a
// config names (ExperimentConfig.agent), without naming it. The learning
// half (the agent on the Replicator, its replay table) is agents/agents.h.
// A new agent adds its case to each function here and there, and nothing
// outside agents/ changes.
#ifndef TROUPE_AGENTS_POLICIES_H_
#define TROUPE_AGENTS_POLICIES_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agents/policy.h"
#include "proto/config.pb.h"

namespace troupe::agents {

// The agent's name as logs and titles say it ("D4PG").
std::string AgentName(const config::ExperimentConfig& config);

// InvalidArgument naming the field ("d4pg.atoms 1: must be >= 2") for
// agent settings, an observation spec or an action size the config's agent
// cannot use.
absl::Status ValidateAgent(const config::ExperimentConfig& config, const ObservationSpec& spec, int action_size);

// The config's agent's inference policy with its exploration (config.actors'
// settings), computing on a CPU backend of `num_threads` threads (1: the
// calling thread). Errors: ValidateAgent's.
absl::StatusOr<std::unique_ptr<Policy>> CreatePolicy(const config::ExperimentConfig& config,
                                                     const ObservationSpec& spec, int action_size,
                                                     int num_threads = 1);

// What an actor writes to replay for the agent: transitions over `n_step`
// env steps, their rewards discounted by `discount` (agents/transition.h),
// after actors.random_frames of uniform actions; or trajectories of
// `unroll_length` steps with the behaviour's log-probabilities
// (agents/trajectory.h), discount its gamma, every action the policy's.
struct ReplayItem {
  enum class Kind { kTransitions, kTrajectories };
  Kind kind = Kind::kTransitions;
  int n_step = 1;
  float discount = 0.99f;
  int unroll_length = 0;
};
ReplayItem ActorReplayItem(const config::ExperimentConfig& config);

// The settings that shape the agent's policy, for a message that says which
// policy a run has ("d4pg.hidden [256, 256]").
std::string DescribeArchitecture(const config::ExperimentConfig& config);
// Where a checkpoint trained by a run with config `trained` cannot be
// loaded into `config`'s policy for the agent's own settings (the env's are
// the caller's): one "field: checkpoint A, run B" line per setting that
// differs; empty when none does.
std::vector<std::string> ArchitectureDifferences(const config::ExperimentConfig& trained,
                                                 const config::ExperimentConfig& config);
// What to try when most of the policy's actions sit at the bounds (the
// evaluator's warning): the settings that lead there.
std::string SaturationHint(const config::ExperimentConfig& config);

}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_POLICIES_H_
