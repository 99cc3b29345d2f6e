// The GAN trainer on the Replicator: each replica owns a generator and a
// discriminator (identical initial values from one seed), takes its shard of
// the global batch, and updates with gradients averaged across replicas
// (ReplicatedOptimizer) and cross-replica batch norm in the generator, so K
// replicas on shards train exactly as one replica on the whole batch. With
// gan.engine.model_parallel M the K replicas are K/M copies of a generator
// split in M parts (networks.h): the batch is split over the copies, each
// part holds 1/M of the generator's largest layers and their Adam moments,
// and checkpoints, evaluation and exported weights hold the whole generator
// (gathered from this process's parts), so a run resumes at any K and M.
//
// One step = n_critic discriminator updates, then one generator update:
//   hinge (Lim & Ye 2017):  L_D = E[relu(1 - D(x))] + E[relu(1 + D(G(z)))],  L_G = -E[D(G(z))]
//   non-saturating (Goodfellow et al. 2014):
//                           L_D = E[softplus(-D(x))] + E[softplus(D(G(z)))], L_G = E[softplus(-D(G(z)))]
// with Adam (or gan.optimizer LAMB / LARS) at two time-scale learning rates (Heusel et al. 2017) scaled from
// base_batch_size by the linear scaling rule (Goyal et al. 2017, or sqrt /
// none) after a linear warmup, and an exponential moving average of the
// generator's weights (Yazici et al. 2019) used for evaluation.
//
// Threads: Train() runs the replicas on the Replicator's threads and returns
// when they are done; every other method must not overlap Train().
#ifndef TROUPE_GAN_TRAINER_H_
#define TROUPE_GAN_TRAINER_H_

#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/nn/checkpoint.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/optimizer.h"
#include "engine/replicator/replicator.h"
#include "gan/data.h"
#include "gan/networks.h"
#include "proto/config.pb.h"

namespace troupe::gan {

// Limits of the sizes a GAN config sets (launch also checks a step against
// this machine's memory).
inline constexpr int kMaxGanBatchSize = 1 << 16;
inline constexpr int kMaxGanWidth = 4096;     // noise_size
inline constexpr int kMaxGanChannels = 1024;  // generator_ / discriminator_channels
inline constexpr int kMaxGanCriticSteps = 100;
inline constexpr int kMaxGanEvalSamples = 100000;

// Checks every GanConfig field; errors name the field and the valid range.
absl::Status ValidateGanConfig(const config::GanConfig& config);

// Counter-based standard normal noise: the value for (seed, stream, index) is
// the same whichever replica draws it, so shards of one global batch get the
// rows the single-replica run would.
void FillNoise(uint64_t seed, uint64_t stream, int64_t first_index, int64_t count, float* out);

class GanTrainer {
 public:
  // `data` must outlive the trainer. Errors: an invalid config (as
  // ValidateGanConfig), a Replicator that cannot start.
  static absl::StatusOr<std::unique_ptr<GanTrainer>> Create(const config::GanConfig& config, const GanData* data);
  ~GanTrainer();

  // Runs `steps` steps on every local replica. Errors: a replica's failure.
  absl::Status Train(int64_t steps);

  int64_t steps() const { return steps_; }
  // Real images shown to the discriminator so far (all replicas).
  int64_t images_seen() const { return steps_ * config_.n_critic() * config_.batch_size(); }
  // Losses of the last step, averaged over replicas.
  double discriminator_loss() const { return d_loss_; }
  double generator_loss() const { return g_loss_; }
  // Learning rates of step `step` (warmup and scaling applied).
  float GeneratorLearningRate(int64_t step) const;
  float DiscriminatorLearningRate(int64_t step) const;

  // Images [count, 1, 28, 28] in [0, 1] from noise rows [first, first + count)
  // of noise stream `stream`, by the EMA generator (the online one when EMA
  // is off), with batch statistics over chunks of 500.
  void Generate(uint64_t stream, int64_t first, int64_t count, float* out);

  // Writes replica 0's current weights to `path` for a reference
  // implementation to start from (bench/peers/libtorch_gan_reference.cc
  // imports them):
  // one file in troupe's checkpoint format (engine/nn/checkpoint.h: per
  // tensor its name, shape and float32 data, then a checksum) holding the
  // generator's parameters (g.*), the discriminator's (d.*) and its spectral
  // norm's power-iteration vectors (d.*.u, d.*.v), named as gan/networks.cc
  // declares them. Errors: PermissionDenied / DataLoss naming the path.
  absl::Status ExportWeights(const std::string& path) const;

  // A checkpoint in `dir`: one generation (common/generations.h) holding
  // generator.ckpt and discriminator.ckpt (weights + Adam),
  // generator_ema.ckpt, discriminator_power_vectors.ckpt, the caller's
  // `extra_files` (name, contents) and counters.txt, committed at once by
  // its manifest; the newest gan.keep_checkpoints generations are kept. A
  // process killed at any moment leaves the last committed generation
  // whole. Errors: ErrnoStatus-style, naming the file (ResourceExhausted
  // for a full disk); the partial generation is then removed.
  absl::Status SaveCheckpoint(const std::string& dir,
                              const std::vector<std::pair<std::string, std::string>>& extra_files = {}) const;
  // Restores every replica from the newest usable generation in `dir`,
  // passing over (and appending to `passed_over` why) newer ones that are
  // damaged or were cut short; a folder of the layout before generations
  // (the files directly in `dir`, or in DIR.new when a swap was killed)
  // resumes too. Returns the folder it read (where the extra files are).
  // Errors: NotFound when there is no usable checkpoint, saying why each
  // was passed over; InvalidArgument naming the file (e.g. a model of
  // another size).
  absl::StatusOr<std::string> LoadCheckpoint(const std::string& dir, std::vector<std::string>* passed_over = nullptr);

  // Everything SaveCheckpoint writes for local replica r, on the host: each
  // file's tensors named "FILE/ENTRY" (generator.ckpt/param/g.fc.w,
  // generator.ckpt/adam.m/g.fc.w, ...), then counters.txt's steps as an
  // int64 tensor. Tests compare whole states through it.
  std::vector<nn::CheckpointTensor> CheckpointState(int r = 0) const;

  // Replica r's networks' values (tests: replication is exact; with
  // engine.shard_state PARAMETERS their layout only, the values split).
  nn::ParameterSet& generator_parameters(int r);
  nn::ParameterSet& discriminator_parameters(int r);
  nn::ParameterSet& generator_ema();
  // The generator's parameters a replica holds, and the whole generator's
  // (equal without model_parallel).
  int64_t generator_floats_per_replica() const;
  int64_t generator_floats() const;
  // The optimizers' state a replica keeps between steps, in bytes (Adam's
  // two moments of both networks, or its part of them with
  // engine.shard_state OPTIMIZER; LAMB's and LARS's own).
  int64_t optimizer_state_bytes() const;
  // The networks a replica keeps between steps, in bytes: the generator's
  // and discriminator's values and gradients, the EMA's and the power
  // vectors' values, or with engine.shard_state PARAMETERS its parts of
  // them (the power vectors whole).
  int64_t parameter_state_bytes() const;
  // The most any local replica's device held at once (gan.engine.
  // device_memory_mib caps each: nn::Backend's memory budget).
  size_t peak_device_memory() const;
  int num_local_replicas() const { return static_cast<int>(replicas_.size()); }
  int num_replicas() const;  // in every process (MPI ranks)
  bool is_chief() const;  // the replica that evaluates and writes files (local replica 0 of rank 0)

  // engine.shard_state OPTIMIZER or PARAMETERS over MPI ranks (collectives
  // MPI or NCCL_MPI), or a generator split by engine.model_parallel over
  // them: each rank keeps its replicas' parts of the moments, of the
  // networks or of the generator,
  // so a checkpoint or an evaluation needs the other ranks'. The ranks
  // agree on the step of every checkpoint (AgreeWithChief: the chief
  // decides; evaluations are at steps every rank knows), every rank gathers
  // what is split (PrepareCheckpoint, a collective), then the chief saves or
  // evaluates; it is released at the next Train. Elsewhere both are no-ops
  // (the parts are gathered from this process at the save).
  bool state_split_across_processes() const;
  absl::Status PrepareCheckpoint();
  // Every rank's copy of the chief's `chief_wants` (a collective when the
  // state is split across processes; `chief_wants` itself otherwise).
  absl::StatusOr<bool> AgreeWithChief(bool chief_wants);

 private:
  struct Replica;
  GanTrainer() = default;
  absl::Status Step(replicator::ReplicaContext& ctx, Replica& r);
  // The files of a checkpoint and what each holds, for local replica r: the
  // one list SaveCheckpoint and CheckpointState read.
  struct NetworkFile {
    const char* file;
    const nn::ParameterSet* parameters;
    nn::Optimizer* optimizer;  // null: weights only
  };
  std::vector<NetworkFile> NetworkFiles(int r) const;
  // Loads counters.txt and every network's file from `folder` into every
  // replica; DataLoss for a damaged or missing file.
  absl::Status LoadFrom(const std::string& folder);
  // With model_parallel: the whole generator (values, Adam's moments and
  // steps, the EMA) on the host, from the parts of model copy `copy` (local
  // replicas copy x M .. copy x M + M - 1), or into every local replica's part.
  // With shard_state PARAMETERS the discriminator's (and its moments') too,
  // from every local replica's part, or into them.
  struct WholeGenerator;
  void GatherGenerator(int copy = 0) const;
  // With shard_state OPTIMIZER: every replica's part of the moments into
  // local replica r's whole ones (its optimizers' State()), and released.
  void GatherMoments(int r) const;
  bool moments_gathered_ = false;  // PrepareCheckpoint's, until the next Train
  // A generator split over MPI ranks: PrepareCheckpoint's copy of every part
  // of this rank's model copy, [part][GeneratorBuffers' buffer], until the
  // next Train.
  std::vector<std::vector<std::vector<float>>> generator_parts_on_host_;
  // shard_state PARAMETERS over MPI ranks: PrepareCheckpoint's whole values
  // of each split network and moments of each split Adam (SplitNetworks',
  // SplitOptimizers' order, padded lengths), until the next Train.
  struct SplitOnHost {
    std::vector<std::vector<float>> values;
    std::vector<std::vector<std::vector<float>>> moments;
  };
  SplitOnHost split_on_host_;
  void ReleaseMoments(int r) const;
  void ScatterGenerator();
  // shard_state PARAMETERS: GatherGenerator's and ScatterGenerator's work.
  void GatherSplitParameters() const;
  void ScatterSplitParameters();

  config::GanConfig config_;
  const GanData* data_ = nullptr;
  std::unique_ptr<replicator::Replicator> replicator_;
  std::vector<std::unique_ptr<Replica>> replicas_;  // one per local replica
  std::unique_ptr<Generator> generator_;  // a part's with model_parallel
  std::unique_ptr<Discriminator> discriminator_;
  int model_parallel_ = 1;
  bool split_parameters_ = false;  // engine.shard_state PARAMETERS
  std::unique_ptr<Generator> whole_generator_;   // with model_parallel or split_parameters_
  mutable std::unique_ptr<WholeGenerator> whole_;  // with model_parallel or split_parameters_: GatherGenerator's
  int64_t steps_ = 0;
  double d_loss_ = 0, g_loss_ = 0;
  double lr_scale_ = 1;
  int64_t warmup_steps_ = 0;
  double ema_decay_ = 0;
};

}  // namespace troupe::gan

#endif  // TROUPE_GAN_TRAINER_H_
