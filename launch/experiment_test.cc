// ValidateExperiment: every shipped config passes; each section's errors
// come back naming the field; only the sections the mode runs are checked.
#include "launch/experiment.h"

#include <filesystem>
#include <string>

#include <google/protobuf/text_format.h>

#include "absl/strings/str_cat.h"
#include "common/config.h"
#include "common/files.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::launch {
namespace {

using ::testing::HasSubstr;

config::ExperimentConfig Parse(const std::string& text) {
  config::ExperimentConfig config;
  const absl::Status status = ParseTextConfig(text, "test.textproto", &config);
  EXPECT_TRUE(status.ok()) << status;
  return config;
}

constexpr char kRl[] = "mode: RL env { task: \"cartpole.swingup\" observation: STATE } ";

TEST(ValidateExperimentTest, EveryShippedConfigIsValid) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(ProjectPath("configs"))) {
    if (entry.path().extension() != ".textproto") continue;
    auto config = LoadExperimentConfig(entry.path().string(), {});
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_TRUE(ValidateExperiment(*config).ok()) << entry.path() << ": " << ValidateExperiment(*config);
    ++count;
  }
  EXPECT_GE(count, 9);
}

TEST(ValidateExperimentTest, EachSectionOfAnRlRunIsCheckedNamingTheField) {
  const struct {
    std::string text, field;
  } cases[] = {
      {"total_frames: 0", "total_frames 0"},
      {"env { task: \"cartpole.swingdown\" }", "unknown task 'cartpole.swingdown'"},
      {"pool { num_threads: 9999 }", "pool.num_threads"},
      {"actors { noise_min: -1 }", "actors.noise_min -1"},
      {"evaluator { episodes: 0 }", "evaluator.episodes 0"},
      {"evaluator { video_width: 85 }", "evaluator.video_width 85: must be even"},
      {"evaluator { video_height: 0 }", "evaluator.video_height 0: must be even and at least 2"},
      {"evaluator { video_width: 600 }", "evaluator.video_width 600: must be at most 512 (the offscreen buffer of task "
                                         "cartpole.swingup's model"},
      {"d4pg { discount: 1.5 }", "d4pg.discount 1.5"},
      {"d4pg { critic_learning_rate: nan }", "d4pg.critic_learning_rate nan"},
      {"learner { batch_size: 10 engine { replicas: 3 } }",
       "learner.batch_size 10: must be divisible by learner.engine.replicas 3"},
      {"learner { engine { threads: -2 } }", "learner.engine.threads -2"},
      {"learner { replay_size: 0 }", "learner.replay_size 0"},
      {"learner { replay_size: 100 min_replay_size: 1000 }", "learner.min_replay_size 1000"},
      {"learner { samples_per_insert: -1 }", "learner.samples_per_insert -1"},
      {"learner { publish_every: 0 }", "learner.publish_every 0"},
      // Where the run goes, what it listens on, what it would allocate.
      {"name: \"../../escape\"", "name \"../../escape\": starts with '.'"},
      {"name: \"a/b\"", "name \"a/b\": has a '/'"},
      {"runs_dir: \"/etc/hostname\"", "runs_dir /etc/hostname: exists and is not a directory"},
      {"learner { listen: \"127.0.0.1:99999\" }", "learner.listen \"127.0.0.1:99999\": port 99999 is outside"},
      {"env { observation: PIXELS render { width: 100000 height: 100000 } }",
       "env.render: size 100000x100000 is outside the offscreen buffer 512x512"},
      {"env { observation: PIXELS render { camera: \"nowhere\" } }", "env.render.camera: cartpole.swingup: no camera"},
      {"learner { replay_size: 100000000000 }", "learner.replay_size 100000000000: must be in [1, 268435456]"},
      {"learner { batch_size: 1000000 }", "learner.batch_size 1000000: must be in [1, 65536]"},
      {"d4pg { hidden: [100000] }", "d4pg.hidden[0] 100000: must be in [1, 8192]"},
      {"learner { batch_size: 65536 } d4pg { hidden: [8192, 8192, 8192, 8192, 8192, 8192, 8192, 8192] }",
       "learner.batch_size 65536 with d4pg sizes (hidden) and learner.engine.replicas 1: needs ~"},
      {"actors { count: 100000 }", "actors.count 100000: must be in [0, 256]"},
      // 84x84 frames stacked 3, batch 256: 1536 frames a batch, two batches
      // in flight (the one stepping and the one made ahead), 49 in 1 MiB.
      {"env { observation: PIXELS frame_stack: 3 render { width: 84 height: 84 } } learner { batch_size: 256 "
       "device_frame_mib: 1 }",
       "learner.device_frame_mib 1 with 84x84 frames and learner.batch_size 256: the device frame table's 49 slots "
       "hold fewer than the 3072 frames of the batches in flight"},
      {"env { observation: PIXELS render { width: 85 height: 85 } }", "height * width must be a multiple of 4"},
      {"replay { tables { name: \"t\" max_size: 0 fields { name: \"x\" shape: 1 } } }",
       "replay.tables[0].max_size 0: must be in"},
      {"replay { listen: \"localhost\" }", "replay.listen \"localhost\": no ':PORT'"},
      {"replay { checkpoint_dir: \"/nonexistent/dir\" }", "replay.checkpoint_dir \"/nonexistent/dir\": not an existing"},
  };
  ASSERT_TRUE(ValidateExperiment(Parse(kRl)).ok()) << ValidateExperiment(Parse(kRl));
  for (const auto& c : cases) {
    config::ExperimentConfig config = Parse(kRl);
    ASSERT_TRUE(google::protobuf::TextFormat::MergeFromString(c.text, &config)) << c.text;
    const absl::Status status = ValidateExperiment(config);
    EXPECT_FALSE(status.ok()) << c.text;
    EXPECT_THAT(status.message(), HasSubstr(c.field)) << c.text;
  }
}

// The video's size matters only where videos are made.
TEST(ValidateExperimentTest, AnOddVideoSizeIsRefusedOnlyWhereVideosAreMade) {
  EXPECT_THAT(ValidateExperiment(Parse(absl::StrCat(kRl, "evaluator { video_height: 85 }"))).message(),
              HasSubstr("evaluator.video_height 85: must be even"));
  EXPECT_TRUE(ValidateExperiment(Parse(absl::StrCat(kRl, "evaluator { video_width: 85 record_video: false }"))).ok());
  EXPECT_TRUE(ValidateExperiment(Parse(absl::StrCat(kRl, "evaluator { video_width: 85 every_frames: 0 }"))).ok());
  EXPECT_TRUE(ValidateExperiment(Parse(absl::StrCat(kRl, "evaluator { video_width: 600 record_video: false }"))).ok());
}

TEST(ValidateExperimentTest, OnlyTheSectionsTheModeRunsAreChecked) {
  // A scripted run has no agent or learner: their sections are not its concern.
  EXPECT_TRUE(ValidateExperiment(Parse("mode: SCRIPTED d4pg { discount: 1.5 } learner { replay_size: 0 }")).ok());
  EXPECT_THAT(ValidateExperiment(Parse("mode: SCRIPTED env { frame_stack: 0 }")).message(), HasSubstr("env.frame_stack"));
  // A GAN run has no env.
  EXPECT_TRUE(ValidateExperiment(Parse("mode: GAN env { task: \"nowhere.none\" }")).ok());
  EXPECT_THAT(ValidateExperiment(Parse("mode: GAN gan { batch_size: 10 engine { replicas: 4 } }")).message(),
              HasSubstr("gan.batch_size 10: must be divisible by gan.engine.replicas 4"));
  EXPECT_THAT(ValidateExperiment(Parse("mode: GAN gan { engine { replicas: 0 } }")).message(),
              HasSubstr("gan.engine.replicas 0"));
  EXPECT_THAT(ValidateExperiment(Parse("mode: GAN gan { data_dir: \"/nonexistent\" }")).message(),
              HasSubstr("gan.data_dir /nonexistent: Fashion-MNIST file /nonexistent/train-images-idx3-ubyte.gz not found"));
  EXPECT_THAT(ValidateExperiment(Parse("mode: GAN gan { batch_size: 100000000 }")).message(),
              HasSubstr("gan.batch_size: 100000000: must be in [1, 65536]"));
  // A scripted run steps its pool in sync mode.
  EXPECT_THAT(ValidateExperiment(Parse("mode: SCRIPTED pool { num_envs: 4 batch_size: 2 }")).message(),
              HasSubstr("pool.batch_size 2: a scripted run steps the pool in sync mode"));
}

}  // namespace
}  // namespace troupe::launch
