// Evaluation for the GAN mode: classifier-FID (fid.h) of generated images
// against the test set, the classifier score, and sample grids.
//
// Not thread-safe; call between GanTrainer::Train() calls.
#ifndef TROUPE_GAN_EVALUATOR_H_
#define TROUPE_GAN_EVALUATOR_H_

#include <memory>

#include "common/image.h"
#include "gan/data.h"
#include "gan/fid.h"
#include "gan/trainer.h"

namespace troupe::gan {

struct Evaluation {
  double fid = 0;               // classifier-FID against the test images
  double classifier_score = 0;  // Inception-score formula on the classifier
  double seconds = 0;
};

// The noise stream evaluation samples are drawn from (fixed, so evaluations
// over a run compare the same latent points).
inline constexpr uint64_t kEvalNoiseStream = 0xE7A1000000000000ull;

class GanEvaluator {
 public:
  // Computes the test set's feature statistics (up to `real_samples` test images).
  GanEvaluator(FidClassifier* classifier, const GanData& data, int64_t real_samples = 10000);

  // FID and classifier score of `samples` images from the trainer's EMA generator.
  Evaluation Evaluate(GanTrainer& trainer, int64_t samples);
  // The same of `samples` images [samples, 1, 28, 28] in [0, 1] made
  // elsewhere (a reference implementation's samples).
  Evaluation EvaluateImages(const float* images, int64_t samples);
  // The floor: FID of the first `samples` training images against the test images.
  double RealAgainstRealFid(const GanData& data, int64_t samples);
  const FeatureStats& test_stats() const { return test_stats_; }

 private:
  FidClassifier* classifier_;
  FeatureStats test_stats_;
  std::vector<float> images_, features_, probabilities_;
};

// An 8x8 grid (rows x rows) of generated 28x28 images, scaled 2x with a
// 2-pixel border, grey.
Image SampleGrid(GanTrainer& trainer, int rows = 8);

}  // namespace troupe::gan

#endif  // TROUPE_GAN_EVALUATOR_H_
