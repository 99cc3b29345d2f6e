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
  EXPECT_EQ(ReadFile(path).value_or(""), "seconds,frames\n1.0,100\n2.0,200\n");
  // A row at the limit stays; appending goes on from a whole line.
  dropped = DropRowsPast(path, 200, true, [](std::string_view row) { return CsvNumber(row, 1); });
  ASSERT_TRUE(dropped.ok());
  EXPECT_TRUE(dropped->empty());
  EXPECT_EQ(ReadFile(path).value_or(""), "seconds,frames\n1.0,100\n2.0,200\n");
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
  EXPECT_EQ(ReadFile(path).value_or(""), "{\"seconds\": 1.0, \"frames\": 100}\n{\"seconds\": 3.0, \"frames\": 50}\n");
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
