// Trains the Fashion-MNIST classifier end to end and keeps its checkpoint
// (build dir: fashion_mnist_classifier.ckpt) for the GAN mode's FID.
#include "gan/fashion_classifier.h"

#include <cstdio>
#include <filesystem>

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

}  // namespace
}  // namespace troupe::gan
