// The reference GAN: bench/peers/libtorch_gan.cc in training mode, the same
// GAN as troupe's GanTrainer (networks, losses, Adam, learning-rate scaling
// and warmup, generator EMA) in libtorch, started from troupe's exported
// initial weights (GanTrainer::ExportWeights) and fed the same stream of
// Fashion-MNIST images and the same noise. `troupe bench gan` scores its EMA
// generator's samples with troupe's classifier-FID next to troupe's own;
// bench/gan_reference_test checks the two step by step. libtorch (Debian's
// libtorch-dev) is a comparison peer only, compiled at run time.
#ifndef TROUPE_BENCH_GAN_REFERENCE_H_
#define TROUPE_BENCH_GAN_REFERENCE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/config.pb.h"

namespace troupe::bench {

struct GanReferenceOptions {
  std::string weights;   // GanTrainer::ExportWeights' file: required
  int64_t steps = 1;     // generator updates (each after gan.n_critic D updates)
  int64_t samples = 0;   // EMA generator samples to return (0: none)
  std::string samples_path;  // where the peer writes them; empty: in the temp dir
  int threads = 2;       // the peer's intra-op threads
  bool per_step_losses = false;  // return every step's D and G losses
};

struct GanReferenceRun {
  std::vector<double> discriminator_losses, generator_losses;  // per step, with per_step_losses
  std::vector<float> samples;  // [samples, 1, 28, 28] in [0, 1], as GanTrainer::Generate draws them
  double train_seconds = 0;    // the training loop's wall time in the peer
};

// The peer's arguments after THREADS: "train" and `config`'s fields as
// KEY=VALUE (floats to 9 significant digits, so they round-trip).
std::string LibtorchGanArguments(const config::GanConfig& config, const GanReferenceOptions& options);

// Compiles the peer if needed and trains it. Errors: NotFound without
// libtorch-dev; Unimplemented for gan.optimizer LAMB / LARS (the peer has
// Adam only); Internal with the peer's own message otherwise (a missing
// weights file or a tensor of another shape names the file and the tensor).
absl::StatusOr<GanReferenceRun> RunLibtorchGanReference(const config::GanConfig& config,
                                                         const GanReferenceOptions& options);

// The samples file the peer writes: one tensor "samples" [N, 1, 28, 28] in
// troupe's checkpoint format (engine/nn/checkpoint.h). Errors: NotFound /
// DataLoss as nn::ReadCheckpoint; InvalidArgument naming the file, the
// tensor and its shape when it holds anything else.
absl::StatusOr<std::vector<float>> ReadGanSamples(const std::string& path);

}  // namespace troupe::bench

#endif  // TROUPE_BENCH_GAN_REFERENCE_H_
