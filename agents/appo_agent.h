// APPO (asynchronous PPO, Schulman et al. 2017 as Sample Factory runs it,
// Petrenko et al. 2020) over trajectories, with V-trace (Espeholt et al.
// 2018, agents/vtrace.h) correcting for the lag between the actors'
// behaviour policy and the learner's.
//
// One update takes learner.batch_size trajectories (agents/trajectory.h;
// each replica its shard), updates the observation normaliser from them,
// and runs appo.epochs passes; each pass recomputes V-trace targets and
// advantages under the current networks (a forward pass, then V-trace on
// the host), normalises the advantages over the whole batch, and takes
// appo.minibatches gradient steps on PPO's clipped policy loss, the value
// loss and the entropy bonus, gradients averaged over replicas. Items whose
// behaviour is more than appo.max_policy_lag updates old weigh nothing and
// are counted (dropped_stale).
//
// From pixels, DrQ's encoder is shared by the policy and the value and
// trained by both losses (no augmentation), on frames decoded by the
// sampler.
//
// Kernel at a time (CPU, CPU_STRICT, CUDA): the targets are computed on the
// host between the forward pass and the gradient steps.
//
// Threads: as Agent's (agents/agent.h); Train runs the Replicator's replica
// threads.
#ifndef TROUPE_AGENTS_APPO_AGENT_H_
#define TROUPE_AGENTS_APPO_AGENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agents/agent.h"
#include "agents/appo_policy.h"
#include "engine/replicator/replicator.h"
#include "proto/config.pb.h"
#include "replay/item.h"

namespace troupe::agents {

// APPO's metrics (Agent::metrics' values), means over the interval's
// minibatch steps: policy_loss (the clipped surrogate, negated), value_loss
// (0.5 (V - vs)^2), entropy (the Gaussian's, summed over action
// dimensions), approx_kl (E[r - 1 - log r]), clip_fraction (|r - 1| > clip),
// r the ratio PPO clips (against the behaviour, or the policy at the
// update's start with appo.decoupled_clip);
// dropped_stale, trajectories left out for their policy lag (a count);
// policy_lag, the mean lag of the trajectories used (learner updates);
// epochs, the passes an update made (fewer than appo.epochs where
// appo.target_kl stopped it); explained_variance, 1 - Var[vs - V] / Var[vs]
// over the batch's used steps at the update's start (1: the value predicts
// its targets, 0: no better than their mean).
inline constexpr const char* kAppoMetrics[] = {"policy_loss", "value_loss", "entropy",    "approx_kl",
                                               "clip_fraction", "dropped_stale", "policy_lag", "epochs",
                                               "explained_variance"};

// The learner's memory for APPO's step (parameters, moments, a batch's
// activations) against this machine's: InvalidArgument naming the sizes.
absl::Status CheckAppoStepFits(const config::ExperimentConfig& config, const ObservationSpec& spec, int action_size);

// What the learner's engine must be for agent APPO, from the config alone
// (ValidateExperiment runs it, so `troupe run` refuses before anything
// starts; AppoAgent::Create again): kernel at a time (not PJRT), one update
// per execution, no sharded optimizer state, no step deadline; with
// `replicas` replicas (0: not known before the start, an MPI world), a
// batch they divide whose shards hold at least appo.minibatches steps.
absl::Status CheckAppoEngine(const config::ExperimentConfig& config, int replicas);

namespace internal {

// One minibatch's loss, for n steps of A action dimensions: given the
// policy's means [n, A], its log standard deviation row [1, A] and the
// values [n] on the tape, and on the host the pre-squash actions [n, A],
// the behaviour's log-densities less the -A/2 log(2 pi) the device leaves
// out [n], the advantages times weight / n [n], the V-trace targets [n] and
// the value weights 0.5 value_coef weight / n [n], and n ones:
//   policy = -sum_i min(r_i A_i, clip(r_i, 1 - clip, 1 + clip) A_i),
//            r_i = exp(clamp(log N(u_i; mean_i, e^log_std) - behaviour_i, +-kMaxLogRatio))
//   value  = sum_i value_weight_i (V_i - vs_i)^2
//   total  = policy + value - entropy_coef sum(log_std)
// The largest |log pi/mu| the loss and V-trace use (the ratio's clamp).
inline constexpr float kMaxLogRatio = 20.0f;
struct PpoInputs {
  int64_t n = 0;
  int action_size = 0;
  const float *u = nullptr, *behaviour = nullptr, *advantage = nullptr, *vs = nullptr, *value_weight = nullptr,
              *ones = nullptr;
  float clip = 0.2f;
  float entropy_coef = 0;
};
struct PpoLoss {
  nn::Var total, policy, value, ratio;
};
PpoLoss AppoLoss(nn::Tape& t, nn::Var mean, nn::Var log_std_row, nn::Var value, const PpoInputs& in);

}  // namespace internal

class AppoAgent final : public Agent {
 public:
  // InvalidArgument for a bad config (ValidateAppo), a batch not divisible by
  // the replicas, or a shard with fewer steps than minibatches; a device
  // other than kernel at a time.
  static absl::StatusOr<std::unique_ptr<AppoAgent>> Create(const config::ExperimentConfig& config,
                                                           const ObservationSpec& spec, int action_size,
                                                           replicator::Replicator* replicator);
  ~AppoAgent() override;

  void StartInput(SampleFn sample, std::function<void()> cancel = nullptr) override;
  void StopInput() override;
  absl::Status Train(int64_t num_updates) override;
  int64_t updates() const override { return updates_; }
  // The model's parameters, then the normaliser's mean and standard
  // deviation: AppoPolicy's SetParameters layout.
  void PolicyParameters(std::vector<float>* out) const override;
  int64_t num_policy_parameters() const override;
  int64_t gradient_floats() const override;
  int64_t optimizer_state_bytes() const override;
  int64_t parameter_state_bytes() const override;
  AgentMetrics metrics() const override;
  std::vector<std::string> metric_names() const override {
    return std::vector<std::string>(std::begin(kAppoMetrics), std::end(kAppoMetrics));
  }
  bool frame_references() const override { return false; }
  DeviceFrameStats frame_stats() const override { return {}; }
  // None: the queue hands each trajectory out once.
  void LastPriorities(std::vector<uint64_t>* keys, std::vector<double>* priorities) const override;
  absl::Status Save(const std::string& path) const override;
  absl::Status Load(const std::string& path) override;
  std::vector<nn::CheckpointTensor> CheckpointState() const override;
  uint64_t StateChecksum() const override;
  const ObservationSpec& spec() const override { return spec_; }
  int action_size() const override { return action_size_; }

 private:
  struct Replica;
  AppoAgent() = default;
  absl::Status Update(replicator::ReplicaContext& ctx, Replica& r);
  // The observation normaliser of replica `r` updated from its shard's
  // state observations [bs, T + 1, S] (nothing from pixels), and r's mean32
  // and std32 set to what normalises (NormalizerFloats).
  absl::Status UpdateNormalizer(replicator::ReplicaContext& ctx, Replica& r, const float* observation);
  // What replica `r`'s normaliser normalises with: the running mean and
  // ObservationStd of the running variance (0 and 1 when off). The policy's
  // parameters carry them.
  void NormalizerFloats(const Replica& r, std::vector<float>* mean, std::vector<float>* std) const;
  // Update `update`'s learning rate (appo.anneal_learning_rate).
  float LearningRate(int64_t update) const;
  // Rows of the forward pass over a shard's observations at a time.
  static constexpr int64_t kForwardChunk = 256;
  // Bytes of one observation's frame stack (0 from state).
  int64_t FrameStackBytes() const;
  // `rows` observations on the tape as the networks read them: the
  // normalised state [rows, S], or the frames [rows, k, H, W, 3] as float
  // planes [rows, 3k, H, W] in [0, 1].
  nn::Var ObservationInput(nn::Tape& t, const float* state, const uint8_t* frames, int64_t rows) const;
  // One minibatch's gradient step on rows `rows` of the prepared shard.
  absl::Status MinibatchStep(Replica& r, const int64_t* rows, int64_t n, double* sums);

  config::ExperimentConfig config_;
  ObservationSpec spec_;
  int action_size_ = 0;
  replay::Signature signature_;
  replicator::Replicator* replicator_ = nullptr;
  int64_t shard_ = 0;  // trajectories per replica
  internal::AppoNetworks networks_;
  std::vector<std::unique_ptr<Replica>> replicas_;
  SampleFn sample_;
  std::function<void()> cancel_;
  int64_t updates_ = 0;
  int64_t train_generation_ = 0;

  mutable absl::Mutex metrics_mu_;
  mutable std::vector<double> metric_sums_ ABSL_GUARDED_BY(metrics_mu_);
  mutable int64_t metric_count_ ABSL_GUARDED_BY(metrics_mu_) = 0;
  mutable double input_wait_ ABSL_GUARDED_BY(metrics_mu_) = 0;
  mutable int64_t input_waits_ ABSL_GUARDED_BY(metrics_mu_) = 0;
  int64_t metric_updates_ ABSL_GUARDED_BY(metrics_mu_) = 0;
};

}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_APPO_AGENT_H_
