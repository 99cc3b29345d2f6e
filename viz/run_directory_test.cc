#include "viz/run_directory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "common/run_layout.h"
#include "viz/view.h"

namespace troupe::viz {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A fresh directory under the test's temp dir.
std::string TempDir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("viz_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

// A run directory as a scripted `troupe run` leaves it.
std::string ScriptedRunDir(const std::string& name) {
  const std::string dir = TempDir(name);
  std::ofstream(RunLayout(dir).config()) << "name: \"t\"\nenv { task: \"cartpole.swingup\" action_repeat: 2 }\n";
  std::ofstream(RunLayout(dir).episodes_csv()) << "episode,env,frames,return,seconds\n1,0,1000,12.5,1.0\n";
  return dir;
}

TEST(RunDirectoryTest, MissingDirectoryIsNotFoundNamingIt) {
  auto run = OpenRunDirectory("/nonexistent/runs/x");
  ASSERT_EQ(run.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(run.status().message(), HasSubstr("/nonexistent/runs/x does not exist"));
}

TEST(RunDirectoryTest, AFileIsNotARunDirectory) {
  const std::string file = TempDir("file") + "/episodes.csv";
  std::ofstream(file) << "x\n";
  auto run = OpenRunDirectory(file);
  ASSERT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(run.status().message(), HasSubstr("is not a directory"));
}

TEST(RunDirectoryTest, DirectoryWithoutConfigIsNotARunDirectory) {
  const std::string dir = TempDir("empty");
  auto run = OpenRunDirectory(dir);
  ASSERT_EQ(run.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(run.status().message(), HasSubstr(dir));
  EXPECT_THAT(run.status().message(), HasSubstr("no config.textproto"));
}

TEST(RunDirectoryTest, UnreadableDirectoryIsPermissionDenied) {
  if (geteuid() == 0) GTEST_SKIP() << "root reads every directory";
  const std::string dir = ScriptedRunDir("unreadable");
  fs::permissions(dir, fs::perms::none);
  auto run = OpenRunDirectory(dir);
  fs::permissions(dir, fs::perms::owner_all);
  ASSERT_EQ(run.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(run.status().message(), HasSubstr(dir));
}

TEST(RunDirectoryTest, MalformedConfigNamesTheFileAndLine) {
  const std::string dir = TempDir("badconfig");
  std::ofstream(RunLayout(dir).config()) << "env {\n  tusk: \"cartpole.swingup\"\n}\n";
  auto run = OpenRunDirectory(dir);
  ASSERT_FALSE(run.ok());
  EXPECT_THAT(run.status().message(), HasSubstr("config.textproto:2"));
}

TEST(RunDirectoryTest, RunWithoutCheckpointIsAClearErrorNamingTheDirectoryAndWhatIsMissing) {
  const std::string dir = ScriptedRunDir("nockpt");
  auto run = OpenRunDirectory(dir);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->config.env().task(), "cartpole.swingup");
  auto checkpoint = ChooseCheckpoint(*run, /*explicit_path=*/"");
  ASSERT_EQ(checkpoint.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(checkpoint.status().message(), HasSubstr(dir + " has no checkpoint"));
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("checkpoints/agent.ckpt"));
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("--policy controller"));
}

TEST(RunDirectoryTest, NewestCheckpointIsChosen) {
  const std::string dir = ScriptedRunDir("ckpt");
  fs::create_directories(dir + "/checkpoints");
  std::ofstream(dir + "/checkpoints/agent_a.ckpt") << "a";
  std::ofstream(dir + "/checkpoints/agent.ckpt") << "b";
  std::ofstream(dir + "/checkpoints/replay.ckpt") << "not a policy";
  std::ofstream(dir + "/checkpoints/counters") << "c";
  fs::last_write_time(dir + "/checkpoints/agent_a.ckpt", fs::file_time_type::clock::now() + std::chrono::seconds(5));
  auto run = OpenRunDirectory(dir);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->checkpoints.size(), 2u);
  auto checkpoint = ChooseCheckpoint(*run, /*explicit_path=*/"");
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_THAT(*checkpoint, HasSubstr("agent_a.ckpt"));
  EXPECT_EQ(ChooseCheckpoint(*run, dir + "/missing.ckpt").status().code(), absl::StatusCode::kNotFound);
}

// The learner's checkpoints are generations: each committed one's
// agent.ckpt is listed, oldest first; a folder without its MANIFEST (a
// checkpoint cut short) is not.
TEST(RunDirectoryTest, CommittedGenerationsAreCheckpointsNewestLast) {
  const std::string dir = ScriptedRunDir("generations");
  for (const char* generation : {"generation-000000001", "generation-000000002", "generation-000000003"}) {
    fs::create_directories(dir + "/checkpoints/" + generation);
    std::ofstream(dir + "/checkpoints/" + generation + "/agent.ckpt") << generation;
  }
  const auto now = fs::file_time_type::clock::now();
  for (int g = 1; g <= 2; ++g) {
    const std::string folder = dir + "/checkpoints/generation-00000000" + std::to_string(g);
    std::ofstream(folder + "/MANIFEST") << "committed";
    fs::last_write_time(folder + "/agent.ckpt", now + std::chrono::seconds(g));
  }
  auto run = OpenRunDirectory(dir);
  ASSERT_TRUE(run.ok()) << run.status();
  ASSERT_EQ(run->checkpoints.size(), 2u);
  EXPECT_EQ(run->latest_checkpoint(), dir + "/checkpoints/generation-000000002/agent.ckpt");
}

TEST(ViewPlanTest, RunDirectoryWithScriptedPolicyTakesTaskWrappersAndCurvesFromTheRun) {
  const std::string dir = ScriptedRunDir("plan");
  auto plan = PlanView({.run_dir = dir, .policy = "controller"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->mode, ViewPlan::Mode::kScripted);
  EXPECT_EQ(plan->env.task, "cartpole.swingup");
  EXPECT_EQ(plan->env.action_repeat, 2);
  ASSERT_FALSE(plan->curves.empty());
  EXPECT_THAT(plan->curves[0].path(), HasSubstr("episodes.csv"));
}

TEST(ViewPlanTest, BadRequestsAreClearErrors) {
  EXPECT_THAT(PlanView({}).status().message(), HasSubstr("--task TASK"));
  EXPECT_THAT(PlanView({.task = "cartpole.swingdown"}).status().message(), HasSubstr("cartpole.swingup"));
  EXPECT_THAT(PlanView({.live = "localhost"}).status().message(), HasSubstr("HOST:PORT"));
  EXPECT_THAT(PlanView({.task = "cartpole.swingup", .policy = "smart"}).status().message(), HasSubstr("controller"));
  EXPECT_THAT(PlanView({.run_dir = "/nonexistent/run"}).status().message(), HasSubstr("/nonexistent/run"));
}

TEST(ViewPlanTest, ACheckpointInAScriptedRunIsRefusedNamingTheMode) {
  const std::string dir = ScriptedRunDir("seams");
  fs::create_directories(dir + "/checkpoints");
  std::ofstream(dir + "/checkpoints/agent.ckpt") << "x";
  auto plan = PlanView({.run_dir = dir});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->mode, ViewPlan::Mode::kCheckpoint);
  EXPECT_EQ(MakeSource(*plan).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(MakeSource(*plan).status().message(), HasSubstr("mode SCRIPTED, but only mode RL runs have a policy"));
}

TEST(ViewPlanTest, LiveTakesTheAddress) {
  auto live = PlanView({.live = "127.0.0.1:7070"});
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_EQ(live->mode, ViewPlan::Mode::kLive);
  EXPECT_EQ(live->live_address, "127.0.0.1:7070");
}

TEST(DisplayTest, NoDisplayIsAClearErrorSuggestingXvfbRun) {
  unsetenv("DISPLAY");
  unsetenv("WAYLAND_DISPLAY");
  const absl::Status status = CheckDisplay();
  ASSERT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("neither DISPLAY nor WAYLAND_DISPLAY is set"));
  EXPECT_THAT(status.message(), HasSubstr("xvfb-run -a troupe view"));
  EXPECT_EQ(Viewer::Create({}).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(RunView({.task = "cartpole.swingup"}).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace troupe::viz
