#include "launch/sweep_summary.h"

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
using testing::ReadCsv;
using testing::TempDir;
using testing::ToDouble;
using testing::Write;

TEST(ReadRunCurveTest, KeepsTheLaterAttemptOfAResumedRun) {
  TempDir dir;
  Write(RunLayout(dir.path()).eval_csv(),
        "images,steps,classifier_fid,classifier_score,seconds\n0,0,800,1,0\n100,1,50,1,1\n200,2,40,1,2\n"
        "100,1,45,1,3\n200,2,30,1,4\n300,3,20,1,5\n");
  const RunCurve curve = ReadRunCurve(dir.path());
  EXPECT_THAT(curve.x, ::testing::ElementsAre(0, 100, 200, 300));
  EXPECT_THAT(curve.y, ::testing::ElementsAre(800, 45, 30, 20));
  EXPECT_FALSE(curve.done);
}

// RL: the best is the highest eval return; a point's seeds give mean and
// sample standard deviation; a run without evaluations has no metric.
TEST(WriteSweepSummaryTest, SummarizesRlReturnsOverSeeds) {
  TempDir dir;
  SweepPlan plan;
  plan.sweep_dir = dir.path();
  plan.mode = config::ExperimentConfig::RL;
  plan.grid = *ParseGrid({"d4pg.discount=0.9,0.99"});
  plan.seeds = 2;
  const std::vector<std::string> evals = {
      "frames,updates,eval_return,actions_at_bound\n0,0,10,0\n100,5,30,0\n200,9,20,0\n",
      "frames,updates,eval_return,actions_at_bound\n0,0,12,0\n100,5,16,0\n200,9,40,0\n",
      "frames,updates,eval_return,actions_at_bound\n0,0,1,0\n", ""};
  for (int i = 0; i < 4; ++i) {
    SweepRun run;
    run.point = i < 2 ? "d4pg.discount=0.9" : "d4pg.discount=0.99";
    run.seed = i % 2;
    run.name = absl::StrCat("run", i);
    run.run_dir = dir.path() + "/" + run.name;
    fs::create_directories(run.run_dir);
    if (!evals[i].empty()) Write(RunLayout(run.run_dir).eval_csv(), evals[i]);
    if (i < 2) Write(run.run_dir + "/done", "done\n");
    plan.runs.push_back(run);
  }
  ASSERT_TRUE(WriteSweepSummary(plan).ok());
  const auto runs = ReadCsv(dir.path() + "/runs.csv");
  ASSERT_EQ(runs.size(), 4u);
  EXPECT_EQ(runs[0].at("eval_return_final"), "20.0000");
  EXPECT_EQ(runs[0].at("eval_return_best"), "30.0000");
  EXPECT_EQ(runs[0].at("frames_final"), "200");
  EXPECT_EQ(runs[3].at("eval_return_final"), "");
  const auto summary = ReadCsv(dir.path() + "/summary.csv");
  ASSERT_EQ(summary.size(), 2u);
  EXPECT_EQ(summary[0].at("d4pg.discount"), "0.9");
  EXPECT_EQ(summary[0].at("done"), "2");
  EXPECT_EQ(summary[0].at("eval_return_final_mean"), "30.0000");
  EXPECT_NEAR(ToDouble(summary[0].at("eval_return_final_std")), std::sqrt(200.0), 1e-3);
  EXPECT_EQ(summary[0].at("eval_return_best_mean"), "35.0000");
  EXPECT_EQ(summary[1].at("with_metric"), "1");
  EXPECT_EQ(summary[1].at("eval_return_final_std"), "0.0000");
  EXPECT_THAT(Read(dir.path() + "/summary.md"), HasSubstr("| d4pg.discount=0.99 | 0/2 | 1.000 ± 0.000 |"));
  EXPECT_TRUE(fs::exists(dir.path() + "/curves.png"));
}

}  // namespace
}  // namespace troupe::launch
