#include "launch/sweep_slurm.h"

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/processes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launch/sweep_test_util.h"

namespace troupe::launch {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using e2e::Read;
using testing::TempDir;
using testing::Write;

// A stand-in for sbatch first on the PATH: it appends its arguments to
// CALLS and answers job ids 100, 101, ... as `sbatch --parsable` does.
class SubmitSweepToSlurmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string bin = dir_.path() + "/bin";
    fs::create_directories(bin);
    calls_ = dir_.path() + "/calls.txt";
    Write(bin + "/sbatch", absl::StrCat("#!/bin/sh\necho \"$@\" >> ", calls_, "\necho $((100 + $(wc -l < ", calls_,
                                        ") - 1))\n"));
    fs::permissions(bin + "/sbatch", fs::perms::owner_all);
    const char* path = getenv("PATH");
    old_path_ = path == nullptr ? "" : path;
    setenv("PATH", (bin + ":" + old_path_).c_str(), 1);
  }
  void TearDown() override { setenv("PATH", old_path_.c_str(), 1); }

  // 2 grid points x 2 seeds.
  SweepPlan Plan() {
    auto plan = PlanSweep(testing::TinyRlSweep(dir_.path(), /*seeds=*/2));
    EXPECT_TRUE(plan.ok()) << plan.status();
    return *plan;
  }

  TempDir dir_;
  std::string calls_, old_path_;
};

TEST_F(SubmitSweepToSlurmTest, SubmitsTheRunsNotDoneAsAnArrayAndTheSummaryAfterIt) {
  const SweepPlan plan = Plan();
  fs::create_directories(plan.runs[0].run_dir);
  Write(plan.runs[0].run_dir + "/" + kSweepDoneFile, "done\n");
  auto jobs = SubmitSweepToSlurm(plan, /*parallel=*/2, /*cpus_per_run=*/3, {"/bin/troupe", "sweep", "--run-member"},
                                 {"/bin/troupe", "sweep", "--summary-only"}, {"--partition=p"}, [](const std::string&) {});
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->runs, 3);
  EXPECT_EQ(jobs->array_job, "100");
  EXPECT_EQ(jobs->summary_job, "101");
  const std::string dir = fs::absolute(plan.sweep_dir).string() + "/slurm";
  // Array task i runs line i + 1: the runs not done, in plan order.
  EXPECT_EQ(Read(dir + "/members.txt"), absl::StrCat(fs::absolute(plan.runs[1].run_dir).string(), "\n",
                                                     fs::absolute(plan.runs[2].run_dir).string(), "\n",
                                                     fs::absolute(plan.runs[3].run_dir).string(), "\n"));
  const std::string array = Read(dir + "/array.sh");
  EXPECT_THAT(array, HasSubstr("#SBATCH --array=0-2%2\n"));
  EXPECT_THAT(array, HasSubstr("#SBATCH --cpus-per-task=3\n"));
  EXPECT_THAT(array, HasSubstr("exec '/bin/troupe' 'sweep' '--run-member' \"$run_dir\" >> \"$run_dir/log.txt\" 2>&1\n"));
  EXPECT_THAT(Read(dir + "/summary.sh"), HasSubstr("exec '/bin/troupe' 'sweep' '--summary-only'\n"));
  EXPECT_EQ(Read(calls_), absl::StrCat("--parsable --partition=p ", dir, "/array.sh\n",
                                       "--parsable --partition=p --dependency=afterany:100 ", dir, "/summary.sh\n"));
  EXPECT_EQ(Read(dir + "/jobs.txt"), "array 100\nsummary 101\n");
}

TEST_F(SubmitSweepToSlurmTest, SubmitsNothingWhenEveryRunIsDone) {
  const SweepPlan plan = Plan();
  for (const SweepRun& run : plan.runs) {
    fs::create_directories(run.run_dir);
    Write(run.run_dir + "/" + kSweepDoneFile, "done\n");
  }
  auto jobs = SubmitSweepToSlurm(plan, /*parallel=*/1, /*cpus_per_run=*/1, {"/bin/troupe"}, {"/bin/troupe"}, {},
                                 [](const std::string&) {});
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->runs, 0);
  EXPECT_EQ(jobs->array_job, "");
  EXPECT_FALSE(fs::exists(calls_));
  EXPECT_TRUE(fs::exists(plan.sweep_dir + "/summary.csv"));
}

TEST_F(SubmitSweepToSlurmTest, RefusesOptionsThatReshapeTheArray) {
  for (const std::string option : {"--array=0-3", "-a0-3", "-c", "--cpus-per-task=2", "-ofile", "--output=f"}) {
    const absl::Status status = CheckSlurmSweepOptions({option});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << option;
    EXPECT_THAT(status.message(), HasSubstr("--slurm " + option + ": troupe shapes the job array"));
  }
  EXPECT_TRUE(CheckSlurmSweepOptions({"--partition=p", "--time=60"}).ok());
  setenv("PATH", dir_.path().c_str(), 1);  // no sbatch there
  EXPECT_EQ(CheckSlurmSweepOptions({}).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace troupe::launch
