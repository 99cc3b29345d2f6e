// The libtorch reference GAN (bench/peers/libtorch_gan.cc) against troupe's
// GanTrainer: from the same exported initial weights, on the same images and
// noise, the first kSteps steps' D and G losses agree step by step and so do
// the EMA generator's samples; a reference given a wrong learning rate does
// not agree (the comparison can fail); bad input names the file and tensor.
// Skipped, saying so, without libtorch-dev or Fashion-MNIST.
#include "bench/gan_reference.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/peers.h"
#include "engine/nn/checkpoint.h"
#include "gan/data.h"
#include "gan/evaluator.h"
#include "gan/trainer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::bench {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr int kSteps = 20;
constexpr int64_t kSamples = 600;  // more than one chunk of 500 in Generate
// Largest |troupe - reference| allowed for a loss at any step: float32 sums
// in another order (libtorch's convolutions, troupe's GEMMs) over 20 Adam
// steps. The losses themselves move by far more over those steps (checked).
constexpr double kLossTolerance = 2e-3;
// Largest |troupe - reference| allowed for a sample pixel (in [0, 1]).
constexpr double kPixelTolerance = 2e-3;

// A small GAN whose learning rates matter within kSteps: batch 32 from base
// batch 64 (linear scaling halves the rates), warmup over the first 10 steps,
// full rates after, an EMA with a short half-life.
config::GanConfig SmallConfig() {
  config::GanConfig c;
  c.set_batch_size(32);
  c.set_base_batch_size(64);
  c.set_lr_scaling(config::GanConfig::LINEAR);
  c.set_warmup_images(10 * 32);
  c.set_noise_size(32);
  c.set_generator_channels(16);
  c.set_discriminator_channels(16);
  c.set_generator_learning_rate(1e-3f);
  c.set_discriminator_learning_rate(2e-3f);
  c.set_ema_half_life_images(5 * 32);
  c.mutable_engine()->set_threads(2);
  c.mutable_engine()->set_seed(7);
  return c;
}

struct Losses {
  std::vector<double> d, g;
};

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / absl::StrCat("gan_reference_test_", getpid(), "_", name)).string();
}

double MaxAbsDifference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

class GanReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kLibtorchHeader)) {
      GTEST_SKIP() << "libtorch-dev is not installed (" << kLibtorchHeader
                   << " missing): no reference GAN to compare with; apt-get install libtorch-dev to run this test";
    }
    absl::StatusOr<gan::GanData> data = gan::LoadGanData(config_.data_dir());
    if (!data.ok()) GTEST_SKIP() << "Fashion-MNIST not installed: " << data.status();
    data_ = *std::move(data);
    weights_ = TempPath("weights.ckpt");
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove(weights_, ignored);
  }

  // troupe's trainer for `config`, its initial weights exported to weights_.
  std::unique_ptr<gan::GanTrainer> NewTrainer(const config::GanConfig& config) {
    absl::StatusOr<std::unique_ptr<gan::GanTrainer>> trainer = gan::GanTrainer::Create(config, &data_);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    if (!trainer.ok()) return nullptr;
    absl::Status exported = (*trainer)->ExportWeights(weights_);
    EXPECT_TRUE(exported.ok()) << exported;
    return *std::move(trainer);
  }

  // kSteps steps of troupe, with every step's losses.
  Losses TrainTroupe(gan::GanTrainer& trainer) {
    Losses losses;
    for (int step = 0; step < kSteps; ++step) {
      absl::Status trained = trainer.Train(1);
      EXPECT_TRUE(trained.ok()) << trained;
      losses.d.push_back(trainer.discriminator_loss());
      losses.g.push_back(trainer.generator_loss());
    }
    return losses;
  }

  absl::StatusOr<GanReferenceRun> TrainReference(const config::GanConfig& config, int64_t samples = 0) {
    GanReferenceOptions options;
    options.weights = weights_;
    options.steps = kSteps;
    options.samples = samples;
    options.per_step_losses = true;
    options.threads = 1;  // libtorch's OpenMP threads spin when ctest runs tests side by side
    return RunLibtorchGanReference(config, options);
  }

  config::GanConfig config_ = SmallConfig();
  gan::GanData data_;
  std::string weights_;
};

TEST_F(GanReferenceTest, LossesMatchTroupeStepByStepFromTheSameWeightsAndBatches) {
  std::unique_ptr<gan::GanTrainer> trainer = NewTrainer(config_);
  ASSERT_NE(trainer, nullptr);
  const Losses troupe = TrainTroupe(*trainer);
  absl::StatusOr<GanReferenceRun> reference = TrainReference(config_);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(reference->discriminator_losses.size(), static_cast<size_t>(kSteps));
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(troupe.d[step], reference->discriminator_losses[step], kLossTolerance) << "D loss, step " << step;
    EXPECT_NEAR(troupe.g[step], reference->generator_losses[step], kLossTolerance) << "G loss, step " << step;
  }
  std::printf("worst |troupe - reference| over %d steps: D loss %.3g, G loss %.3g\n", kSteps,
              MaxAbsDifference(troupe.d, reference->discriminator_losses),
              MaxAbsDifference(troupe.g, reference->generator_losses));
  // The losses move by much more than the tolerance: the agreement says something.
  auto range = [](const std::vector<double>& v) {
    return *std::max_element(v.begin(), v.end()) - *std::min_element(v.begin(), v.end());
  };
  EXPECT_GT(range(troupe.d), 20 * kLossTolerance);
  EXPECT_GT(range(troupe.g), 20 * kLossTolerance);
}

TEST_F(GanReferenceTest, EmaSamplesMatchTroupesGenerate) {
  std::unique_ptr<gan::GanTrainer> trainer = NewTrainer(config_);
  ASSERT_NE(trainer, nullptr);
  std::vector<float> initial(kSamples * gan::kPixels), troupe(kSamples * gan::kPixels);
  trainer->Generate(gan::kEvalNoiseStream, 0, kSamples, initial.data());
  TrainTroupe(*trainer);
  trainer->Generate(gan::kEvalNoiseStream, 0, kSamples, troupe.data());
  absl::StatusOr<GanReferenceRun> reference = TrainReference(config_, kSamples);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_EQ(reference->samples.size(), troupe.size());
  double worst = 0, moved = 0;
  for (size_t i = 0; i < troupe.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(troupe[i] - reference->samples[i])));
    moved = std::max(moved, static_cast<double>(std::abs(troupe[i] - initial[i])));
  }
  std::printf("EMA samples: worst |troupe - reference| %.3g; moved by training up to %.3g\n", worst, moved);
  EXPECT_LE(worst, kPixelTolerance);
  // Training moved the EMA generator: equal samples are not just equal initial weights.
  EXPECT_GT(moved, 20 * kPixelTolerance);
}

// The comparison can fail: a reference that differs from troupe in one
// learning rate (or in the scaling rule) leaves the tolerance.
TEST_F(GanReferenceTest, AReferenceWithAWrongLearningRateDisagrees) {
  std::unique_ptr<gan::GanTrainer> trainer = NewTrainer(config_);
  ASSERT_NE(trainer, nullptr);
  const Losses troupe = TrainTroupe(*trainer);
  config::GanConfig wrong_d = config_, wrong_g = config_, wrong_scaling = config_;
  wrong_d.set_discriminator_learning_rate(config_.discriminator_learning_rate() * 1.25f);
  wrong_g.set_generator_learning_rate(config_.generator_learning_rate() * 1.25f);
  wrong_scaling.set_lr_scaling(config::GanConfig::NONE);
  for (const auto& [what, config] : {std::pair{"D rate x1.25", wrong_d}, {"G rate x1.25", wrong_g},
                                     {"no scaling", wrong_scaling}}) {
    absl::StatusOr<GanReferenceRun> reference = TrainReference(config);
    ASSERT_TRUE(reference.ok()) << what << ": " << reference.status();
    const double worst = std::max(MaxAbsDifference(troupe.d, reference->discriminator_losses),
                                  MaxAbsDifference(troupe.g, reference->generator_losses));
    std::printf("reference with %s: worst loss difference %.3g\n", what, worst);
    EXPECT_GT(worst, 2 * kLossTolerance) << what;
  }
}

TEST_F(GanReferenceTest, AMissingWeightsFileIsNamed) {
  absl::StatusOr<GanReferenceRun> reference = TrainReference(config_);  // weights_ not written
  ASSERT_FALSE(reference.ok());
  // The peer's own message (the command line, also in the status, names the file too).
  EXPECT_THAT(reference.status().message(), HasSubstr("libtorch_gan: cannot open the weights file " + weights_));
}

TEST_F(GanReferenceTest, AWeightOfAnotherShapeIsNamedWithBothShapes) {
  config::GanConfig wider = config_;
  wider.set_generator_channels(24);
  ASSERT_NE(NewTrainer(wider), nullptr);  // exports generator weights for 24 channels
  absl::StatusOr<GanReferenceRun> reference = TrainReference(config_);  // a peer built for 16
  ASSERT_FALSE(reference.ok());
  EXPECT_THAT(reference.status().message(),
              AllOf(HasSubstr(weights_ + ": tensor g.fc.w has shape [32, 2352]"), HasSubstr("wants [32, 1568]")));
}

// Without libtorch: the samples file reader.
TEST(GanSamplesFileTest, ReadGanSamplesNamesTheFileAndWhatItHolds) {
  const std::string path = TempPath("samples.ckpt");
  EXPECT_THAT(ReadGanSamples(path).status().message(), HasSubstr(path));
  ASSERT_TRUE(nn::WriteCheckpoint(path, {{"images", nn::Shape{2, 784}, std::vector<float>(2 * 784)}}).ok());
  absl::StatusOr<std::vector<float>> wrong = ReadGanSamples(path);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), AllOf(HasSubstr(path), HasSubstr("\"images\" of shape [2, 784]")));
  ASSERT_TRUE(nn::WriteCheckpoint(path, {{"samples", nn::Shape{3, 1, 28, 28}, std::vector<float>(3 * 784, 0.5f)}}).ok());
  absl::StatusOr<std::vector<float>> right = ReadGanSamples(path);
  ASSERT_TRUE(right.ok()) << right.status();
  EXPECT_EQ(right->size(), 3u * 784);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace troupe::bench
