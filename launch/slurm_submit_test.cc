#include "launch/slurm_submit.h"

#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <google/protobuf/text_format.h>

#include "absl/strings/str_cat.h"
#include "common/processes.h"
#include "common/run_layout.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "launch/launcher.h"
#include "launch/slurm.h"

namespace troupe::launch {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using e2e::Read;

// Slurm's commands as stand-ins first on the PATH: sbatch appends its
// arguments to CALLS and answers job 42 as `sbatch --parsable` does on a
// federated cluster ("42;cluster"); sinfo lists partitions "debug" (the
// default, 2 nodes of 8 CPUs) and "small" (1 node of 2 CPUs); squeue says a
// queued job's state, which the test writes to STATE.
class SubmitRunToSlurmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("troupe_slurm_submit_" + std::to_string(getpid()))).string();
    fs::remove_all(dir_);
    bin_ = dir_ + "/bin";
    fs::create_directories(bin_);
    calls_ = dir_ + "/calls.txt";
    state_ = dir_ + "/state.txt";
    Command("sbatch", absl::StrCat("echo \"$@\" >> ", calls_, "\necho '42;cluster'\n"));
    Command("sinfo", "echo 'debug*|2|8'\necho 'small|1|2'\n");
    Command("squeue", absl::StrCat("cat ", state_, " 2>/dev/null\n"));
    const char* path = getenv("PATH");
    old_path_ = path == nullptr ? "" : path;
    setenv("PATH", (bin_ + ":" + old_path_).c_str(), 1);
  }
  void TearDown() override {
    setenv("PATH", old_path_.c_str(), 1);
    fs::remove_all(dir_);
  }

  void Command(const std::string& name, const std::string& body) {
    std::ofstream(bin_ + "/" + name) << "#!/bin/sh\n" << body;
    fs::permissions(bin_ + "/" + name, fs::perms::owner_all);
  }

  // An RL run of 1 learner and 2 actors on one node.
  config::ExperimentConfig Config() {
    config::ExperimentConfig config;
    EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
        absl::StrCat("name: \"tiny\" mode: RL runs_dir: \"", dir_, "/runs\" actors { count: 2 }"), &config));
    return config;
  }

  std::string dir_, bin_, calls_, state_, old_path_;
};

TEST_F(SubmitRunToSlurmTest, SubmitsANewRunAndSaysWhereItWent) {
  const config::ExperimentConfig config = Config();
  auto job = SubmitRunToSlurm(config, "tiny.textproto", /*resume_dir=*/"", {"--time=10"});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->job_id, "42");
  EXPECT_EQ(fs::path(job->run_dir).parent_path().string(), dir_ + "/runs");
  EXPECT_EQ(job->script, job->run_dir + "/slurm/job.sh");
  EXPECT_EQ(job->output, job->run_dir + "/slurm/job-42.out");
  auto plan = PlanSlurmJob(config);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(Read(job->script), SlurmJobScript(config, *plan, job->run_dir, SelfBinary()));
  EXPECT_THAT(Read(RunLayout(job->run_dir).config()), HasSubstr("name: \"tiny\""));
  EXPECT_EQ(Read(calls_), absl::StrCat("--parsable --time=10 ", job->script, "\n"));
  EXPECT_THAT(Read(RunLayout(job->run_dir).launch()), HasSubstr("launcher slurm\njob_id 42\n"));
  EXPECT_EQ(Read(job->run_dir + "/slurm/jobs.txt"), "42\n");
  EXPECT_TRUE(fs::is_directory(job->run_dir + "/logs"));
  EXPECT_EQ(fs::status(job->run_dir + "/secrets").permissions(), fs::perms::owner_all);
}

TEST_F(SubmitRunToSlurmTest, RefusesBeforeAnythingIsCreated) {
  const config::ExperimentConfig config = Config();
  // sbatch options that would reshape the job the slurm section describes.
  for (const std::string option : {"-N2", "--nodes=2", "--ntasks", "-c4", "--cpus-per-task=4"}) {
    const absl::Status status = SubmitRunToSlurm(config, "tiny.textproto", "", {option}).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << option;
    EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("--slurm ", option, ": the job's nodes, tasks and CPUs")));
  }
  // A partition sinfo does not list, and one too small for three processes.
  const absl::Status unknown = SubmitRunToSlurm(config, "tiny.textproto", "", {"-p", "gpu"}).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound) << unknown;
  EXPECT_THAT(unknown.message(), HasSubstr("\"gpu\": no such partition"));
  const absl::Status small = SubmitRunToSlurm(config, "tiny.textproto", "", {"--partition=small"}).status();
  EXPECT_EQ(small.code(), absl::StatusCode::kInvalidArgument) << small;
  EXPECT_THAT(small.message(), HasSubstr("tiny.textproto: "));
  EXPECT_THAT(small.message(), HasSubstr("sbatch's --partition"));
  // No sbatch on the PATH.
  setenv("PATH", dir_.c_str(), 1);
  EXPECT_EQ(SubmitRunToSlurm(config, "tiny.textproto", "", {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(fs::exists(dir_ + "/runs"));
  EXPECT_FALSE(fs::exists(calls_));
}

TEST_F(SubmitRunToSlurmTest, ResumesOnlyARunWithACheckpointWhoseJobHasEnded) {
  const config::ExperimentConfig config = Config();
  const std::string run_dir = dir_ + "/runs/tiny-1";
  fs::create_directories(run_dir + "/checkpoints");
  EXPECT_EQ(SubmitRunToSlurm(config, "tiny.textproto", run_dir, {}).status().code(), absl::StatusCode::kNotFound);
  std::ofstream(run_dir + "/checkpoints/agent.ckpt") << "checkpoint";
  std::ofstream(RunLayout(run_dir).launch()) << "launcher slurm\njob_id 7\n";
  std::ofstream(state_) << "RUNNING\n";
  const absl::Status running = SubmitRunToSlurm(config, "tiny.textproto", run_dir, {}).status();
  EXPECT_EQ(running.code(), absl::StatusCode::kFailedPrecondition) << running;
  EXPECT_THAT(running.message(), HasSubstr("Slurm job 7 of this run is RUNNING; scancel 7 first"));
  std::ofstream(state_) << "CANCELLED\n";
  auto job = SubmitRunToSlurm(config, "tiny.textproto", run_dir, {});
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->run_dir, run_dir);
  EXPECT_EQ(Read(run_dir + "/slurm/jobs.txt"), "42\n");
  EXPECT_FALSE(fs::exists(RunLayout(run_dir).config())) << "a resumed run keeps its own config";
}

}  // namespace
}  // namespace troupe::launch
