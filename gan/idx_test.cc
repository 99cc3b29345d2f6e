// IDX parsing: wrong magic numbers and truncated files are refused, naming what was expected.
#include "gan/idx.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::gan {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "." + std::to_string(::getpid()))).string();
}

TEST(IdxTest, RejectsWrongMagicAndWrongSize) {
  const std::string path = TempPath("troupe_idx");
  {
    std::ofstream f(path, std::ios::binary);
    const unsigned char header[] = {0, 0, 8, 1, 0, 0, 0, 3, 1, 2};  // labels: 3 declared, 2 present
    f.write(reinterpret_cast<const char*>(header), sizeof(header));
  }
  EXPECT_THAT(ReadIdxImages(path).status().message(), HasSubstr("expected 0x00000803"));
  EXPECT_THAT(ReadIdxLabels(path, 10).status().message(), HasSubstr("header says 3 labels"));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace troupe::gan
