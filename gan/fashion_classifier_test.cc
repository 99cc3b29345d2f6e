// Trains the Fashion-MNIST classifier end to end and keeps its checkpoint
// (build dir: fashion_mnist_classifier.ckpt) for the GAN mode's FID.
#include "gan/fashion_classifier.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "gan/fid.h"
#include "gtest/gtest.h"

namespace troupe::gan {
namespace {

TEST(FashionClassifierTest, ReachesAtLeast88PercentTestAccuracy) {
  auto data = LoadFashionMnist();
  ASSERT_TRUE(data.ok()) << data.status() << " (install Debian's dataset-fashion-mnist)";
  TrainOptions options;
  options.epochs = 2;
  options.batch = 64;
  // Kept beside the test binary (the build dir), not in the source tree.
  options.checkpoint_path =
      (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "fashion_mnist_classifier.ckpt").string();
  auto result = TrainFashionClassifier(*data, options);
  ASSERT_TRUE(result.ok()) << result.status();
  std::printf("fashion-mnist test accuracy %.4f after %d epochs in %.1f s; checkpoint %s\n", result->test_accuracy,
              options.epochs, result->seconds, options.checkpoint_path.c_str());
  EXPECT_GE(result->test_accuracy, 0.88);
}

TEST(FashionClassifierTest, MissingDatasetIsAClearError) {
  auto data = LoadFashionMnist("/nonexistent");
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(data.status().message().find("/nonexistent/train-images-idx3-ubyte.gz"), std::string::npos);
}

// Random 28x28 images with labels, `train` and `test` of them.
FashionMnist SyntheticData(int train, int test) {
  FashionMnist data;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> pixel(0.0f, 1.0f);
  data.train_images.resize(int64_t{train} * 784);
  data.test_images.resize(int64_t{test} * 784);
  for (float& x : data.train_images) x = pixel(rng);
  for (float& x : data.test_images) x = pixel(rng);
  for (int i = 0; i < train; ++i) data.train_labels.push_back(i % 10);
  for (int i = 0; i < test; ++i) data.test_labels.push_back(i % 10);
  return data;
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// The classifier trained on the strict CPU device (memory the host cannot
// touch) writes the CPU's checkpoint byte for byte, and the FID network on
// that device gives the CPU's features and probabilities bit for bit.
TEST(FashionClassifierTest, TrainsAndEvaluatesOnTheStrictDeviceAsOnTheCpu) {
  const FashionMnist data = SyntheticData(/*train=*/256, /*test=*/40);
  const std::string dir = (std::filesystem::temp_directory_path() / ("troupe_strict_" + std::to_string(getpid()))).string();
  std::filesystem::create_directories(dir);
  std::vector<std::vector<float>> features(2), probabilities(2);
  std::vector<double> accuracy(2);
  for (const config::EngineConfig::Device device : {config::EngineConfig::CPU, config::EngineConfig::CPU_STRICT}) {
    const int k = device == config::EngineConfig::CPU ? 0 : 1;
    TrainOptions options;
    options.epochs = 1;
    options.batch = 32;
    options.threads = 1;
    options.device = device;
    options.checkpoint_path = dir + "/classifier" + std::to_string(k) + ".ckpt";
    auto result = TrainFashionClassifier(data, options);
    ASSERT_TRUE(result.ok()) << result.status();
    accuracy[k] = result->test_accuracy;
    FidClassifier::Options fid;
    fid.checkpoint = options.checkpoint_path;
    fid.threads = 1;
    fid.device = device;
    auto classifier = FidClassifier::LoadOrTrain(fid);
    ASSERT_TRUE(classifier.ok()) << classifier.status();
    features[k].resize(40 * kFeatureSize);
    probabilities[k].resize(40 * kClasses);
    (*classifier)->Evaluate(data.test_images.data(), 40, features[k].data(), probabilities[k].data());
  }
  EXPECT_EQ(Slurp(dir + "/classifier0.ckpt"), Slurp(dir + "/classifier1.ckpt"));
  EXPECT_EQ(accuracy[0], accuracy[1]);
  EXPECT_EQ(features[0], features[1]);
  EXPECT_EQ(probabilities[0], probabilities[1]);
  EXPECT_NE(features[0], std::vector<float>(features[0].size(), 0.0f));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace troupe::gan
