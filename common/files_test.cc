#include "common/files.h"

#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace troupe {
namespace {

TEST(ReadFileTest, GivesEveryByteAndNamesAMissingFile) {
  const std::string path = ::testing::TempDir() + "/read_file_test.bin";
  const std::string bytes("a\0b\nc\xff", 6);
  std::ofstream(path, std::ios::binary) << bytes;
  absl::StatusOr<std::string> read = ReadFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, bytes);
  std::filesystem::remove(path);
  read = ReadFile(path);
  EXPECT_TRUE(absl::IsNotFound(read.status())) << read.status();
  EXPECT_NE(read.status().message().find(path), std::string::npos) << read.status();
}

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

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string WriteLog(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::trunc) << text;
  return path;
}

TEST(DropRowsPastTest, DropsTheRowsPastTheLimitAndACutLastLine) {
  // A killed run's metrics: rows at 100..400 frames, a checkpoint at 250, and
  // a last row cut off mid-write.
  const std::string path = WriteLog("drop_rows.csv", "seconds,frames\n1.0,100\n2.0,200\n3.0,300\n4.0,400\n5.0,4");
  auto dropped = DropRowsPast(path, 250, /*header=*/true, [](std::string_view row) { return CsvNumber(row, 1); });
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(*dropped, (std::vector<std::string>{"3.0,300", "4.0,400", "5.0,4"}));
  EXPECT_EQ(ReadAll(path), "seconds,frames\n1.0,100\n2.0,200\n");
  // A row at the limit stays; appending goes on from a whole line.
  dropped = DropRowsPast(path, 200, true, [](std::string_view row) { return CsvNumber(row, 1); });
  ASSERT_TRUE(dropped.ok());
  EXPECT_TRUE(dropped->empty());
  EXPECT_EQ(ReadAll(path), "seconds,frames\n1.0,100\n2.0,200\n");
}

TEST(DropRowsPastTest, ReadsJsonLinesAndDropsRowsItCannotRead) {
  const std::string path = WriteLog("drop_rows.jsonl",
                                    "{\"seconds\": 1.0, \"frames\": 100}\n"
                                    "garbage\n"
                                    "{\"seconds\": 2.0, \"frames\": 300}\n"
                                    "{\"seconds\": 3.0, \"frames\": 50}\n");
  auto dropped = DropRowsPast(path, 200, /*header=*/false,
                              [](std::string_view row) { return JsonNumber(row, "frames"); });
  ASSERT_TRUE(dropped.ok()) << dropped.status();
  EXPECT_EQ(dropped->size(), 2u);
  EXPECT_EQ(ReadAll(path), "{\"seconds\": 1.0, \"frames\": 100}\n{\"seconds\": 3.0, \"frames\": 50}\n");
}

TEST(DropRowsPastTest, AMissingFileDropsNothing) {
  auto dropped = DropRowsPast(::testing::TempDir() + "/no_such_log.csv", 0, true,
                              [](std::string_view row) { return CsvNumber(row, 0); });
  ASSERT_TRUE(dropped.ok());
  EXPECT_TRUE(dropped->empty());
  EXPECT_FALSE(std::filesystem::exists(::testing::TempDir() + "/no_such_log.csv"));
}

TEST(DropRowsPastTest, ProgressReaders) {
  EXPECT_EQ(CsvNumber("1.5,200,x", 1), 200.0);
  EXPECT_EQ(CsvNumber("1.5,200,x", 2), std::nullopt);
  EXPECT_EQ(CsvNumber("1.5,200", 5), std::nullopt);
  EXPECT_EQ(CsvNumber("nan,200", 0), std::nullopt);
  EXPECT_EQ(JsonNumber("{\"frames\": 12, \"updates\": 3}", "updates"), 3.0);
  EXPECT_EQ(JsonNumber("{\"frames\": 12}", "updates"), std::nullopt);
  EXPECT_EQ(JsonNumber("{\"frames\": abc}", "frames"), std::nullopt);
}

}  // namespace
}  // namespace troupe
