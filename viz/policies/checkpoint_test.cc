#include "viz/policies/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "agents/policies.h"
#include "viz/run_directory.h"
#include "viz/testing/run_dirs.h"
#include "viz/view.h"

namespace troupe::viz {
namespace {
namespace fs = std::filesystem;
using ::testing::HasSubstr;

// The first state of a cartpole.swingup episode seeded with `seed`.
std::vector<float> FirstState(uint64_t seed) {
  envs::EnvOptions options;
  options.task = "cartpole.swingup";
  options.pixels = false;
  options.action_repeat = 2;
  options.seed = seed;
  auto env = envs::MakeEnv(options);
  EXPECT_TRUE(env.ok()) << env.status();
  std::vector<float> state((*env)->spec().state_size);
  EXPECT_TRUE((*env)->Reset({state.data(), nullptr}).ok());
  return state;
}

TEST(CheckpointPolicyTest, ActsLikeTheLearnersPolicyAndReportsVersionAndAge) {
  std::vector<float> parameters;
  const std::string dir = testing::RlRunDir("load", "cartpole.swingup", "[32, 32]", &parameters);
  auto run = OpenRunDirectory(dir);
  ASSERT_TRUE(run.ok()) << run.status();
  auto policy = CheckpointPolicy::Load(run->config, run->latest_checkpoint());
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_EQ((*policy)->updates(), 0);
  EXPECT_EQ((*policy)->frames(), 3000);
  EXPECT_THAT((*policy)->Version(), HasSubstr("version 0 (updates), 3000 frames, saved "));
  EXPECT_THAT((*policy)->Describe(), HasSubstr("agent.ckpt"));

  // The learner's own inference policy with the saved parameters is the reference.
  auto reference = agents::CreatePolicy(run->config, {.state_size = 5}, /*action_size=*/1);
  ASSERT_TRUE(reference.ok()) << reference.status();
  ASSERT_TRUE((*reference)->SetParameters(parameters).ok());
  envs::EnvOptions options;
  options.task = "cartpole.swingup";
  options.pixels = false;
  auto env = envs::MakeEnv(options);
  ASSERT_TRUE(env.ok());
  int nonzero = 0;
  for (uint64_t seed : {1, 2, 3}) {
    const std::vector<float> state = FirstState(seed);
    ASSERT_EQ(state.size(), 5u);
    float expected = 0, action = 0;
    ASSERT_TRUE((*reference)->Act(state.data(), nullptr, 1, &expected).ok());
    ASSERT_TRUE((*policy)->Act(**env, Observation{state, {}}, {&action, 1}).ok());
    EXPECT_FLOAT_EQ(action, expected);
    nonzero += std::abs(action) > 1e-6f;
  }
  EXPECT_EQ(nonzero, 3);
}

TEST(CheckpointPolicyTest, ACheckpointOfAnotherTaskNamesTheTasks) {
  const std::string cartpole = testing::RlRunDir("cartpole");
  const std::string walker = testing::RlRunDir("walker", "walker.walk", "[64, 64]");
  auto run = OpenRunDirectory(cartpole);
  ASSERT_TRUE(run.ok()) << run.status();
  auto policy = CheckpointPolicy::Load(run->config, walker + "/checkpoints/agent.ckpt");
  ASSERT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(policy.status().message(), HasSubstr(walker + "/checkpoints/agent.ckpt"));
  EXPECT_THAT(policy.status().message(), HasSubstr("env.task: checkpoint 'walker.walk', run 'cartpole.swingup'"));
  EXPECT_THAT(policy.status().message(), HasSubstr("d4pg.hidden: checkpoint [64, 64], run [32, 32]"));

  // Through troupe view's plan: the same error.
  auto plan = PlanView({.run_dir = cartpole, .checkpoint = walker + "/checkpoints/agent.ckpt"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(MakeSource(*plan).status().message(), HasSubstr("env.task"));
}

TEST(CheckpointPolicyTest, ALooseCheckpointOfAnotherArchitectureNamesTheParameter) {
  const std::string cartpole = testing::RlRunDir("small");
  const std::string wide = testing::RlRunDir("wide", "cartpole.swingup", "[48, 48]");
  const std::string loose = testing::FreshDir("loose") + "/wide.ckpt";
  fs::copy_file(wide + "/checkpoints/agent.ckpt", loose);
  auto run = OpenRunDirectory(cartpole);
  ASSERT_TRUE(run.ok()) << run.status();
  auto policy = CheckpointPolicy::Load(run->config, loose);
  ASSERT_EQ(policy.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(policy.status().message(), HasSubstr("checkpoint " + loose + " does not fit this run's agent"));
  EXPECT_THAT(policy.status().message(), HasSubstr("d4pg.hidden [32, 32]"));
  EXPECT_THAT(policy.status().message(), HasSubstr("param/"));
}

TEST(CheckpointPolicyTest, ANewerCheckpointIsPickedUpAtTheNextEpisode) {
  const std::string dir = testing::RlRunDir("reload");
  auto run = OpenRunDirectory(dir);
  ASSERT_TRUE(run.ok()) << run.status();
  auto policy = CheckpointPolicy::Load(run->config, run->latest_checkpoint());
  ASSERT_TRUE(policy.ok()) << policy.status();
  EXPECT_THAT((*policy)->Version(), HasSubstr("3000 frames"));
  // The learner writes new counters with its next checkpoint.
  std::ofstream(dir + "/checkpoints/counters.txt") << "frames 6000\nsamples 8192\n";
  fs::last_write_time(dir + "/checkpoints/agent.ckpt", fs::file_time_type::clock::now() + std::chrono::seconds(2));
  (*policy)->BeginEpisode();
  EXPECT_THAT((*policy)->Version(), HasSubstr("6000 frames"));
}

TEST(CheckpointPolicyTest, AGarbledCheckpointIsAnErrorNamingTheFile) {
  const std::string dir = testing::RlRunDir("garbled");
  std::ofstream(dir + "/checkpoints/agent.ckpt", std::ios::trunc) << "not a checkpoint";
  auto run = OpenRunDirectory(dir);
  ASSERT_TRUE(run.ok()) << run.status();
  auto policy = CheckpointPolicy::Load(run->config, run->latest_checkpoint());
  ASSERT_FALSE(policy.ok());
  EXPECT_THAT(policy.status().message(), HasSubstr("agent.ckpt"));
}

}  // namespace
}  // namespace troupe::viz
