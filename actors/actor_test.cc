#include "actors/actor.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "actors/evaluator.h"
#include "agents/policies.h"
#include "common/config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::actors {
namespace {

using ::testing::HasSubstr;

config::ActorsConfig Spread(int count) {
  config::ActorsConfig actors;
  actors.set_count(count);
  actors.set_noise_min(0.1f);
  actors.set_noise_max(0.3f);
  return actors;
}

TEST(ValidateActorsConfigTest, AcceptsTheDefaultsAndASchedule) {
  EXPECT_TRUE(ValidateActorsConfig(config::ActorsConfig()).ok());
  config::ActorsConfig actors = Spread(2);
  actors.set_noise_decay_frames(100000);
  EXPECT_TRUE(ValidateActorsConfig(actors).ok());
}

TEST(ValidateActorsConfigTest, NamesTheFieldAndValue) {
  struct Case {
    void (*set)(config::ActorsConfig&);
    const char* message;
  } cases[] = {
      {[](config::ActorsConfig& a) { a.set_count(-1); }, "actors.count -1: must be in [0, 256]"},
      {[](config::ActorsConfig& a) { a.set_count(100000); }, "actors.count 100000: must be in [0, 256]"},
      {[](config::ActorsConfig& a) { a.set_max_restarts(-1); }, "actors.max_restarts -1: must be >= 0"},
      {[](config::ActorsConfig& a) { a.set_noise_min(-0.5f); }, "actors.noise_min -0.5: must be finite and >= 0"},
      {[](config::ActorsConfig& a) { a.set_noise_max(INFINITY); }, "actors.noise_max inf: must be finite and >= 0"},
      {[](config::ActorsConfig& a) { a.set_noise_initial(std::nanf("")); },
       "actors.noise_initial nan: must be finite and >= 0"},
      {[](config::ActorsConfig& a) { a.set_noise_decay_frames(-5); },
       "actors.noise_decay_frames -5: must be finite and >= 0"},
      {[](config::ActorsConfig& a) { a.set_random_frames(-1); }, "actors.random_frames -1: must be finite and >= 0"},
      {[](config::ActorsConfig& a) {
         a.set_noise_min(0.5f);
         a.set_noise_max(0.2f);
       },
       "actors.noise_max 0.2: must be >= actors.noise_min 0.5"},
  };
  for (const Case& c : cases) {
    config::ActorsConfig actors;
    c.set(actors);
    const absl::Status s = ValidateActorsConfig(actors);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(s.message(), HasSubstr(c.message));
  }
}

TEST(EvaluateTest, ReportsTheFractionOfActionsAtTheBounds) {
  config::ExperimentConfig config;
  ASSERT_TRUE(ParseTextConfig("mode: RL env { task: \"cartpole.balance\" observation: STATE action_repeat: 8 }"
                              " d4pg { hidden: [8] }",
                              "config", &config)
                  .ok());
  auto policy = agents::CreatePolicy(config, {.state_size = 5}, /*action_size=*/1);
  ASSERT_TRUE(policy.ok()) << policy.status();
  // All weights zero: the action is tanh(0) = 0 everywhere.
  std::vector<float> params((*policy)->num_parameters(), 0.0f);
  ASSERT_TRUE((*policy)->SetParameters(params).ok());
  auto centred = Evaluate(config, **policy, /*episodes=*/2, /*seed=*/3);
  ASSERT_TRUE(centred.ok()) << centred.status();
  EXPECT_EQ(centred->actions_at_bound, 0.0);
  // Doing nothing keeps the pole up for a while: some reward, at most 1 per control step.
  EXPECT_GT(centred->mean_return, 0.0);
  EXPECT_LE(centred->mean_return, 1000.0);

  // Every weight and bias 5: the output is 5 + 5 * sum(relu(...)) >= 5, so
  // the action is tanh(>= 5) > 0.9999 whatever the state.
  std::fill(params.begin(), params.end(), 5.0f);
  ASSERT_TRUE((*policy)->SetParameters(params).ok());
  auto saturated = Evaluate(config, **policy, /*episodes=*/2, /*seed=*/3);
  ASSERT_TRUE(saturated.ok()) << saturated.status();
  EXPECT_EQ(saturated->actions_at_bound, 1.0);
  EXPECT_LT(saturated->mean_return, centred->mean_return) << "pushing one way all episode drops the pole";
}

}  // namespace
}  // namespace troupe::actors
