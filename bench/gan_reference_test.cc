// The libtorch reference GAN (bench/peers/libtorch_gan_reference.cc) against
// troupe's GanTrainer: from the same exported initial weights, on the same images and
// noise, the first kSteps steps' D and G losses agree step by step and so do
// the EMA generator's samples; a reference given a wrong learning rate does
// not agree (the comparison can fail); bad input names the file and tensor.
// A reference run stopped and resumed from its state file ends as one
// uninterrupted run; a state of another config, or a corrupt one, is refused
// clearly. Skipped, saying so, without libtorch-dev or Fashion-MNIST. The
// comparison's work-directory helpers (troupe's finished half) need neither.
#include "bench/gan_reference.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
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
// Largest difference allowed between a resumed reference run and an
// uninterrupted one (the same arithmetic in the same order: in practice 0).
constexpr double kResumeTolerance = 1e-6;

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
    for (const std::string& path : {weights_, state_, state_ + ".tmp"}) std::filesystem::remove(path, ignored);
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

  // `steps` steps of the reference (resuming from state_ when `resumable`),
  // with every step's losses and `samples` EMA samples.
  absl::StatusOr<GanReferenceRun> TrainReference(const config::GanConfig& config, int64_t samples = 0,
                                                 int64_t steps = kSteps, bool resumable = false) {
    GanReferenceOptions options;
    options.weights = weights_;
    options.steps = steps;
    options.samples = samples;
    options.per_step_losses = true;
    options.threads = 1;  // libtorch's OpenMP threads spin when ctest runs tests side by side
    if (resumable) {
      options.state_path = state_;
      options.save_every = 3;  // saves part way as well as at the end
    }
    return RunLibtorchGanReference(config, options);
  }

  config::GanConfig config_ = SmallConfig();
  gan::GanData data_;
  std::string weights_;
  std::string state_ = TempPath("state.pt");
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
  EXPECT_THAT(reference.status().message(), HasSubstr("libtorch_gan_reference: cannot open the weights file " + weights_));
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

// A run stopped after half the steps and resumed from its state file (saved
// every 3 steps and at the end) ends as one uninterrupted run: the same loss
// at every step and the same EMA samples; run again once finished, it trains
// nothing and draws the same samples.
TEST_F(GanReferenceTest, AResumedRunMatchesOneUninterruptedRun) {
  ASSERT_NE(NewTrainer(config_), nullptr);
  constexpr int64_t kResumeSamples = 100;
  absl::StatusOr<GanReferenceRun> whole = TrainReference(config_, kResumeSamples);
  ASSERT_TRUE(whole.ok()) << whole.status();
  absl::StatusOr<GanReferenceRun> first =
      TrainReference(config_, /*samples=*/0, /*steps=*/kSteps / 2, /*resumable=*/true);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->first_step, 0);
  ASSERT_TRUE(std::filesystem::exists(state_));
  absl::StatusOr<GanReferenceRun> second = TrainReference(config_, kResumeSamples, kSteps, /*resumable=*/true);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->first_step, kSteps / 2);
  // The two pieces' losses, step by step, against the whole run's.
  Losses resumed = {first->discriminator_losses, first->generator_losses};
  resumed.d.insert(resumed.d.end(), second->discriminator_losses.begin(), second->discriminator_losses.end());
  resumed.g.insert(resumed.g.end(), second->generator_losses.begin(), second->generator_losses.end());
  ASSERT_EQ(resumed.d.size(), static_cast<size_t>(kSteps));
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(resumed.d[step], whole->discriminator_losses[step], kResumeTolerance) << "D loss, step " << step;
    EXPECT_NEAR(resumed.g[step], whole->generator_losses[step], kResumeTolerance) << "G loss, step " << step;
  }
  ASSERT_EQ(second->samples.size(), whole->samples.size());
  double worst = 0;
  for (size_t i = 0; i < whole->samples.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::abs(second->samples[i] - whole->samples[i])));
  }
  std::printf("resumed against whole: worst loss difference %.3g, worst pixel difference %.3g\n",
              std::max(MaxAbsDifference(resumed.d, whole->discriminator_losses),
                       MaxAbsDifference(resumed.g, whole->generator_losses)),
              worst);
  EXPECT_LE(worst, kResumeTolerance);
  // train_seconds counts both pieces.
  EXPECT_GE(second->train_seconds, first->train_seconds);
  // Finished: no step trained, the same samples, the time read back.
  absl::StatusOr<GanReferenceRun> finished = TrainReference(config_, kResumeSamples, kSteps, /*resumable=*/true);
  ASSERT_TRUE(finished.ok()) << finished.status();
  EXPECT_EQ(finished->first_step, kSteps);
  EXPECT_TRUE(finished->discriminator_losses.empty());
  EXPECT_EQ(finished->samples, second->samples);
  EXPECT_GE(finished->train_seconds, first->train_seconds);
  EXPECT_LE(finished->train_seconds, second->train_seconds + 1e-3);
}

// A state is resumed only by a run of the same settings and initial weights
// and no fewer steps: anything else is refused, naming the file and the
// setting (both values) or the step.
TEST_F(GanReferenceTest, AStateOfAnotherConfigIsRefusedNamingTheSetting) {
  ASSERT_NE(NewTrainer(config_), nullptr);
  ASSERT_TRUE(TrainReference(config_, /*samples=*/0, /*steps=*/2, /*resumable=*/true).ok());
  config::GanConfig two_critics = config_, other_rate = config_, other_seed = config_;
  two_critics.set_n_critic(2);
  other_rate.set_discriminator_learning_rate(config_.discriminator_learning_rate() * 2);
  other_seed.mutable_engine()->set_seed(8);
  absl::StatusOr<GanReferenceRun> refused = TrainReference(two_critics, 0, /*steps=*/4, /*resumable=*/true);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(),
              HasSubstr(state_ + ": the state was written with n_critic=1, this run has n_critic=2"));
  refused = TrainReference(other_rate, 0, /*steps=*/4, /*resumable=*/true);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), AllOf(HasSubstr(state_ + ": the state was written with d_lr=0.00200000009"),
                                                HasSubstr("this run has d_lr=0.00400000019")));
  refused = TrainReference(config_, 0, /*steps=*/1, /*resumable=*/true);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr(state_ + ": the state is at step 2, past this run's steps=1"));
  // The same settings from other initial weights.
  ASSERT_NE(NewTrainer(other_seed), nullptr);  // overwrites weights_
  refused = TrainReference(config_, 0, /*steps=*/4, /*resumable=*/true);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr(state_ + ": the state was written with weights_checksum="));
}

// A state file cut short (a full disk, a copy interrupted) or that is not a
// state at all is an error naming the file, not a crash or a fresh start.
TEST_F(GanReferenceTest, ATruncatedOrForeignStateFileIsAClearError) {
  ASSERT_NE(NewTrainer(config_), nullptr);
  ASSERT_TRUE(TrainReference(config_, /*samples=*/0, /*steps=*/2, /*resumable=*/true).ok());
  std::string bytes;
  {
    std::ifstream in(state_, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_GT(bytes.size(), 1000u);
  for (const std::string& contents : {bytes.substr(0, bytes.size() / 2), std::string("not a state file\n")}) {
    std::ofstream(state_, std::ios::binary | std::ios::trunc) << contents;
    absl::StatusOr<GanReferenceRun> run = TrainReference(config_, 0, /*steps=*/4, /*resumable=*/true);
    ASSERT_FALSE(run.ok());
    EXPECT_THAT(run.status().message(), HasSubstr(state_ + ": not a readable state file (corrupt or truncated?"))
        << contents.size() << " bytes";
  }
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

// Without libtorch: troupe's half checkpointed part way (SaveTroupeCheckpoint)
// and restored into a fresh trainer goes on as the uninterrupted one does,
// and a kill during a save leaves a checkpoint to resume from.
class TroupeCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<gan::GanData> data = gan::LoadGanData(config_.data_dir());
    if (!data.ok()) GTEST_SKIP() << "Fashion-MNIST not installed: " << data.status();
    data_ = *std::move(data);
  }
  void TearDown() override {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
    std::filesystem::remove_all(dir_ + ".new", ignored);
  }
  std::unique_ptr<gan::GanTrainer> NewTrainer() {
    absl::StatusOr<std::unique_ptr<gan::GanTrainer>> trainer = gan::GanTrainer::Create(config_, &data_);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    return trainer.ok() ? *std::move(trainer) : nullptr;
  }

  config::GanConfig config_ = SmallConfig();
  gan::GanData data_;
  std::string dir_ = TempPath("troupe_checkpoint");
};

TEST_F(TroupeCheckpointTest, ARestoredTrainerContinuesAsTheUninterruptedOne) {
  std::unique_ptr<gan::GanTrainer> whole = NewTrainer(), resumed = NewTrainer();
  ASSERT_NE(whole, nullptr);
  ASSERT_NE(resumed, nullptr);
  // Two saves: the second replaces the first.
  ASSERT_TRUE(whole->Train(2).ok());
  ASSERT_TRUE(SaveTroupeCheckpoint(*whole, dir_, /*seconds=*/1.5).ok());
  ASSERT_TRUE(whole->Train(1).ok());
  ASSERT_TRUE(SaveTroupeCheckpoint(*whole, dir_, /*seconds=*/2.5).ok());
  EXPECT_FALSE(std::filesystem::exists(dir_ + ".new"));
  ASSERT_TRUE(whole->Train(2).ok());
  absl::StatusOr<double> seconds = LoadTroupeCheckpoint(*resumed, dir_);
  ASSERT_TRUE(seconds.ok()) << seconds.status();
  EXPECT_EQ(*seconds, 2.5);
  EXPECT_EQ(resumed->steps(), 3);
  ASSERT_TRUE(resumed->Train(2).ok());
  // troupe's threaded kernels are not bitwise reproducible from run to run
  // (two uninterrupted trainers differ by ~1e-7), hence kResumeTolerance.
  EXPECT_NEAR(resumed->discriminator_loss(), whole->discriminator_loss(), kResumeTolerance);
  EXPECT_NEAR(resumed->generator_loss(), whole->generator_loss(), kResumeTolerance);
  std::vector<float> from_whole(10 * gan::kPixels), from_resumed(10 * gan::kPixels);
  whole->Generate(gan::kEvalNoiseStream, 0, 10, from_whole.data());
  resumed->Generate(gan::kEvalNoiseStream, 0, 10, from_resumed.data());
  for (size_t i = 0; i < from_whole.size(); ++i) ASSERT_NEAR(from_resumed[i], from_whole[i], kResumeTolerance) << i;
}

TEST_F(TroupeCheckpointTest, AKillDuringASaveLeavesACheckpointToResumeFrom) {
  std::unique_ptr<gan::GanTrainer> trainer = NewTrainer();
  ASSERT_NE(trainer, nullptr);
  ASSERT_TRUE(trainer->Train(1).ok());
  ASSERT_TRUE(SaveTroupeCheckpoint(*trainer, dir_, /*seconds=*/1).ok());
  ASSERT_TRUE(trainer->Train(1).ok());
  ASSERT_TRUE(SaveTroupeCheckpoint(*trainer, dir_, /*seconds=*/2).ok());
  // Killed while writing a third: its generation has files but no MANIFEST,
  // and is passed over.
  std::filesystem::create_directories(dir_ + "/generation-000000003");
  std::ofstream(dir_ + "/generation-000000003/counters.txt") << "steps 9\n";  // no seconds.txt, no MANIFEST
  std::unique_ptr<gan::GanTrainer> restored = NewTrainer();
  ASSERT_NE(restored, nullptr);
  absl::StatusOr<double> seconds = LoadTroupeCheckpoint(*restored, dir_);
  ASSERT_TRUE(seconds.ok()) << seconds.status();
  EXPECT_EQ(*seconds, 2);
  EXPECT_EQ(restored->steps(), 2);
  // The second damaged (its seconds.txt cut): the first is used.
  std::ofstream(dir_ + "/generation-000000002/seconds.txt", std::ios::trunc) << "2";
  restored = NewTrainer();
  ASSERT_NE(restored, nullptr);
  seconds = LoadTroupeCheckpoint(*restored, dir_);
  ASSERT_TRUE(seconds.ok()) << seconds.status();
  EXPECT_EQ(*seconds, 1);
  EXPECT_EQ(restored->steps(), 1);
  // Neither: NotFound, and the trainer untouched.
  std::filesystem::remove_all(dir_);
  restored = NewTrainer();
  ASSERT_NE(restored, nullptr);
  EXPECT_EQ(LoadTroupeCheckpoint(*restored, dir_).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(restored->steps(), 0);
}

// Without libtorch: troupe's finished half of the bench's comparison is
// reused by the same comparison only; another N, sample count or config
// reads as "not reused", a missing file as NotFound, a cut one as DataLoss.
TEST(ReferenceComparisonDirectoryTest, AFinishedTroupeHalfIsReusedOnlyForItsOwnComparison) {
  const config::GanConfig config = SmallConfig();
  config::GanConfig other_config = config;
  other_config.set_generator_learning_rate(2e-3f);
  const std::string key = ReferenceComparisonKey(config, /*images=*/3000, /*samples=*/2000);
  const std::string path = TempPath("troupe_result.txt");
  EXPECT_EQ(ReadTroupeHalf(path, key).status().code(), absl::StatusCode::kNotFound);
  TroupeHalf half;
  half.images = 3008;
  half.fid = 41.123456789;
  half.discriminator_loss = 1.5;
  half.generator_loss = 0.1;
  half.seconds = 812.25;
  ASSERT_TRUE(WriteTroupeHalf(path, key, half).ok());
  absl::StatusOr<TroupeHalf> read = ReadTroupeHalf(path, key);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->images, half.images);
  EXPECT_EQ(read->fid, half.fid);
  EXPECT_EQ(read->discriminator_loss, half.discriminator_loss);
  EXPECT_EQ(read->generator_loss, half.generator_loss);
  EXPECT_EQ(read->seconds, half.seconds);
  for (const std::string& other : {ReferenceComparisonKey(config, /*images=*/5000, /*samples=*/2000),
                                   ReferenceComparisonKey(config, /*images=*/3000, /*samples=*/10000),
                                   ReferenceComparisonKey(other_config, /*images=*/3000, /*samples=*/2000)}) {
    ASSERT_NE(other, key);
    absl::StatusOr<TroupeHalf> refused = ReadTroupeHalf(path, other);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << other;
    EXPECT_THAT(refused.status().message(), AllOf(HasSubstr(path), HasSubstr("not reused")));
  }
  std::ofstream(path, std::ios::trunc) << "key " << key << "\nimages 3008\n";  // cut after one line
  absl::StatusOr<TroupeHalf> cut = ReadTroupeHalf(path, key);
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(cut.status().message(), AllOf(HasSubstr(path), HasSubstr("\"fid NUMBER\"")));
  std::filesystem::remove(path);
}

// The directory is named for N and the key's hash, the same on every run and
// machine (FNV-1a-64: "" hashes to its offset basis), another for another key.
TEST(ReferenceComparisonDirectoryTest, IsNamedForTheImagesAndAStableHashOfTheKey) {
  EXPECT_EQ(ReferenceComparisonDirectory("/root", /*images=*/1, ""), "/root/images1-cbf29ce484222325");
  const std::string key = ReferenceComparisonKey(SmallConfig(), /*images=*/3000, /*samples=*/2000);
  const std::string dir = ReferenceComparisonDirectory("/root", /*images=*/3000, key);
  EXPECT_EQ(dir, ReferenceComparisonDirectory("/root", /*images=*/3000, key));
  EXPECT_THAT(dir, ::testing::StartsWith("/root/images3000-"));
  const std::string other_key = ReferenceComparisonKey(SmallConfig(), /*images=*/3000, /*samples=*/10000);
  EXPECT_NE(dir, ReferenceComparisonDirectory("/root", /*images=*/3000, other_key));
}

}  // namespace
}  // namespace troupe::bench
