#include "common/config.h"

#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/files.h"
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

TEST(ConfigTest, AChoiceWrittenAsTheOldStringSaysTheNewSpellingWithFileAndLine) {
  config::ExperimentConfig c;
  auto status = ParseTextConfig("name: \"x\"\nmode: \"rl\"\n", "old.textproto", &c);
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("old.textproto:2:7:"));
  EXPECT_THAT(status.message(), HasSubstr("got: \"rl\"; mode is a choice, written without quotes: mode: RL (one of SCRIPTED, RL, GAN)"));
  status = ParseTextConfig("env {\n  observation: \"pixels\" }", "old.textproto", &c);
  EXPECT_THAT(status.message(), HasSubstr("old.textproto:2:16:"));
  EXPECT_THAT(status.message(), HasSubstr("observation: PIXELS (one of PIXELS, STATE)"));
}

TEST(ConfigTest, AnUnknownChoiceListsTheChoices) {
  config::ExperimentConfig c;
  auto status = ParseTextConfig("env { observation: RGBD }", "bad.textproto", &c);
  EXPECT_THAT(status.message(), HasSubstr("bad.textproto:1:"));
  EXPECT_THAT(status.message(), HasSubstr("RGBD"));
  EXPECT_THAT(status.message(), HasSubstr("(one of PIXELS, STATE)"));
  ASSERT_TRUE(ParseTextConfig("mode: GAN env { observation: STATE }", "good.textproto", &c).ok());
  EXPECT_EQ(c.mode(), config::ExperimentConfig::GAN);
  EXPECT_EQ(c.env().observation(), config::EnvConfig::STATE);
}

// config.textproto of a run directory as troupe wrote it before replay
// tables' selector and their fields' dtype were enums (quoted strings).
constexpr char kOldRunConfig[] = R"(name: "old"
mode: RL
env {
  task: "cartpole.swingup"
}
replay {
  tables {
    name: "frames"
    max_size: 1000
    selector: "prioritized"
    fields {
      name: "pixels"
      dtype: "uint8"
      shape: 84
      shape: 84
      shape: 3
      frames: 3
    }
    fields {
      name: "reward"
      dtype: "float32"
    }
  }
  tables {
    name: "queue"
    selector: "fifo"
    fields {
      name: "x"
      dtype: "int64"
      shape: 2
    }
  }
}
)";

TEST(ConfigTest, AnOldRunDirectorysQuotedSelectorAndDTypesReadAsTheirEnums) {
  const std::string path = ::testing::TempDir() + "/config_test_old_run.textproto";
  {
    std::ofstream out(path);
    out << kOldRunConfig;
  }
  auto loaded = LoadExperimentConfigWithSource(path, {});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const config::ReplayConfig& replay = loaded->config.replay();
  ASSERT_EQ(replay.tables_size(), 2);
  EXPECT_EQ(replay.tables(0).selector(), config::ReplayTableConfig::prioritized);
  EXPECT_EQ(replay.tables(0).fields(0).dtype(), config::ReplayFieldConfig::uint8);
  EXPECT_EQ(replay.tables(0).fields(1).dtype(), config::ReplayFieldConfig::float32);
  EXPECT_EQ(replay.tables(1).selector(), config::ReplayTableConfig::fifo);
  EXPECT_EQ(replay.tables(1).fields(0).dtype(), config::ReplayFieldConfig::int64);
  // Lines stay where they were written.
  EXPECT_EQ(loaded->source.lines.at("replay.tables[0].selector"), 10);
  // The same config written bare, as troupe writes it now, is the same config.
  std::string bare = kOldRunConfig;
  for (const char* quoted : {"\"prioritized\"", "\"uint8\"", "\"float32\"", "\"fifo\"", "\"int64\""}) {
    const std::string value(quoted + 1, std::strlen(quoted) - 2);
    for (size_t at = bare.find(quoted); at != std::string::npos; at = bare.find(quoted)) bare.replace(at, std::strlen(quoted), value);
  }
  config::ExperimentConfig parsed;
  ASSERT_TRUE(ParseTextConfig(bare, "new.textproto", &parsed).ok());
  EXPECT_EQ(parsed.SerializeAsString(), loaded->config.SerializeAsString());
  std::filesystem::remove(path);
}

TEST(ConfigTest, ABadSelectorOrDTypeNamesTheFieldAndItsValues) {
  config::ExperimentConfig c;
  auto status = ParseTextConfig("replay {\n  tables {\n    selector: \"lifo\"\n  }\n}\n", "bad.textproto", &c);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("bad.textproto:3:"));
  EXPECT_THAT(status.message(), HasSubstr("\"lifo\" for field \"selector\""));
  EXPECT_THAT(status.message(), HasSubstr("(one of uniform, prioritized, fifo)"));
  status = ParseTextConfig("replay { tables { fields { name: \"x\" dtype: float16 } } }", "bad.textproto", &c);
  EXPECT_THAT(status.message(), HasSubstr("\"float16\" for field \"dtype\""));
  EXPECT_THAT(status.message(), HasSubstr("(one of float32, float64, int32, int64, uint8)"));
  // A quoted value that is no name at all is refused as a quoted choice.
  status = ParseTextConfig("replay { tables { selector: \"a b\" } }", "bad.textproto", &c);
  EXPECT_THAT(status.message(), HasSubstr("selector is a choice, written without quotes (one of uniform, prioritized, fifo)"));
}

TEST(ConfigTest, UnquotingFormerStringEnumsTouchesOnlyTheirValues) {
  // Quotes become spaces: every position stays.
  EXPECT_EQ(UnquoteFormerStringEnums("selector: \"fifo\" dtype:'uint8'"), "selector:  fifo  dtype: uint8 ");
  // Other fields, strings, comments and values that are no name are left alone.
  for (const char* kept : {"name: \"fifo\"", "task: \"selector: \\\"fifo\\\"\"", "# selector: \"fifo\"\n",
                           "selector: \"a b\"", "selector: \"1x\"", "my_selector: \"fifo\"", "selector: fifo"}) {
    EXPECT_EQ(UnquoteFormerStringEnums(kept), kept);
  }
}

TEST(ConfigTest, AMovedFieldSaysWhereItWent) {
  config::ExperimentConfig c;
  auto status = ParseTextConfig("learner {\n  batch_size: 64\n  replicas: 2\n}", "old.textproto", &c);
  EXPECT_THAT(status.message(), HasSubstr("old.textproto:3:"));
  EXPECT_THAT(status.message(), HasSubstr("has no field named \"replicas\"; learner.replicas is now learner.engine.replicas"));
  status = ParseTextConfig("gan { backend: \"mpi\" }", "old.textproto", &c);
  EXPECT_THAT(status.message(), HasSubstr("gan.backend is now gan.engine.collectives"));
  EXPECT_THAT(ApplyOverride("learner.threads=2", &c).message(),
              HasSubstr("--set learner.threads=2: learner.threads is now learner.engine.threads"));
  ASSERT_TRUE(ApplyOverride("learner.engine.collectives=MPI", &c).ok());
  EXPECT_EQ(c.learner().engine().collectives(), config::EngineConfig::MPI);
}

TEST(ConfigTest, ABadOverrideIsReportedOnceInTroupesOwnWords) {
  config::ExperimentConfig c;
  ::testing::internal::CaptureStderr();
  const absl::Status count = ApplyOverride("actors.count=abc", &c);
  const absl::Status mode = ApplyOverride("mode=rl", &c);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");  // no libprotobuf ERROR line
  EXPECT_THAT(count.message(), HasSubstr("'abc' is not a valid int32 for actors.count"));
  EXPECT_THAT(mode.message(), HasSubstr("'rl' is not a value of mode (one of SCRIPTED, RL, GAN)"));
  ASSERT_TRUE(ApplyOverride("mode=RL", &c).ok());
  EXPECT_EQ(c.mode(), config::ExperimentConfig::RL);
}

TEST(ConfigTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadExperimentConfig("/no/such/config.textproto", {}).status().code(), absl::StatusCode::kNotFound);
}

TEST(ConfigTest, EveryShippedConfigParses) {
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(ProjectPath("configs"))) {
    if (entry.path().extension() != ".textproto") continue;
    auto c = LoadExperimentConfig(entry.path().string(), {});
    EXPECT_TRUE(c.ok()) << entry.path() << ": " << c.status();
    ++count;
  }
  EXPECT_GE(count, 8);
}

TEST(ConfigSourceTest, ARefusalSaysTheLineOfTheFieldOrTheOverrideThatSetIt) {
  auto loaded = ParseExperimentConfig("name: \"x\"\nlearner {\n  batch_size: 10\n  engine { replicas: 3 }\n}\n"
                                      "d4pg {\n  hidden: [256, 0]\n}\nreplay {\n  tables {\n    name: \"t\"\n"
                                      "    max_size: 0\n  }\n}\n",
                                      "x.textproto", {"d4pg.discount=2"});
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const ConfigSource& source = loaded->source;
  EXPECT_EQ(source.Locate("learner.batch_size 10: must be divisible by learner.engine.replicas 3"),
            "x.textproto:3: learner.batch_size 10: must be divisible by learner.engine.replicas 3");
  EXPECT_EQ(source.Locate("learner.engine.replicas 3: too many"), "x.textproto:4: learner.engine.replicas 3: too many");
  // An element of a list written [a, b]: the list's line.
  EXPECT_EQ(source.Locate("d4pg.hidden[1] 0: must be in [1, 8192]"), "x.textproto:7: d4pg.hidden[1] 0: must be in [1, 8192]");
  EXPECT_EQ(source.Locate("replay.tables[0].max_size 0: must be in [1, 268435456]"),
            "x.textproto:12: replay.tables[0].max_size 0: must be in [1, 268435456]");
  // An override wins over the file.
  EXPECT_EQ(source.Locate("d4pg.discount 2: must be in (0, 1]"), "--set d4pg.discount=2: d4pg.discount 2: must be in (0, 1]");
  // A field at its default: the enclosing message's line, saying so.
  EXPECT_EQ(source.Locate("learner.min_replay_size 1000: too big"),
            "x.textproto:2: learner.min_replay_size 1000: too big (learner.min_replay_size is not set in the file: "
            "that is its default)");
  // Words that are not fields of the schema are not taken for one.
  EXPECT_EQ(source.Locate("unknown task 'cartpole.swingdown'"), "x.textproto: unknown task 'cartpole.swingdown'");
  // Two fields named, one from the file and one from an override: the
  // override is blamed (it was applied last), the file's line said too.
  EXPECT_EQ(source.Locate("learner.batch_size 10: must be in (0, d4pg.discount 2)"),
            "--set d4pg.discount=2: learner.batch_size 10: must be in (0, d4pg.discount 2) (learner.batch_size is set "
            "at x.textproto:3)");
  EXPECT_EQ(source.Annotate(absl::InvalidArgumentError("name \"x\": bad")).message(), "x.textproto:1: name \"x\": bad");
}

TEST(ConfigSourceTest, AParseErrorPointsAtTheUnknownNameItself) {
  auto loaded = ParseExperimentConfig("mode: RL\nlearner {\n  replicas: 2\n}\n", "x.textproto", {});
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().message(), HasSubstr("x.textproto:3:3: Message type"));
  loaded = ParseExperimentConfig("mode: RLX\n", "y.textproto", {});
  EXPECT_THAT(loaded.status().message(), HasSubstr("y.textproto:1:7: Unknown enumeration value of \"RLX\""));
}

TEST(ConfigTest, OnlyARegularFileOfASaneSizeIsAConfig) {
  const std::string dir = ::testing::TempDir();
  auto loaded = LoadExperimentConfigWithSource(dir, {});
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(loaded.status().message(), HasSubstr("not a regular file (a directory)"));
  EXPECT_THAT(LoadExperimentConfigWithSource("/dev/zero", {}).status().message(), HasSubstr("not a regular file"));
  const std::string big = dir + "/config_test_big.textproto";
  {
    std::ofstream out(big);
    out << std::string(kMaxConfigFileBytes + 1, '#');
  }
  EXPECT_THAT(LoadExperimentConfigWithSource(big, {}).status().message(), HasSubstr("more than a config can be"));
  std::filesystem::remove(big);
}

}  // namespace
}  // namespace troupe
