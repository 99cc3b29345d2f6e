#include "common/image.h"

#include <cstdio>
#include <fstream>

#include "gtest/gtest.h"

namespace troupe {
namespace {

TEST(ImageTest, PngRoundTripKeepsEveryPixel) {
  Image image(/*w=*/7, /*h=*/5, /*c=*/3);
  for (size_t i = 0; i < image.pixels.size(); ++i) image.pixels[i] = uint8_t(i * 37);
  const std::string path = ::testing::TempDir() + "/roundtrip.png";
  ASSERT_TRUE(WritePng(path, image).ok());
  auto read = ReadPng(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->width, 7);
  EXPECT_EQ(read->height, 5);
  EXPECT_EQ(read->pixels, image.pixels);
}

TEST(ImageTest, TruncatedPngIsDataLossNamingThePath) {
  Image image(/*w=*/16, /*h=*/16, /*c=*/3);
  const std::string path = ::testing::TempDir() + "/truncated.png";
  ASSERT_TRUE(WritePng(path, image).ok());
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  auto read = ReadPng(path);
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find(path), std::string::npos) << read.status();
}

TEST(ImageTest, NonPngIsRejected) {
  const std::string path = ::testing::TempDir() + "/not_a.png";
  std::ofstream(path) << "hello, not a png";
  auto read = ReadPng(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace troupe
