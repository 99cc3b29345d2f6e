// The reference GAN: bench/peers/libtorch_gan_reference.cc, the same
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
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gan/trainer.h"
#include "proto/config.pb.h"

namespace troupe::bench {

struct GanReferenceOptions {
  std::string weights;   // GanTrainer::ExportWeights' file: required
  int64_t steps = 1;     // generator updates (each after gan.n_critic D updates)
  int64_t samples = 0;   // EMA generator samples to return (0: none)
  std::string samples_path;  // where the peer writes them; empty: in the temp dir
  int threads = 2;       // the peer's intra-op threads
  bool per_step_losses = false;  // return every step's D and G losses
  // A resumable run: the peer's state file. When it exists the peer
  // continues from its step (it must have been written with the same config
  // and initial weights, else the run fails naming the setting); every
  // save_every steps and at the end the peer rewrites it. Empty: none.
  std::string state_path;
  int64_t save_every = 500;
  // Gets the peer's progress lines as they come ("resumed at step S of N
  // from FILE", "step S of N, images/s X..."); may be empty.
  std::function<void(const std::string&)> progress;
};

struct GanReferenceRun {
  int64_t first_step = 0;  // the step a resumed run started at (0: from the initial weights)
  // Per step from first_step, with per_step_losses.
  std::vector<double> discriminator_losses, generator_losses;
  std::vector<float> samples;  // [samples, 1, 28, 28] in [0, 1], as GanTrainer::Generate draws them
  double train_seconds = 0;    // the training loop's wall time in the peer, over every piece of a resumed run
};

// The peer's arguments after THREADS: `config`'s fields as KEY=VALUE
// (floats to 9 significant digits, so they round-trip).
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

// --- The comparison's work directory (troupe bench gan) ---------------------
// troupe's half of the comparison (trained once) and the reference's state
// live in a directory per comparison, so that a run cut off part way resumes
// where it stopped and a finished half is not trained again.

// troupe's half of a finished comparison.
struct TroupeHalf {
  int64_t images = 0;  // real images shown to D
  double fid = 0;      // classifier-FID of the EMA generator
  double discriminator_loss = 0, generator_loss = 0;  // of the last step
  double seconds = 0;  // training wall time, over every piece
};

// The text that keys a comparison: everything its figures depend on (the
// images, the samples drawn for the FID, the whole GAN config), one line.
std::string ReferenceComparisonKey(const config::GanConfig& config, int64_t images, int64_t samples);

// The comparison's own directory under `root`: ROOT/images<N>-<16 hex digits
// of the key's FNV-1a hash>, the same for the same key on every run and
// machine, so another N or config starts afresh beside it.
std::string ReferenceComparisonDirectory(const std::string& root, int64_t images, const std::string& key);

// Writes `half` with `key` to `path` (temporary file + rename). Errors:
// PermissionDenied / DataLoss naming the path.
absl::Status WriteTroupeHalf(const std::string& path, const std::string& key, const TroupeHalf& half);

// The half written to `path` for `key`. Errors: NotFound when there is no
// file; FailedPrecondition naming the path and both keys when it was written
// for another comparison (not reused); DataLoss naming the path when it
// cannot be parsed.
absl::StatusOr<TroupeHalf> ReadTroupeHalf(const std::string& path, const std::string& key);

// troupe's half while it trains: `trainer`'s checkpoint with its training
// seconds so far (seconds.txt) inside it, GanTrainer::SaveCheckpoint's
// crash-safe swap, so a kill at any moment leaves one complete checkpoint
// (DIR, or else DIR.new). Errors: the checkpoint's.
absl::Status SaveTroupeCheckpoint(const gan::GanTrainer& trainer, const std::string& dir, double seconds);

// Restores `trainer` from the complete checkpoint in DIR (else DIR.new) and
// returns the training seconds it had. NotFound when neither is complete;
// the checkpoint's own error, saying to remove it to start over, when it
// cannot be read.
absl::StatusOr<double> LoadTroupeCheckpoint(gan::GanTrainer& trainer, const std::string& dir);

}  // namespace troupe::bench

#endif  // TROUPE_BENCH_GAN_REFERENCE_H_
