#include "agents/random_policy.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/nn/checkpoint.h"

namespace troupe::agents {
namespace {

void Uniform(std::mt19937_64& rng, int64_t n, float* actions) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i) actions[i] = uniform(rng);
}

}  // namespace

absl::StatusOr<int64_t> RandomAgentUpdates(const std::string& path, const std::vector<nn::CheckpointTensor>& tensors) {
  for (const nn::CheckpointTensor& t : tensors) {
    if (t.name != kRandomAgentUpdates) continue;
    const std::vector<int64_t> values = nn::Int64sOf(t);
    if (values.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": '", t.name, "' holds ", values.size(), " values, expected 1"));
    }
    return values[0];
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": no entry '", kRandomAgentUpdates, "' (a checkpoint of another agent?)"));
}

// --- RandomPolicy ------------------------------------------------------------------

RandomPolicy::RandomPolicy(const ObservationSpec& spec, int action_size, uint64_t seed)
    : spec_(spec), action_size_(action_size), rng_(seed) {}

absl::Status RandomPolicy::SetParameters(std::span<const float> parameters) {
  if (parameters.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("policy parameters: got ", parameters.size(),
                                                 " floats, expected 0 (the learner's agent is not RANDOM?)"));
}

absl::StatusOr<int64_t> RandomPolicy::LoadAgentCheckpoint(const std::string& path) {
  ASSIGN_OR_RETURN(const std::vector<nn::CheckpointTensor> tensors, nn::ReadCheckpoint(path));
  return RandomAgentUpdates(path, tensors);
}

absl::Status RandomPolicy::Act(const float* state, const uint8_t* pixels, int batch, float* actions) {
  RETURN_IF_ERROR(CheckActInputs(spec_, state, pixels, batch));
  Uniform(rng_, int64_t{batch} * action_size_, actions);
  return absl::OkStatus();
}

absl::Status RandomPolicy::Explore(const float* state, const uint8_t* pixels, int batch, const ExplorationPoint&,
                                   std::mt19937_64& rng, float* actions, float* log_probs) {
  RETURN_IF_ERROR(CheckActInputs(spec_, state, pixels, batch));
  Uniform(rng, int64_t{batch} * action_size_, actions);
  // The uniform density on [-1, 1]^A.
  if (log_probs != nullptr) std::fill(log_probs, log_probs + batch, -action_size_ * std::log(2.0f));
  return absl::OkStatus();
}

}  // namespace troupe::agents
