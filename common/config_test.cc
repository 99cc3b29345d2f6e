#include "common/config.h"

#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe {
namespace {

using ::testing::HasSubstr;

TEST(ConfigTest, ParsesTextAndKeepsSchemaDefaults) {
  config::ExperimentConfig c;
  ASSERT_TRUE(ParseTextConfig("env { task: \"walker.walk\" action_repeat: 2 }", "x.textproto", &c).ok());
  EXPECT_EQ(c.env().task(), "walker.walk");
  EXPECT_EQ(c.env().action_repeat(), 2);
  EXPECT_EQ(c.env().render().width(), 84);  // default from the schema
}

TEST(ConfigTest, SyntaxErrorNamesFileLineAndColumn) {
  config::ExperimentConfig c;
  auto status = ParseTextConfig("env {\n  task: \"walker.walk\"\n  action_repeat: two\n}\n", "bad.textproto", &c);
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("bad.textproto:3:"));
}

TEST(ConfigTest, UnknownFieldInFileIsAnError) {
  config::ExperimentConfig c;
  auto status = ParseTextConfig("env { tsk: \"walker.walk\" }", "bad.textproto", &c);
  EXPECT_THAT(status.message(), HasSubstr("tsk"));
}

TEST(ConfigTest, OverridesSetNestedScalarsAndBareStrings) {
  config::ExperimentConfig c;
  ASSERT_TRUE(ApplyOverride("env.task=cheetah.run", &c).ok());
  ASSERT_TRUE(ApplyOverride("env.render.width=64", &c).ok());
  ASSERT_TRUE(ApplyOverride("env.render.shadows=true", &c).ok());
  ASSERT_TRUE(ApplyOverride("total_frames=5000", &c).ok());
  EXPECT_EQ(c.env().task(), "cheetah.run");
  EXPECT_EQ(c.env().render().width(), 64);
  EXPECT_TRUE(c.env().render().shadows());
  EXPECT_EQ(c.total_frames(), 5000);
}

TEST(ConfigTest, BadOverridesSayWhatIsWrong) {
  config::ExperimentConfig c;
  EXPECT_THAT(ApplyOverride("env.tsk=x", &c).message(), HasSubstr("EnvConfig has no field 'tsk' (it has: task"));
  EXPECT_THAT(ApplyOverride("env.render.width=wide", &c).message(), HasSubstr("'wide' is not a valid int32"));
  EXPECT_THAT(ApplyOverride("env", &c).message(), HasSubstr("expected path.to.field=value"));
  EXPECT_THAT(ApplyOverride("env=3", &c).message(), HasSubstr("is a message"));
}

TEST(ConfigTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadExperimentConfig("/no/such/config.textproto", {}).status().code(), absl::StatusCode::kNotFound);
}

TEST(ConfigTest, EveryShippedConfigParses) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(TROUPE_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".textproto") continue;
    auto c = LoadExperimentConfig(entry.path().string(), {});
    EXPECT_TRUE(c.ok()) << entry.path() << ": " << c.status();
    ++count;
  }
  EXPECT_GE(count, 8);
}

}  // namespace
}  // namespace troupe
