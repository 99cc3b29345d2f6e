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

TEST_F(LastRunSecondsTest, FindsTheLastRowOfAFileLongerThanTheTailItReads) {
  std::string text = "seconds,frames\n";
  for (int i = 0; i < 20000; ++i) text += std::to_string(i) + ".5,123456789\n";
  EXPECT_DOUBLE_EQ(LastRunSeconds(Write(text)), 19999.5);
  // The 64 KB tail starts inside a row ("123456.5,1" cut to ".5,1") and
  // holds no whole numeric row after it: the cut row is not read as 0.5.
  std::string cut = "seconds,frames\n";
  for (int i = 0; i < 100; ++i) cut += "123456.5,1\n";
  cut += "xy\n";  // 3 bytes, then 2-byte rows: 65,531 bytes after the numeric rows
  for (int i = 0; i < 32764; ++i) cut += "x\n";
  EXPECT_DOUBLE_EQ(LastRunSeconds(Write(cut)), 0.0);
}

}  // namespace
}  // namespace troupe
