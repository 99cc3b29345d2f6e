#include "common/files.h"

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace troupe {
namespace {

class LastRunSecondsTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    const std::string path = ::testing::TempDir() + "/last_run_seconds_metrics.csv";
    std::ofstream(path, std::ios::trunc) << text;
    return path;
  }
};

TEST_F(LastRunSecondsTest, IsTheFirstColumnOfTheLastWholeRow) {
  EXPECT_DOUBLE_EQ(LastRunSeconds(Write("seconds,frames\n1.5,100\n2.0,200\n3125.4,300\n")), 3125.4);
  // A row cut off by a killed writer (no newline yet) is not a row.
  EXPECT_DOUBLE_EQ(LastRunSeconds(Write("seconds,frames\n1.5,100\n2.0,200\n99")), 2.0);
  // Nothing to go on: 0.
  EXPECT_DOUBLE_EQ(LastRunSeconds(Write("seconds,frames\n")), 0.0);
  EXPECT_DOUBLE_EQ(LastRunSeconds(Write("")), 0.0);
  EXPECT_DOUBLE_EQ(LastRunSeconds(Write("seconds,frames\nnan,5\n")), 0.0);
  EXPECT_DOUBLE_EQ(LastRunSeconds(::testing::TempDir() + "/no_such_metrics.csv"), 0.0);
}

TEST_F(LastRunSecondsTest, ReadsOnlyTheTailOfALongFile) {
  std::string text = "seconds,frames\n";
  for (int i = 0; i < 20000; ++i) text += std::to_string(i) + ".5,123456789\n";
  EXPECT_DOUBLE_EQ(LastRunSeconds(Write(text)), 19999.5);
}

}  // namespace
}  // namespace troupe
