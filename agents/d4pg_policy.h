// D4PG's inference policy (agents/policy.h): the encoder (pixels) and the
// deterministic tanh actor of D4pgAgent (agents/d4pg_agent.h), for actors,
// the evaluator and the viewer, which need neither the Replicator nor
// replay. Parameters arrive as one flat buffer (D4pgAgent::PolicyParameters).
// Its exploration is Gaussian noise added to the action, with a scale of
// each actor's own (D4pgNoiseScale: spread across actors as Ape-X and D4PG
// do, from a wider start that decays).
//
//   ASSIGN_OR_RETURN(envs::EnvSpec env, envs::DescribeEnv(config.env()));
//   auto policy = *D4pgPolicy::Create(config.d4pg(), ObservationSpecOf(env), env.action_size);
//   policy->SetExploration(config.actors());
//   policy->SetParameters(params);
//   policy->Act(state, /*pixels=*/nullptr, batch, actions);
//
// Made through agents::CreatePolicy (agents/policies.h) everywhere but in
// D4PG's own tests and benchmarks.
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
#include "agents/policy.h"
#include "engine/nn/backend.h"
#include "engine/nn/parameters.h"
#include "engine/nn/tape.h"
#include "envs/env.h"
#include "proto/config.pb.h"

namespace troupe::agents {

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

// The exploration noise (the Gaussian's standard deviation) of actor
// `actor` after `frames` of its env frames: spread across the actors from
// actors.noise_min to noise_max, starting from noise_initial and decaying
// linearly to the actor's own over actors.noise_decay_frames.
float D4pgNoiseScale(const config::ActorsConfig& actors, int actor, int64_t frames);

// Inference only: encoder (pixels) and actor.
class D4pgPolicy final : public Policy {
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

  // The actors' noise settings Explore follows (default: ActorsConfig's).
  void SetExploration(const config::ActorsConfig& actors) { exploration_ = actors; }

  // Policy (agents/policy.h). LoadAgentCheckpoint reads a D4pgAgent
  // checkpoint's encoder and actor entries only, so nothing of the training
  // agent is built. Act does not allocate after the first call at a given
  // (or larger) batch size.
  int64_t num_parameters() const override { return params_.total_floats(); }
  absl::Status SetParameters(std::span<const float> parameters) override;
  std::vector<float> DownloadParameters() const override { return params_.DownloadValues(); }
  absl::StatusOr<int64_t> LoadAgentCheckpoint(const std::string& path) override;
  absl::Status Act(const float* state, const uint8_t* pixels, int batch, float* actions) override;
  // Act's actions plus N(0, D4pgNoiseScale(at)^2) on each component, clamped
  // to [-1, 1].
  absl::Status Explore(const float* state, const uint8_t* pixels, int batch, const ExplorationPoint& at,
                       std::mt19937_64& rng, float* actions, float* log_probs) override;
  std::string DescribeExploration(const ExplorationPoint& at) const override;
  const ObservationSpec& spec() const override { return spec_; }
  int action_size() const override { return action_size_; }

 private:
  D4pgPolicy(const ObservationSpec& spec, int action_size, std::unique_ptr<nn::Backend> backend);

  ObservationSpec spec_;
  int action_size_;
  std::unique_ptr<nn::Backend> backend_;  // before the parameters and tape that use it
  nn::ParameterSet params_;
  internal::Encoder encoder_;
  internal::Mlp actor_;
  nn::Tape tape_;
  config::ActorsConfig exploration_;
  std::normal_distribution<float> gaussian_{0.0f, 1.0f};  // Explore's (keeps its spare draw between calls)
};

}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_D4PG_POLICY_H_
