#include "launch/sweep_plan.h"

#include <filesystem>
#include <string>
#include <vector>

#include "common/processes.h"
#include "common/run_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launch/sweep_test_util.h"

namespace troupe::launch {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using e2e::Read;
using testing::TempDir;
using testing::TinyGanConfig;
using testing::TinyRlSweep;
using testing::Write;

TEST(ParseGridTest, ReadsFieldsAndValues) {
  auto grid = ParseGrid({"gan.batch_size=64,256", "gan.lr_scaling=SQRT"});
  ASSERT_TRUE(grid.ok()) << grid.status();
  ASSERT_EQ(grid->size(), 2u);
  EXPECT_EQ((*grid)[0].field, "gan.batch_size");
  EXPECT_THAT((*grid)[0].values, ::testing::ElementsAre("64", "256"));
  EXPECT_THAT((*grid)[1].values, ::testing::ElementsAre("SQRT"));
}

TEST(ParseGridTest, StepsSeveralFieldsTogether) {
  auto grid = ParseGrid({"gan.batch_size:gan.total_images=64:128000,256:512000"});
  ASSERT_TRUE(grid.ok()) << grid.status();
  EXPECT_THAT(AxisAssignments((*grid)[0], (*grid)[0].values[1]),
              ::testing::ElementsAre("gan.batch_size=256", "gan.total_images=512000"));
  EXPECT_THAT(ParseGrid({"gan.batch_size:gan.total_images=64:128000,256"}).status().message(),
              HasSubstr("value 256 has not one part per field"));
  EXPECT_THAT(ParseGrid({"gan.batch_size=64", "gan.total_images:gan.batch_size=1:2"}).status().message(),
              HasSubstr("field gan.batch_size is already swept"));
}

TEST(ParseGridTest, RefusesMalformedGrids) {
  EXPECT_THAT(ParseGrid({"gan.batch_size"}).status().message(), HasSubstr("expected path.to.field=v1,v2"));
  EXPECT_THAT(ParseGrid({"=1,2"}).status().message(), HasSubstr("expected path.to.field=v1,v2"));
  EXPECT_THAT(ParseGrid({"gan.batch_size="}).status().message(), HasSubstr("the list of values is empty"));
  EXPECT_THAT(ParseGrid({"gan.batch_size=64,,256"}).status().message(), HasSubstr("an empty value"));
  EXPECT_THAT(ParseGrid({"gan.batch_size=64,64"}).status().message(), HasSubstr("value 64 is given twice"));
  EXPECT_THAT(ParseGrid({"gan.batch_size=64", "gan.batch_size=128"}).status().message(),
              HasSubstr("already swept by another --grid"));
}

class PlanSweepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = dir_.path() + "/tiny.textproto";
    Write(config_, TinyGanConfig(dir_.path() + "/runs", dir_.path() + "/classifier.ckpt"));
  }
  SweepOptions Options(std::vector<std::string> grid) {
    SweepOptions options;
    options.config_path = config_;
    auto parsed = ParseGrid(grid);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    options.grid = *parsed;
    return options;
  }
  TempDir dir_;
  std::string config_;
};

TEST_F(PlanSweepTest, RunsTheCrossProductWithSeedsAndSplitCores) {
  SweepOptions options = Options({"gan.batch_size=16,32", "gan.lr_scaling=LINEAR,SQRT"});
  options.seeds = 2;
  options.parallel = 2;
  options.cores = 4;
  auto plan = PlanSweep(options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->sweep_dir, dir_.path() + "/runs/tiny-sweep");
  ASSERT_EQ(plan->runs.size(), 8u);
  EXPECT_EQ(plan->runs[0].name, "batch_size-16__lr_scaling-LINEAR__seed-0");
  EXPECT_EQ(plan->runs[3].name, "batch_size-16__lr_scaling-SQRT__seed-1");
  EXPECT_EQ(plan->runs[7].point, "gan.batch_size=32,gan.lr_scaling=SQRT");
  EXPECT_EQ(plan->runs[7].config.gan().batch_size(), 32);
  EXPECT_EQ(plan->runs[7].config.gan().lr_scaling(), config::GanConfig::SQRT);
  EXPECT_EQ(plan->runs[6].config.gan().engine().seed(), 0u);
  EXPECT_EQ(plan->runs[7].config.gan().engine().seed(), 1u);
  EXPECT_EQ(plan->runs[7].config.gan().engine().threads(), 2);
  EXPECT_FALSE(fs::exists(plan->sweep_dir)) << "planning creates nothing";
}

// --first-seed: more seeds for a study (or a study's seeds split between
// machines) name and seed their runs from that index on.
TEST_F(PlanSweepTest, FirstSeedNamesAndSeedsRunsFromThatIndex) {
  SweepOptions options = Options({"gan.batch_size=16,32"});
  options.seeds = 2;
  options.first_seed = 3;
  auto plan = PlanSweep(options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->runs.size(), 4u);
  EXPECT_EQ(plan->runs[0].name, "batch_size-16__seed-3");
  EXPECT_EQ(plan->runs[3].name, "batch_size-32__seed-4");
  EXPECT_EQ(plan->runs[0].seed, 3);
  EXPECT_EQ(plan->runs[0].config.gan().engine().seed(), 3u);
  EXPECT_EQ(plan->runs[3].config.gan().engine().seed(), 4u);
  options.first_seed = -1;
  EXPECT_THAT(PlanSweep(options).status().message(), HasSubstr("--first-seed -1: must be 0..1000000"));
}

TEST_F(PlanSweepTest, SteppedFieldsMakeOnePointEach) {
  auto plan = PlanSweep(Options({"gan.batch_size:gan.total_images=16:1600,32:3200"}));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->runs.size(), 2u);
  EXPECT_EQ(plan->runs[1].name, "batch_size-total_images-32_3200__seed-0");
  EXPECT_EQ(plan->runs[1].point, "gan.batch_size=32,gan.total_images=3200");
  EXPECT_EQ(plan->runs[1].config.gan().total_images(), 3200);
}

TEST_F(PlanSweepTest, RefusesBadGridsBeforeAnythingStarts) {
  EXPECT_THAT(PlanSweep(Options({"gan.batch_sz=16,32"})).status().message(),
              HasSubstr("--grid value gan.batch_sz=16: GanConfig has no field 'batch_sz'"));
  EXPECT_THAT(PlanSweep(Options({"gan.batch_size=16,big"})).status().message(),
              HasSubstr("--grid value gan.batch_size=big"));
  EXPECT_THAT(PlanSweep(Options({"gan.lr_scaling=LINEAR,CUBIC"})).status().message(),
              HasSubstr("--grid value gan.lr_scaling=CUBIC"));
  // Parses, but the experiment validator refuses it: the point is named.
  const absl::Status invalid = PlanSweep(Options({"gan.batch_size=16,-4"})).status();
  EXPECT_THAT(invalid.message(), HasSubstr("grid point gan.batch_size=-4 seed 0"));
  EXPECT_THAT(invalid.message(), HasSubstr("--grid value gan.batch_size=-4"));
  SweepOptions no_seeds = Options({"gan.batch_size=16"});
  no_seeds.seeds = 0;
  EXPECT_THAT(PlanSweep(no_seeds).status().message(), HasSubstr("--seeds 0: must be >= 1"));
  EXPECT_FALSE(fs::exists(dir_.path() + "/runs"));
}

TEST_F(PlanSweepTest, RefusesARunDirectoryOfAnotherConfig) {
  SweepOptions options = Options({"gan.batch_size=16"});
  auto plan = PlanSweep(options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  fs::create_directories(plan->runs[0].run_dir);
  Write(RunLayout(plan->runs[0].run_dir).config(), "name: \"tiny\" mode: GAN gan { batch_size: 64 }");
  EXPECT_THAT(PlanSweep(options).status().message(), HasSubstr("holds a run of another config"));
}

// Preparing writes the plan down: sweep.txt, each run's directory and
// config; a run that has `done` is skipped and its directory left as it is.
TEST(PrepareSweepTest, WritesTheRunsConfigsAndSkipsRunsDone) {
  TempDir dir;
  auto plan = PlanSweep(TinyRlSweep(dir.path(), /*seeds=*/1));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->runs.size(), 2u);
  fs::create_directories(plan->runs[0].run_dir);
  Write(plan->runs[0].run_dir + "/" + kSweepDoneFile, "done\n");
  std::vector<std::string> lines;
  auto pending = PrepareSweep(*plan, [&](const std::string& line) { lines.push_back(line); });
  ASSERT_TRUE(pending.ok()) << pending.status();
  ASSERT_EQ(pending->size(), 1u);
  EXPECT_EQ((*pending)[0], &plan->runs[1]);
  EXPECT_TRUE(SweepRunDone(plan->runs[0].run_dir));
  EXPECT_FALSE(SweepRunDone(plan->runs[1].run_dir));
  EXPECT_THAT(lines, ::testing::ElementsAre("skip " + plan->runs[0].name + ": done"));
  EXPECT_FALSE(fs::exists(RunLayout(plan->runs[0].run_dir).config())) << "a run done is left as it is";
  EXPECT_THAT(Read(RunLayout(plan->runs[1].run_dir).config()), HasSubstr("batch_size: 32"));
  const std::string sweep_txt = Read(plan->sweep_dir + "/sweep.txt");
  EXPECT_THAT(sweep_txt, HasSubstr("grid learner.batch_size=16,32\n"));
  EXPECT_THAT(sweep_txt, HasSubstr("run " + plan->runs[1].name + " learner.batch_size=32 seed 0\n"));
  EXPECT_FALSE(SweepRunHasCheckpoint(plan->runs[1].run_dir, plan->mode));
}

}  // namespace
}  // namespace troupe::launch
