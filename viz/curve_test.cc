#include "viz/curve.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace troupe::viz {
namespace {
using ::testing::HasSubstr;

std::string TempFile(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / (name + "_" + std::to_string(getpid()) + ".csv")).string();
}

TEST(CurveTest, ReadsTheNamedColumnsAndSkipsAHalfWrittenLastLine) {
  const std::string path = TempFile("episodes");
  std::ofstream(path) << "episode,env,frames,return,seconds\n1,0,1000,12.5,1.0\n2,0,2000,30,2.0\n3,0,30";
  auto curve = ReadCurveCsv(path, "frames", "return", "episodes");
  ASSERT_TRUE(curve.ok()) << curve.status();
  ASSERT_EQ(curve->points.size(), 2u);
  EXPECT_EQ(curve->points[1], std::make_pair(2000.0, 30.0));
}

TEST(CurveTest, MissingColumnListsTheHeader) {
  const std::string path = TempFile("nocolumn");
  std::ofstream(path) << "episode,frames\n1,2\n";
  auto curve = ReadCurveCsv(path, "frames", "return", "x");
  ASSERT_EQ(curve.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(curve.status().message(), HasSubstr("no column 'return'; the header has: episode, frames"));
}

TEST(CurveTest, BadNumberNamesTheLine) {
  const std::string path = TempFile("badnumber");
  std::ofstream(path) << "frames,return\n1,2\n3,oops\n";
  EXPECT_THAT(ReadCurveCsv(path, "frames", "return", "x").status().message(), HasSubstr(":3:"));
}

TEST(CurveTest, CurveFileFollowsAGrowingFile) {
  const std::string path = TempFile("growing");
  std::filesystem::remove(path);
  CurveFile file(path, "frames", "return", "episodes");
  EXPECT_FALSE(file.Refresh());
  EXPECT_TRUE(file.curve().points.empty());
  std::ofstream(path) << "frames,return\n1,2\n";
  EXPECT_TRUE(file.Refresh());
  EXPECT_EQ(file.curve().points.size(), 1u);
  std::ofstream(path, std::ios::app) << "2,3\n";
  EXPECT_TRUE(file.Refresh());
  EXPECT_EQ(file.curve().points.size(), 2u);
}

}  // namespace
}  // namespace troupe::viz
