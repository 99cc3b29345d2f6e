// D4PG's inference policy: the encoder (pixels) and the deterministic tanh
// actor of D4pgAgent (agents/d4pg_agent.h), for actors, the evaluator and the
// viewer, which need neither the Replicator nor replay. Parameters arrive as
// one flat buffer (D4pgAgent::PolicyParameters).
//
//   ASSIGN_OR_RETURN(envs::EnvSpec env, envs::DescribeEnv(config.env()));
//   auto policy = *D4pgPolicy::Create(config.d4pg(), ObservationSpecOf(env), env.action_size);
//   policy->SetParameters(params);
//   policy->Act(state, /*pixels=*/nullptr, batch, actions);
//
// Threads: not thread-safe (one policy per thread).
#ifndef TROUPE_AGENTS_D4PG_POLICY_H_
#define TROUPE_AGENTS_D4PG_POLICY_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agents/d4pg_networks.h"
#include "engine/nn/backend.h"
#include "engine/nn/parameters.h"
#include "engine/nn/tape.h"
#include "envs/env.h"
#include "proto/config.pb.h"

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

// Limits of the networks' sizes, so that no config asks for more than a
// machine could allocate (launch also checks the whole step against memory).
inline constexpr int kMaxHiddenLayers = 8;
inline constexpr int kMaxHiddenSize = 8192;
inline constexpr int kMaxAtoms = 1001;
inline constexpr int kMaxConvChannels = 512;
inline constexpr int kMaxEncoderFeatures = 8192;
inline constexpr int kMaxNStep = 100;
inline constexpr int kMaxAugmentPad = 32;

// InvalidArgument naming the field ("d4pg.atoms 1: must be >= 2") for a
// config, observation spec or action size D4PG cannot use, or sizes beyond
// the limits above.
absl::Status ValidateD4pg(const config::D4pgConfig& config, const ObservationSpec& spec, int action_size);

// Inference only: encoder (pixels) and actor.
class D4pgPolicy {
 public:
  // InvalidArgument for a config ValidateD4pg refuses. Computes on a CPU
  // backend with `num_threads` threads (1 = the calling thread only), as
  // actors do, or on `backend` (any device: the strict CPU device in tests).
  static absl::StatusOr<std::unique_ptr<D4pgPolicy>> Create(const config::D4pgConfig& config,
                                                            const ObservationSpec& spec, int action_size,
                                                            int num_threads = 1);
  static absl::StatusOr<std::unique_ptr<D4pgPolicy>> Create(const config::D4pgConfig& config,
                                                            const ObservationSpec& spec, int action_size,
                                                            std::unique_ptr<nn::Backend> backend);

  // Floats SetParameters expects.
  int64_t num_parameters() const { return params_.total_floats(); }
  // Replaces every weight. InvalidArgument "policy parameters: got N floats,
  // expected M" when the size differs.
  absl::Status SetParameters(std::span<const float> parameters);
  // Sets the parameters from a D4pgAgent checkpoint file (D4pgAgent::Save):
  // the encoder and actor entries only, so nothing of the training agent is
  // built. Returns the agent's update count stored there. Errors: NotFound
  // and DataLoss (corrupt, truncated) naming the path; InvalidArgument naming
  // the first parameter the file lacks or holds in another shape (a
  // checkpoint of another task or architecture). The policy is unchanged on
  // error.
  absl::StatusOr<int64_t> LoadAgentCheckpoint(const std::string& path);
  // The current flat parameters (as SetParameters takes them), downloaded.
  std::vector<float> DownloadParameters() const { return params_.DownloadValues(); }

  // Deterministic actions (no exploration) in [-1, 1]: from `state` float
  // [batch, S] (pixels null) or from `pixels` uint8 [batch, k, H, W, 3]
  // (replay's layout; state null). Writes actions [batch, A]. Does not
  // allocate after the first call at a given (or larger) batch size.
  // InvalidArgument for a missing input or batch < 1.
  absl::Status Act(const float* state, const uint8_t* pixels, int batch, float* actions);

  const ObservationSpec& spec() const { return spec_; }
  int action_size() const { return action_size_; }

 private:
  D4pgPolicy(const ObservationSpec& spec, int action_size, std::unique_ptr<nn::Backend> backend);

  ObservationSpec spec_;
  int action_size_;
  std::unique_ptr<nn::Backend> backend_;  // before the parameters and tape that use it
  nn::ParameterSet params_;
  internal::Encoder encoder_;
  internal::Mlp actor_;
  nn::Tape tape_;
};

}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_D4PG_POLICY_H_
