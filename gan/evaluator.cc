#include "gan/evaluator.h"

#include <algorithm>
#include <chrono>

namespace troupe::gan {

GanEvaluator::GanEvaluator(FidClassifier* classifier, const GanData& data, int64_t real_samples)
    : classifier_(classifier) {
  const int64_t n = std::min(real_samples, data.test_count);
  features_.resize(n * kFeatureSize);
  classifier_->Evaluate(data.test.data(), n, features_.data(), nullptr);
  test_stats_ = ComputeFeatureStats(features_.data(), n, kFeatureSize);
}

Evaluation GanEvaluator::Evaluate(GanTrainer& trainer, int64_t samples) {
  const auto start = std::chrono::steady_clock::now();
  images_.resize(samples * kPixels);
  trainer.Generate(kEvalNoiseStream, 0, samples, images_.data());
  Evaluation e = EvaluateImages(images_.data(), samples);
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return e;
}

Evaluation GanEvaluator::EvaluateImages(const float* images, int64_t samples) {
  const auto start = std::chrono::steady_clock::now();
  features_.resize(samples * kFeatureSize);
  probabilities_.resize(samples * kClasses);
  // Classify, compare with the test set's statistics.
  classifier_->Evaluate(images, samples, features_.data(), probabilities_.data());
  Evaluation e;
  e.fid = FrechetDistance(ComputeFeatureStats(features_.data(), samples, kFeatureSize), test_stats_);
  e.classifier_score = ClassifierScore(probabilities_.data(), samples, kClasses);
  e.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return e;
}

double GanEvaluator::RealAgainstRealFid(const GanData& data, int64_t samples) {
  const int64_t n = std::min(samples, data.train_count);
  features_.resize(n * kFeatureSize);
  classifier_->Evaluate(data.train01.data(), n, features_.data(), nullptr);
  return FrechetDistance(ComputeFeatureStats(features_.data(), n, kFeatureSize), test_stats_);
}

Image SampleGrid(GanTrainer& trainer, int rows) {
  constexpr int kScale = 2, kBorder = 2;
  const int cell = kImageSize * kScale + kBorder;
  std::vector<float> images(int64_t{rows} * rows * kPixels);
  trainer.Generate(kEvalNoiseStream, 0, int64_t{rows} * rows, images.data());
  Image grid(rows * cell + kBorder, rows * cell + kBorder, 1);
  std::fill(grid.pixels.begin(), grid.pixels.end(), 64);
  for (int k = 0; k < rows * rows; ++k) {
    const int x0 = kBorder + (k % rows) * cell, y0 = kBorder + (k / rows) * cell;
    for (int y = 0; y < kImageSize * kScale; ++y) {
      for (int x = 0; x < kImageSize * kScale; ++x) {
        const float v = images[k * kPixels + (y / kScale) * kImageSize + x / kScale];
        *grid.at(x0 + x, y0 + y) = static_cast<uint8_t>(std::clamp(v, 0.0f, 1.0f) * 255.0f + 0.5f);
      }
    }
  }
  return grid;
}

}  // namespace troupe::gan
