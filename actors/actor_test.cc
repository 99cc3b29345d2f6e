#include "actors/actor.h"

#include <cmath>
#include <limits>

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

TEST(ActorNoiseScaleTest, ActorsSpreadFromNoiseMinToNoiseMax) {
  const config::ActorsConfig actors = Spread(3);
  EXPECT_FLOAT_EQ(ActorNoiseScale(actors, 0, 0), 0.1f);
  EXPECT_FLOAT_EQ(ActorNoiseScale(actors, 1, 0), 0.2f);
  EXPECT_FLOAT_EQ(ActorNoiseScale(actors, 2, 123456), 0.3f);
}

TEST(ActorNoiseScaleTest, DecaysLinearlyFromNoiseInitialToTheActorsOwnScale) {
  config::ActorsConfig actors = Spread(2);
  actors.set_noise_initial(1.0f);
  actors.set_noise_decay_frames(1000);
  EXPECT_FLOAT_EQ(ActorNoiseScale(actors, 0, 0), 1.0f);
  EXPECT_FLOAT_EQ(ActorNoiseScale(actors, 0, 500), 0.55f);
  EXPECT_FLOAT_EQ(ActorNoiseScale(actors, 1, 500), 0.65f);
  EXPECT_FLOAT_EQ(ActorNoiseScale(actors, 0, 1000), 0.1f);
  EXPECT_FLOAT_EQ(ActorNoiseScale(actors, 1, 5000), 0.3f);
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
      {[](config::ActorsConfig& a) { a.set_count(-1); }, "actors.count -1: must be >= 0"},
      {[](config::ActorsConfig& a) { a.set_noise_min(-0.5f); }, "actors.noise_min -0.5: must be >= 0"},
      {[](config::ActorsConfig& a) { a.set_noise_initial(std::nanf("")); }, "actors.noise_initial nan: must be >= 0"},
      {[](config::ActorsConfig& a) { a.set_noise_decay_frames(-5); }, "actors.noise_decay_frames -5: must be >= 0"},
      {[](config::ActorsConfig& a) { a.set_random_frames(-1); }, "actors.random_frames -1: must be >= 0"},
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

}  // namespace
}  // namespace troupe::actors
