// A small convnet classifier for Fashion-MNIST (28x28 grey, 10 classes):
// conv 3x3 32 / conv 3x3 32 stride 2 / conv 3x3 64 stride 2 / linear 128 /
// linear 10, ReLU between. Its 128-wide penultimate layer is the feature
// space the GAN mode's FID uses, so the trained checkpoint is kept.
#ifndef TROUPE_GAN_FASHION_CLASSIFIER_H_
#define TROUPE_GAN_FASHION_CLASSIFIER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/nn/backend.h"
#include "engine/nn/layers.h"
#include "proto/config.pb.h"

namespace troupe::gan {

inline constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

class FashionClassifier {
 public:
  // Declares the parameters in `params` (allocate afterwards).
  explicit FashionClassifier(nn::ParameterSet& params);
  // images [n, 1, 28, 28] in [0, 1] -> logits [n, 10]; `features`, if given,
  // receives the 128-wide penultimate activations.
  nn::Var Logits(nn::Tape& tape, nn::ParameterSet& params, nn::Var images, nn::Var* features = nullptr) const;

 private:
  nn::Conv2dLayer conv1_, conv2_, conv3_;
  nn::LinearLayer fc1_, fc2_;
};

// Fashion-MNIST as floats in [0, 1], [n, 1, 28, 28], with labels.
struct FashionMnist {
  std::vector<float> train_images, test_images;
  std::vector<int32_t> train_labels, test_labels;
};
// Reads the four IDX files from `dir` (Debian's dataset-fashion-mnist layout),
// validating magic numbers, sizes and the 60000/10000 counts.
absl::StatusOr<FashionMnist> LoadFashionMnist(const std::string& dir = kFashionMnistDir);

struct TrainOptions {
  int epochs = 2;
  int batch = 128;
  float learning_rate = 1e-3f;
  int threads = 2;
  config::EngineConfig::Device device = config::EngineConfig::CPU;  // where it trains
  uint64_t seed = 1;
  std::string checkpoint_path;  // written after training when non-empty
};

struct TrainResult {
  double test_accuracy = 0;
  double seconds = 0;
};

// A backend on `device` (GPU 0 for CUDA) with `threads` CPU threads: where
// the classifier and the FID network compute.
absl::StatusOr<std::unique_ptr<nn::Backend>> MakeDevice(config::EngineConfig::Device device, int threads);

// Trains the classifier with Adam and evaluates it on the test set.
absl::StatusOr<TrainResult> TrainFashionClassifier(const FashionMnist& data, const TrainOptions& options);

}  // namespace troupe::gan

#endif  // TROUPE_GAN_FASHION_CLASSIFIER_H_
