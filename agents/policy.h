// What every agent's inference policy gives the parts that act: actors (with
// the agent's own exploration), the evaluator, the viewer and Python (its
// deterministic actions). They hold a Policy made by agents::CreatePolicy
// (agents/policies.h) for the config's agent and never name an algorithm.
//
//   ASSIGN_OR_RETURN(envs::EnvSpec env, envs::DescribeEnv(config.env()));
//   ASSIGN_OR_RETURN(auto policy, agents::CreatePolicy(config, ObservationSpecOf(env), env.action_size));
//   policy->SetParameters(params);                        // the learner's newest
//   policy->Act(state, /*pixels=*/nullptr, batch, actions);  // evaluation
//   policy->Explore(state, nullptr, batch, {.actor = 3, .frames = f}, rng, actions, nullptr);  // an actor
//
// Threads: a policy is not thread-safe (one per thread).
#ifndef TROUPE_AGENTS_POLICY_H_
#define TROUPE_AGENTS_POLICY_H_

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "envs/env.h"

namespace troupe::agents {

// What the agent observes: a state vector of `state_size` floats, or a stack
// of `frames` RGB frames of height x width (3 channels per frame, uint8).
// Exactly one of the two is set.
struct ObservationSpec {
  int state_size = 0;
  int frames = 0, height = 0, width = 0;
  bool pixels() const { return frames > 0; }
};

// What the agent observes of an env with `spec`: its pixels (a stack of
// spec.channels / 3 frames) when it renders them, else its state vector.
ObservationSpec ObservationSpecOf(const envs::EnvSpec& spec);

// What every agent's validation checks first: one kind of observation (a
// state vector or a pixel stack), and at least one action dimension.
absl::Status CheckObservationAndActions(const ObservationSpec& spec, int action_size);

// What every Policy::Act and Explore checks first: a batch of at least one,
// and the observation the spec says given (pixels or state, not null).
absl::Status CheckActInputs(const ObservationSpec& spec, const float* state, const uint8_t* pixels, int batch);

// Where an actor stands in its exploration: which of the actors it is and
// how many env frames it has stepped. An agent's exploration may depend on
// both (D4PG spreads its noise across actors and decays it early on).
struct ExplorationPoint {
  int actor = 0;
  int64_t frames = 0;
};

class Policy {
 public:
  virtual ~Policy() = default;

  // Floats SetParameters expects.
  virtual int64_t num_parameters() const = 0;
  // Replaces every weight with the learner's flat parameters (what
  // Agent::PolicyParameters writes). InvalidArgument "policy parameters:
  // got N floats, expected M" when the size differs.
  virtual absl::Status SetParameters(std::span<const float> parameters) = 0;
  // The current flat parameters, as SetParameters takes them.
  virtual std::vector<float> DownloadParameters() const = 0;
  // Sets the parameters from the agent's checkpoint file (Agent::Save),
  // reading only what the policy needs; returns the update count stored
  // there. Errors: NotFound and DataLoss (corrupt, truncated) naming the
  // path; InvalidArgument naming the first entry the file lacks or holds in
  // another shape (a checkpoint of another task, architecture or agent).
  // The policy is unchanged on error.
  virtual absl::StatusOr<int64_t> LoadAgentCheckpoint(const std::string& path) = 0;

  // The actions the evaluator scores (no exploration: a deterministic
  // policy's own; the uniform random policy's draws) in [-1, 1]: from `state` float
  // [batch, S] (pixels null) or from `pixels` uint8 [batch, k, H, W, 3]
  // (replay's layout; state null). Writes actions [batch, A].
  // InvalidArgument for a missing input or batch < 1.
  virtual absl::Status Act(const float* state, const uint8_t* pixels, int batch, float* actions) = 0;
  // The actions an actor at `at` takes: Act's with the agent's exploration,
  // drawn from `rng`, still in [-1, 1]. With `log_probs` (actors of an agent
  // whose items carry the behaviour's probabilities: trajectories) also
  // each row's log-density under that exploration, [batch] (of the
  // agent's own parametrisation: a squashed policy's before the squash);
  // Unimplemented for an exploration without a density.
  virtual absl::Status Explore(const float* state, const uint8_t* pixels, int batch, const ExplorationPoint& at,
                               std::mt19937_64& rng, float* actions, float* log_probs) = 0;
  // The policy's value estimate V(x) of each observation, in reward units,
  // [batch] (an actor's value bootstrap at an episode's time limit).
  // Unimplemented for a policy without a value function.
  virtual absl::Status Values(const float* state, const uint8_t* pixels, int batch, float* values) {
    (void)state, (void)pixels, (void)batch, (void)values;
    return absl::UnimplementedError("this agent's policy has no value function");
  }
  // What an actor's progress line says of its exploration at `at`
  // ("noise 0.25").
  virtual std::string DescribeExploration(const ExplorationPoint& at) const = 0;

  virtual const ObservationSpec& spec() const = 0;
  virtual int action_size() const = 0;
};

}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_POLICY_H_
