// `troupe run` in mode GAN: the GAN trainer with evaluation, metrics,
// checkpoints and a status line. No actors, no replay: the input_fn reads the
// Fashion-MNIST training set.
//
// Run directory (common/run_layout.h owns its layout and columns):
//   config.textproto            the resolved config (written by the launcher)
//   metrics.csv                 images, steps, losses, learning rates, images/s
//   eval.csv                    images, steps, classifier-FID, classifier score
//   fid_curve.png               classifier-FID against images seen
//   samples/samples-<images>.png  the EMA generator's 8x8 grid at each evaluation
//   samples.png                 the latest grid
//   checkpoints/generation-N/   trainer checkpoints, the newest gan.keep_checkpoints
//                               (see GanTrainer::SaveCheckpoint)
//   events.out.tfevents.*       TensorBoard (config `tensorboard`): the metrics and
//                               eval scalars and the grids, at step = steps
// The FID classifier is cached at gan.classifier_checkpoint (default
// ~/.cache/troupe/fashion_mnist_classifier.ckpt) and trained on first use.
#ifndef TROUPE_GAN_RUN_H_
#define TROUPE_GAN_RUN_H_

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "proto/config.pb.h"

namespace troupe::gan {

// Trains until gan.total_images or *stop (then checkpoints), evaluating at
// the start, every gan.eval_every_images and at the end. `run_dir` exists;
// with `resume`, continues from run_dir/checkpoints. Errors: config errors
// naming the field, missing data naming the Debian package, checkpoint errors.
absl::Status RunGan(const config::ExperimentConfig& config, const std::string& run_dir, bool resume,
                    const std::atomic<bool>* stop);

}  // namespace troupe::gan

#endif  // TROUPE_GAN_RUN_H_
