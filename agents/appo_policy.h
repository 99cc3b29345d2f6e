// APPO's networks and inference policy (the agent is agents/appo_agent.h):
// a Gaussian over pre-squash actions u with a state-dependent mean and a
// state-independent log standard deviation, actions a = tanh(u); a value
// MLP beside it. From state, observations are normalised by the learner's
// running statistics, which travel in the policy's parameters; from
// pixels, DrQ's encoder (agents/d4pg_networks.h, Encoder) turns a stack of
// frames into the features both MLPs read.
//
// Parameters (SetParameters, the learner's PolicyParameters): the model's
// ParameterSet ("encoder.*" from pixels, "policy.*", "policy.log_std",
// "value.*") flat, then (state) the observation mean [S] and standard
// deviation [S].
//
// Threads: a policy is not thread-safe (one per thread).
#ifndef TROUPE_AGENTS_APPO_POLICY_H_
#define TROUPE_AGENTS_APPO_POLICY_H_

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agents/d4pg_networks.h"
#include "agents/networks.h"
#include "agents/policy.h"
#include "engine/nn/backend.h"
#include "engine/nn/parameters.h"
#include "engine/nn/tape.h"
#include "proto/config.pb.h"

namespace troupe::agents {

// InvalidArgument naming the field ("appo.clip 0: must be in (0, 1)").
absl::Status ValidateAppo(const config::AppoConfig& config, const ObservationSpec& spec, int action_size);

namespace internal {

// The model both the learner and the policy declare, in this order.
struct AppoNetworks {
  bool pixels = false;
  Encoder encoder;  // pixels
  Mlp policy, value;
  int log_std = -1;  // "policy.log_std" [1, A]
  static AppoNetworks Declare(nn::ParameterSet& params, const config::AppoConfig& config,
                              const ObservationSpec& spec, int action_size);
  // What the MLPs read: the encoder's features of float pixels
  // [B, 3k, H, W] in [0, 1], or the (normalised) state [B, S] itself.
  nn::Var Features(nn::Tape& tape, Weights weights, nn::Var observation) const;
  // The Gaussian's pre-squash mean [B, A]: the policy MLP's output y bounded
  // smoothly to +-kMeanBound (kMeanBound tanh(y / kMeanBound)). Unbounded,
  // a mean that runs past where tanh saturates leaves every sampled action
  // at the bound, whose pre-squash sample (PreSquash) then sits far in the
  // Gaussian's tail, and the ratios of PPO's loss explode.
  nn::Var Mean(nn::Tape& tape, Weights weights, nn::Var features) const;
};

// The pre-squash mean's bound: tanh(5) = 0.99991, every action within reach.
inline constexpr float kMeanBound = 5.0f;

// appo.hidden, [64, 64] when empty.
std::vector<int64_t> AppoHiddenSizes(const config::AppoConfig& config);

// The pre-squash sample an action stands for: atanh of a clamped inside
// (-1, 1), so that the actor's log-density and the learner's see the same u.
float PreSquash(float action);
// log N(u; mean, exp(log_std)) summed over `n` dimensions.
double GaussianLogDensity(const float* u, const float* mean, const float* log_std, int n);

// Observation normalisation: (x - mean) / std, clipped to +-kObservationClip,
// std = ObservationStd(the running variance).
inline constexpr float kObservationClip = 10.0f;
float ObservationStd(double variance);
void NormalizeObservations(const float* x, int64_t rows, int64_t size, const float* mean, const float* std,
                           float* out);

// Checkpoint entry names (AppoAgent::Save): the model's parameters
// "param/model/<name>", from state the normaliser's "param/normalizer.mean"
// and "param/normalizer.var" [S], and the counters (updates, Adam's steps,
// the normaliser's count).
std::string AppoModelEntry(const std::string& parameter);
inline constexpr char kAppoNormalizerMean[] = "param/normalizer.mean";
inline constexpr char kAppoNormalizerVar[] = "param/normalizer.var";
inline constexpr char kAppoCounters[] = "param/counters.updates_steps_observations";

}  // namespace internal

class AppoPolicy final : public Policy {
 public:
  static absl::StatusOr<std::unique_ptr<AppoPolicy>> Create(const config::AppoConfig& config,
                                                            const ObservationSpec& spec, int action_size,
                                                            int num_threads = 1);

  int64_t num_parameters() const override;
  absl::Status SetParameters(std::span<const float> parameters) override;
  std::vector<float> DownloadParameters() const override;
  absl::StatusOr<int64_t> LoadAgentCheckpoint(const std::string& path) override;
  // tanh of the mean.
  absl::Status Act(const float* state, const uint8_t* pixels, int batch, float* actions) override;
  // tanh(u) of u drawn from the Gaussian; log_probs: log N(u) of
  // PreSquash(action).
  absl::Status Explore(const float* state, const uint8_t* pixels, int batch, const ExplorationPoint& at,
                       std::mt19937_64& rng, float* actions, float* log_probs) override;
  absl::Status Values(const float* state, const uint8_t* pixels, int batch, float* values) override;
  // "std 0.61" (the mean over action dimensions).
  std::string DescribeExploration(const ExplorationPoint& at) const override;
  const ObservationSpec& spec() const override { return spec_; }
  int action_size() const override { return action_size_; }

 private:
  AppoPolicy(const config::AppoConfig& config, const ObservationSpec& spec, int action_size,
             std::unique_ptr<nn::Backend> backend);
  // The Gaussian's means of `batch` observations into host_mean_ [batch, A]
  // (after CheckActInputs).
  absl::Status DownloadMeans(const float* state, const uint8_t* pixels, int batch);
  // The MLPs' input on the tape (after CheckActInputs): the normalised
  // state, or the encoder's features of the pixels.
  nn::Var Input(const float* state, const uint8_t* pixels, int batch);
  // log_std_ from the parameters (after each change).
  void ReadLogStd();

  config::AppoConfig config_;
  ObservationSpec spec_;
  int action_size_;
  std::unique_ptr<nn::Backend> backend_;
  nn::ParameterSet params_;
  internal::AppoNetworks networks_;
  nn::Tape tape_;
  std::vector<float> mean_, std_;  // the observation normaliser's
  std::vector<float> log_std_;     // host copy, [A]
  std::vector<float> normalized_, host_mean_, host_u_;  // scratch, sized once
  std::normal_distribution<float> gaussian_{0.0f, 1.0f};
};

}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_APPO_POLICY_H_
