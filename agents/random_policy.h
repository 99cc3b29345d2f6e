// RANDOM's policy: uniform actions in [-1, 1], for actors (Explore, from
// the actor's generator) and the evaluator and viewer (Act, from its own).
// The agent and what RANDOM is for: agents/random_agent.h.
//
// Threads: one policy per thread.
#ifndef TROUPE_AGENTS_RANDOM_POLICY_H_
#define TROUPE_AGENTS_RANDOM_POLICY_H_

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agents/policy.h"
#include "engine/nn/checkpoint.h"

namespace troupe::agents {

// The checkpoint entry RandomAgent::Save writes: its update count.
inline constexpr char kRandomAgentUpdates[] = "param/random.updates";

// The update count in a RandomAgent checkpoint's `tensors` (read from
// `path`); InvalidArgument naming the entry for another agent's.
absl::StatusOr<int64_t> RandomAgentUpdates(const std::string& path, const std::vector<nn::CheckpointTensor>& tensors);

class RandomPolicy final : public Policy {
 public:
  // Its own draws (Act) from `seed`.
  RandomPolicy(const ObservationSpec& spec, int action_size, uint64_t seed);

  // No parameters: SetParameters takes an empty span (else InvalidArgument
  // "policy parameters: got N floats, expected 0").
  int64_t num_parameters() const override { return 0; }
  absl::Status SetParameters(std::span<const float> parameters) override;
  std::vector<float> DownloadParameters() const override { return {}; }
  // The update count of a RandomAgent checkpoint; InvalidArgument naming the
  // entry for another agent's.
  absl::StatusOr<int64_t> LoadAgentCheckpoint(const std::string& path) override;
  // Uniform in [-1, 1]: Act from the policy's own generator, Explore from
  // the actor's.
  absl::Status Act(const float* state, const uint8_t* pixels, int batch, float* actions) override;
  absl::Status Explore(const float* state, const uint8_t* pixels, int batch, const ExplorationPoint& at,
                       std::mt19937_64& rng, float* actions, float* log_probs) override;
  std::string DescribeExploration(const ExplorationPoint&) const override { return "uniform random"; }
  const ObservationSpec& spec() const override { return spec_; }
  int action_size() const override { return action_size_; }

 private:
  ObservationSpec spec_;
  int action_size_;
  std::mt19937_64 rng_;
};

}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_RANDOM_POLICY_H_
