// Dynamics and rewards are sane: hand-written controllers score high where
// they should and doing nothing scores low where it should.
#include "envs/env.h"
#include "gtest/gtest.h"

namespace troupe::envs {
namespace {

enum class Policy { kController, kZero };

// The return of one state-based episode of `task` under `policy`.
double EpisodeReturn(const std::string& task, Policy policy, uint64_t seed) {
  EnvOptions options;
  options.task = task;
  options.pixels = false;
  options.seed = seed;
  auto env = MakeEnv(options);
  EXPECT_TRUE(env.ok()) << env.status();
  std::vector<float> state((*env)->spec().state_size);
  std::vector<double> command((*env)->spec().action_size, 0.0);
  std::vector<float> action((*env)->spec().action_size, 0.0f);
  EXPECT_TRUE((*env)->Reset({state.data(), nullptr}).ok());
  double total = 0;
  for (;;) {
    if (policy == Policy::kController) {
      EXPECT_TRUE((*env)->task().Controller((*env)->model(), (*env)->data(), command.data())) << task;
      for (size_t i = 0; i < action.size(); ++i) action[i] = float(command[i]);
    }
    auto t = (*env)->Step(action, {state.data(), nullptr});
    EXPECT_TRUE(t.ok()) << t.status();
    total += t->reward;
    if (t->step_type == StepType::kLast) break;
  }
  return total;
}

TEST(ControlTest, LqrBalancesTheCartpole) {
  for (uint64_t seed : {1, 2, 3}) EXPECT_GT(EpisodeReturn("cartpole.balance", Policy::kController, seed), 900) << seed;
}

TEST(ControlTest, EnergySwingUpThenLqrSwingsTheCartpoleUp) {
  for (uint64_t seed : {1, 2, 3}) EXPECT_GT(EpisodeReturn("cartpole.swingup", Policy::kController, seed), 600) << seed;
}

TEST(ControlTest, EnergySwingUpThenPdHoldsThePendulumUp) {
  for (uint64_t seed : {1, 2, 3}) EXPECT_GT(EpisodeReturn("pendulum.swingup", Policy::kController, seed), 600) << seed;
}

TEST(ControlTest, DoingNothingScoresLowOnSwingUpTasks) {
  EXPECT_LT(EpisodeReturn("cartpole.swingup", Policy::kZero, 1), 100);
  EXPECT_LT(EpisodeReturn("pendulum.swingup", Policy::kZero, 4), 150);
}

}  // namespace
}  // namespace troupe::envs
