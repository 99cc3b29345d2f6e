// D4PG (Barth-Maron et al. 2018, "Distributed Distributional Deterministic
// Policy Gradients"): a deterministic tanh actor, a categorical critic over a
// fixed support [v_min, v_max] (Bellemare et al. 2017, C51) trained on n-step
// transitions against target networks, Polyak-averaged targets. From pixels,
// a DrQ encoder (Kostrikov et al. 2020) shared by actor and critic, trained by
// the critic only, with random-shift augmentation.
//
//   ObservationSpec spec{.frames = 3, .height = 84, .width = 84};
//   config::ReplayTableConfig table = TransitionTable(spec, action_size, cfg);
//   auto agent = *D4pgAgent::Create(cfg, spec, action_size, replicator.get());
//   agent->StartInput([&](int replica, int64_t n, replay::SampledBatch* out) {
//     return samplers[replica]->Next(out);   // n == cfg.learner().batch_size() / replicas
//   }, [&] { for (auto& s : samplers) s->Cancel(); });
//   agent->Train(/*num_updates=*/10);   // ... publish, checkpoint, Train again
//   agent->StopInput();                 // before the samplers go
//   (with agent->frame_references(), the samplers hand frame references:
//   replay::SamplerOptions::frame_references)
//   std::vector<float> params; agent->PolicyParameters(&params);
//   policy->SetParameters(params);  // at an actor: agents/d4pg_policy.h
//
// Threads: D4pgAgent runs one std::jthread per local replica inside Train()
// (the Replicator's), and with learner.prefetch_input one more per replica
// that samples the next update's batch while this one steps (and, with
// StartInput, between Train calls); everything else (PolicyParameters, Save,
// Load) must be called from the thread that calls Train, between Train
// calls. metrics() and frame_stats() may be called from any thread.
#ifndef TROUPE_AGENTS_D4PG_AGENT_H_
#define TROUPE_AGENTS_D4PG_AGENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "agents/agent.h"
#include "agents/d4pg_networks.h"
#include "agents/device_frames.h"
#include "agents/d4pg_policy.h"
#include "agents/transition.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/parameters.h"
#include "engine/nn/step_staging.h"
#include "engine/nn/tape.h"
#include "engine/replicator/replicator.h"
#include "engine/replicator/sharded_parameters.h"
#include "proto/config.pb.h"
#include "replay/replay.h"

namespace troupe::agents {

// D4PG's metrics (Agent::metrics' values): critic_loss, the cross-entropy
// to the projected target, mean over the global batch; actor_loss,
// -E[Q(s, pi(s))] plus the pre-tanh penalty; q_mean, E[Q(s, a)] of the
// replay actions under the online critic.
inline constexpr const char* kD4pgMetrics[] = {"critic_loss", "actor_loss", "q_mean"};

// A D4PG step's memory, roughly (every replica's parameters with their
// gradients, Adam moments and targets, the activations of a batch, the
// device frame tables as they start), against this machine's:
// InvalidArgument naming the sizes that ask for too much.
absl::Status CheckD4pgStepFits(const config::ExperimentConfig& config, const ObservationSpec& spec, int action_size);

// What one of `replicas` replicas keeps on its device to train, in bytes:
// the critic's and actor's values and gradients (their buffers, padded to
// the replicas' parts with sharded state), the targets, and Adam's moments
// (1/replicas of them with learner.engine.shard_state OPTIMIZER; on PJRT
// with the part's values and gradients, which have buffers of their own).
struct D4pgReplicaState {
  int64_t networks = 0, gradients = 0, targets = 0, moments = 0;
  // With engine.shard_state PARAMETERS the four above are a replica's parts,
  // kept between updates, and `gathered` the most whole networks a step
  // holds at once (the targets together; the critic's values and gradients;
  // the critic's values with the actor's values and gradients).
  int64_t gathered = 0;
  int64_t kept() const { return networks + gradients + targets + moments; }
  int64_t total() const { return kept() + gathered; }
};
D4pgReplicaState D4pgReplicaStateBytes(const config::ExperimentConfig& config, const ObservationSpec& spec,
                                       int action_size, int replicas);
// learner.engine.model_parallel M > 1 (the critic split over M replicas, a
// (K/M) x M mesh): what splitting it needs (two hidden layers or more with
// the first divisible by M, collectives IN_PROCESS or MPI), refused naming
// the field otherwise.
absl::Status CheckD4pgCriticSplits(const config::ExperimentConfig& config, const ObservationSpec& spec);
// learner.engine.device_memory_mib against D4pgReplicaStateBytes (nothing
// when 0): InvalidArgument naming the budget and each size.
absl::Status CheckD4pgStateFitsDevice(const config::ExperimentConfig& config, const ObservationSpec& spec,
                                      int action_size, int replicas);

class D4pgAgent final : public Agent {
 public:
  // SampleFn (Agent's) fills a replica's shard with transitions of
  // TransitionTable's signature.

  // Builds networks, targets (copies) and Adam optimizers on every local
  // replica of `replicator` (which must outlive the agent), identically
  // initialised from config.learner().engine().seed(). InvalidArgument for a bad
  // config (ValidateD4pg) or a batch size not divisible by the replicas.
  static absl::StatusOr<std::unique_ptr<D4pgAgent>> Create(const config::ExperimentConfig& config,
                                                           const ObservationSpec& spec, int action_size,
                                                           replicator::Replicator* replicator);
  ~D4pgAgent();

  // The learner's input for the Train(num_updates) calls that follow:
  // `sample` fills each local replica's shard of every update's batch. With
  // learner.prefetch_input a thread per local replica runs it one update
  // ahead, across Train calls: the first update of a call finds its input
  // made while the caller worked between the calls (publishing a policy,
  // checkpointing). So `sample` is called outside Train too, and must stay
  // callable until StopInput, which calls `cancel` (if given; e.g. each
  // replay::Sampler's Cancel) to end a sample blocked on the rate limiter
  // (a cancelled replay::Sampler stays cancelled: a later StartInput wants
  // new samplers).
  // An input made ahead is replay's batch, not the agent's state: Save and
  // Load leave it (a priority set between calls reaches it one update late).
  void StartInput(SampleFn sample, std::function<void()> cancel = nullptr) override;
  // Stops the input (joins its threads) and drops the input made ahead.
  // The destructor calls it.
  void StopInput() override;

  // `num_updates` D4PG updates on the Replicator, on StartInput's input
  // (FailedPrecondition without one): per update each replica takes its
  // shard (input_fn), then (step_fn) takes one critic step and one actor
  // step with gradients averaged over replicas, and moves the targets.
  // Errors: the sampler's, InvalidArgument for a batch that does not match
  // the table signature (naming field and shape), collective errors; each
  // prefixed with the replica ("replica 1: ...").
  absl::Status Train(int64_t num_updates) override;
  // Whether an execution's epilogue (its readouts: priorities, metrics)
  // waits until the next execution is launched, so the device does not
  // idle while the host reads (the default; the same updates, priorities
  // and metrics either way, by the end of each Train call). Benchmarks
  // compare; between Train calls.
  void set_overlap_epilogue(bool overlap) { overlap_epilogue_ = overlap; }
  // The same on an input of this call's own: `sample` is called exactly
  // num_updates times per replica, within this call (prefetching inside it
  // only). FailedPrecondition while StartInput's input runs.
  absl::Status Train(int64_t num_updates, const SampleFn& sample);

  // The policy's flat parameters (encoder + actor), exactly D4pgPolicy's
  // SetParameters layout; resizes *out.
  void PolicyParameters(std::vector<float>* out) const override;
  int64_t num_policy_parameters() const override;

  // Floats of gradient one update averages across replicas: the critic's
  // (with the encoder, from pixels) and the actor's, each a ParameterSet
  // reduced in buckets during its backward pass.
  int64_t gradient_floats() const override;

  // Means over the updates since the last call (updates: the running
  // total), the values kD4pgMetrics' in that order. During a Train call
  // they come in every kMetricsPublishEvery updates; its end brings the rest.
  AgentMetrics metrics() const override;
  static constexpr int64_t kMetricsPublishEvery = 64;
  // kD4pgMetrics, then with learner.engine.straggler DEADLINE
  // late_backward.replicaR for each replica R.
  std::vector<std::string> metric_names() const override;

  // True when Train's batches must carry frame references
  // (replay::SamplerOptions::frame_references) instead of decoded pixels:
  // pixels with learner.device_frames. A batch with decoded pixels is then
  // still taken (the host-assembled path).
  bool frame_references() const override;
  // The device frame tables' counters, summed over this process's replicas
  // (slots: the largest table's; zeros without tables); from any thread.
  DeviceFrameStats frame_stats() const override;
  int64_t updates() const override { return updates_; }

  // Prioritized replay (config.learner().prioritized()): the keys of the last
  // execution's batches on this process's replicas (its
  // learner.updates_per_execution updates') and, for each, its critic loss
  // (cross-entropy) as the new priority. Empty before the first update.
  void LastPriorities(std::vector<uint64_t>* keys, std::vector<double>* priorities) const override;

  // Networks, targets, both optimizers' state and the update counter in one
  // checkpoint file (engine/nn/checkpoint.h: written to path.tmp, renamed;
  // checksummed). Load checks every entry's name and shape first (a mismatch
  // is InvalidArgument naming the parameter) and then sets every local
  // replica; a corrupt file is DataLoss. Augmentation randomness is derived
  // from (seed, replica, update), so training after Load continues exactly.
  // Under MPI every rank holds the same state: Save on one rank (the one
  // whose replicator->local_replicas() holds replica 0), Load on all.
  absl::Status Save(const std::string& path) const override;
  absl::Status Load(const std::string& path) override;
  // Everything Save writes, downloaded from replica 0's device, in file
  // order (the thread rule above applies); nn::WriteCheckpoint writes it, on
  // any thread (the learner writes it beside replay's checkpoint).
  std::vector<nn::CheckpointTensor> CheckpointState() const override { return DownloadState(); }
  // Adam's two moments of both networks, or with engine.shard_state
  // OPTIMIZER this replica's part of them.
  int64_t optimizer_state_bytes() const override;
  // The networks' values, their gradients and the targets one replica keeps
  // between updates (its parts with engine.shard_state PARAMETERS).
  int64_t parameter_state_bytes() const override;
  // engine.shard_state OPTIMIZER or PARAMETERS, or a critic split by
  // engine.model_parallel, over MPI ranks: the parts are gathered by
  // PrepareCheckpoint (a collective on every rank).
  bool state_split_across_processes() const override;
  absl::Status PrepareCheckpoint() override;
  bool state_gathered() const override { return !state_split_across_processes() || state_gathered_; }

  // FNV-1a (64-bit) over the bytes of everything Save writes, from this
  // process's first local replica: equal on every replica (and MPI rank)
  // exactly when their states are bit-identical.
  uint64_t StateChecksum() const override;

  const ObservationSpec& spec() const override { return spec_; }
  int action_size() const override { return action_size_; }

 private:
  struct Replica;
  // The four networks, in checkpoint order (a Replica's part_of, the host's
  // copies below).
  enum Network { kCritic, kActor, kTargetCritic, kTargetActor, kNetworks };
  struct StepInputs;  // one update's inputs in device memory (d4pg_agent.cc)
  struct StagedBatch;  // a batch's inputs as an update's staging takes them (d4pg_agent.cc)
  struct Launched;    // an execution whose readouts are still to be read (d4pg_agent.cc)
  D4pgAgent() = default;
  // One replica's input for an update: the batch and its inputs staged (for
  // frame references their slots in the device frame table, uploaded
  // already).
  struct Input {
    replay::SampledBatch* batch = nullptr;
    const StagedBatch* staged = nullptr;
    int64_t index = 0;  // counted from the input's opening
  };
  class InputPrefetcher;
  // Starts an input (stopping the one before): `across_calls`, StartInput's
  // (made ahead into the next call); `prefetch`, on a thread per replica.
  void OpenInput(SampleFn sample, std::function<void()> cancel, bool across_calls, bool prefetch);
  // Train's updates on the open input.
  absl::Status RunUpdates(int64_t num_updates);
  // Samples input `index` (since the input opened) into its buffer and
  // prepares its frames (the host's part: no device call).
  absl::Status ProduceInput(Replica& r, int replica_id, int64_t shard, int64_t index, const SampleFn& sample);
  // `batch`'s own inputs into `staged` (ProduceInput's last part; `slots`
  // its frames' slots where `gathered`), with the random shifts of
  // `update` of model copy `copy` where pixels are augmented.
  void StageBatch(const replay::SampledBatch& batch, bool gathered, const std::vector<int32_t>& slots, int copy,
                  int64_t update, StagedBatch& staged) const;
  // The random shifts of `update` of model copy `copy` into `out` (4 ints a row).
  void ShiftsOf(int copy, int64_t update, int32_t* out) const;
  // One execution's inputs (learner.updates_per_execution, or fewer at a
  // Train call's end).
  using Block = std::vector<Input>;
  // One execution of block.size() updates: each update's inputs to the
  // device (PrepareUpdate, the host's part), one step of their DeviceUpdates
  // in order (kernels only, which the backend may replay), then the
  // epilogue of the execution before it (or at the call's end its own).
  absl::Status Update(replicator::ReplicaContext& ctx, Replica& r, const Block& block);
  // One update's inputs appended to `staging` (the execution's), the
  // slices of `in` naming where, and its optimizers' Prepares.
  absl::Status PrepareUpdate(replicator::ReplicaContext& ctx, Replica& r, const Input& input, int64_t update,
                             StepInputs& in, nn::StepStaging& staging, bool* gathered, bool* weighted);
  // A split critic's part: its copy's inputs of one update are part 0's
  // (every other part's floats made zero and the parts' sum taken on the
  // device; pixels, bytes, gathered from every part and part 0's kept).
  absl::Status ShareInputs(replicator::ReplicaContext& ctx, Replica& r, StepInputs& in, bool weighted);
  // Each parameter of a part of a split critic (`critic` declared as that
  // part in `set`): each(its index in the part's set, the whole critic's
  // parameter's index, where it sits there).
  void ForEachCriticSlice(const internal::Mlp& critic, const nn::ParameterSet& set,
                          absl::FunctionRef<void(int, int, internal::PartSlice)> each) const;
  absl::Status DeviceUpdate(replicator::ReplicaContext& ctx, Replica& r, StepInputs& in, int64_t rows, bool gathered,
                            bool weighted);
  // The host's epilogue of a launched execution: its readouts landed, its
  // priorities (LastPriorities', taking its keys) and metrics.
  absl::Status Epilogue(replicator::ReplicaContext& ctx, Replica& r, Launched& execution, int64_t rows);
  // Replica 0's epilogues' sums since the last PublishMetrics, which adds
  // them to metrics()'s under metrics_mu_: every kMetricsPublishEvery
  // updates and at each Train call's end (a lock an execution was 7% of the
  // learner's own time at 8 updates an execution, docs/benchmarks/learner.md).
  // Replica 0's thread's during Train, the caller's after it.
  struct MetricSums {
    double critic_loss = 0, actor_loss = 0, q = 0, input_wait = 0;
    int64_t count = 0, updates = 0;
    std::vector<int64_t> late_passes;  // engine.straggler DEADLINE: each replica's
  };
  MetricSums unpublished_;
  void PublishMetrics();
  // Everything Save writes, downloaded from replica 0's device, in file order.
  std::vector<nn::CheckpointTensor> DownloadState() const;
  // engine.shard_state PARAMETERS: network n's whole values on the host,
  // from every local replica's part, or over MPI ranks the copy gathered
  // last (values_on_host_).
  std::vector<float> WholeValues(int network) const;
  // Over MPI ranks with the parameters split: the networks the actors'
  // policy reads into values_on_host_ (a collective; after every Train).
  absl::Status GatherPolicyNetworks();
  // Frees what PrepareCheckpoint gathered (the state moves on, or is loaded).
  void ReleaseGatheredState();
  // A split critic over MPI ranks: every part of this replica's model copy,
  // all-gathered along the model axis into critic_parts_on_host_ (`keep`:
  // this process's copy; a collective).
  absl::Status GatherCriticParts(replicator::ReplicaContext& ctx, Replica& r, bool keep);
  // A split critic (learner.engine.model_parallel): where `parameter` of
  // part `part` sits in the whole critic; the critic's checkpoint entries
  // (its values, target's and moments') put together whole from model copy
  // 0's parts; and replica r's part of whole entries.
  internal::PartSlice CriticSliceOf(int part, const std::string& parameter) const;
  void JoinCriticParts(std::vector<nn::CheckpointTensor>* tensors) const;
  std::vector<nn::CheckpointTensor> CriticPartOf(const Replica& r, const std::vector<nn::CheckpointTensor>& whole) const;

  config::ExperimentConfig config_;
  ObservationSpec spec_;
  int action_size_ = 0;
  replay::Signature signature_;  // TransitionSignature(spec_, action_size_): what Train's batches are checked against
  replicator::Replicator* replicator_ = nullptr;
  int64_t batch_size_ = 0;
  int64_t rows_ = 0;        // a replica's rows of an update's batch (the global batch over the model copies)
  int model_parallel_ = 1;  // M: the replicas one critic is split over
  std::vector<int64_t> hidden_;
  // Network descriptions (indices into each replica's sets; shared).
  internal::Encoder encoder_;  // in the critic set (pixels)
  // A critic split over a model-parallel group (learner.engine.model_parallel
  // M > 1): the whole critic's layout (declared only), what checkpoints hold.
  nn::ParameterSet whole_critic_set_;
  internal::Mlp whole_critic_;
  internal::Mlp actor_;        // in the actor set
  std::vector<std::unique_ptr<Replica>> replicas_;  // local, in replicator->local_replicas() order
  int64_t updates_ = 0;
  bool overlap_epilogue_ = true;
  int64_t train_generation_ = 0;
  // The open input (OpenInput): its sampling, what ends a sample in flight,
  // and whether it runs ahead into the next Train call (StartInput's).
  SampleFn sample_;
  std::function<void()> cancel_input_;
  bool input_across_calls_ = false;
  // Policy layout: (source set is critic (0) or actor (1), source offset, destination offset, floats).
  struct PolicyCopy {
    int source;
    int64_t from, to, count;
  };
  std::vector<PolicyCopy> policy_copies_;
  int64_t policy_floats_ = 0;

  // PrepareCheckpoint gathered what is split across processes: the whole
  // moments into every local replica's sharded optimizers, or with the
  // parameters split to moments_on_host_, or a split critic's parts to
  // critic_parts_on_host_; released at the next Train.
  bool state_gathered_ = false;
  // engine.shard_state PARAMETERS over MPI ranks, where no host holds every
  // part: each network's whole values (Network's order) and the critic's and
  // actor's whole moments (StateNames' order), gathered by collectives. The
  // networks start whole here (Create, Load); the policy's are gathered
  // again after every Train call, everything by PrepareCheckpoint.
  std::vector<float> values_on_host_[kNetworks];
  std::vector<std::vector<float>> moments_on_host_[2];
  // learner.engine.model_parallel over MPI ranks: each part p of this
  // rank's model copy as its checkpoint entries (the critic's from part p,
  // the rest as every part holds them), gathered by PrepareCheckpoint.
  std::vector<std::vector<nn::CheckpointTensor>> critic_parts_on_host_;
  mutable absl::Mutex metrics_mu_;
  mutable double sum_critic_loss_ ABSL_GUARDED_BY(metrics_mu_) = 0;
  mutable double sum_actor_loss_ ABSL_GUARDED_BY(metrics_mu_) = 0;
  mutable double sum_q_ ABSL_GUARDED_BY(metrics_mu_) = 0;
  mutable double sum_input_wait_ ABSL_GUARDED_BY(metrics_mu_) = 0;
  mutable double device_idle_counted_ ABSL_GUARDED_BY(metrics_mu_) = 0;  // the devices' idle seconds in metrics so far
  mutable int64_t metric_count_ ABSL_GUARDED_BY(metrics_mu_) = 0;
  int64_t metric_updates_ ABSL_GUARDED_BY(metrics_mu_) = 0;
  // engine.straggler DEADLINE: each replica's backward passes left at the
  // deadline since the last metrics() (K long; empty otherwise).
  mutable std::vector<int64_t> late_passes_ ABSL_GUARDED_BY(metrics_mu_);
};

}  // namespace troupe::agents

#endif  // TROUPE_AGENTS_D4PG_AGENT_H_
