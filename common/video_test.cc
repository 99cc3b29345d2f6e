#include "common/video.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

namespace troupe {
namespace {

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (std::to_string(::getpid()) + "-" + name)).string();
}

TEST(Mp4WriterTest, WritesFramesThatDecodeBackAtTheirSize) {
  const std::string path = TempPath("moving.mp4");
  VideoOptions options;
  options.width = 64;
  options.height = 48;
  options.frame_seconds = 0.04;
  auto writer = Mp4Writer::Open(path, options);
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::vector<uint8_t> rgb(64 * 48 * 3);
  for (int f = 0; f < 30; ++f) {
    // A bright square that moves, over grey.
    std::fill(rgb.begin(), rgb.end(), 90);
    for (int y = 10; y < 20; ++y)
      for (int x = f; x < f + 10; ++x) rgb[(y * 64 + x) * 3] = 250;
    ASSERT_TRUE((*writer)->AddFrame(rgb.data()).ok());
  }
  EXPECT_FALSE(std::filesystem::exists(path)) << "only the partial file exists before Finish";
  ASSERT_TRUE((*writer)->Finish().ok());
  auto info = ReadVideoInfo(path);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->frames, 30);
  EXPECT_EQ(info->width, 64);
  EXPECT_EQ(info->height, 48);
  EXPECT_EQ(info->codec, (*writer)->encoder() == "mpeg4" ? "mpeg4" : "h264");
  EXPECT_NEAR(info->seconds, 1.2, 0.1);
  std::filesystem::remove(path);
}

// The moving square read back: evenly spaced frames, the first and the last
// included, each where the square was when written.
TEST(Mp4WriterTest, ReadVideoFramesGivesEvenlySpacedFramesAsWritten) {
  const std::string path = TempPath("strip.mp4");
  auto writer = Mp4Writer::Open(path, VideoOptions{.width = 64, .height = 48});
  ASSERT_TRUE(writer.ok()) << writer.status();
  std::vector<uint8_t> rgb(64 * 48 * 3);
  for (int f = 0; f < 31; ++f) {
    std::fill(rgb.begin(), rgb.end(), 30);
    for (int y = 10; y < 30; ++y)
      for (int x = f; x < f + 20; ++x) std::fill_n(&rgb[(y * 64 + x) * 3], 3, 230);
    ASSERT_TRUE((*writer)->AddFrame(rgb.data()).ok());
  }
  ASSERT_TRUE((*writer)->Finish().ok());
  auto frames = ReadVideoFrames(path, 4);  // frames 0, 10, 20, 30
  ASSERT_TRUE(frames.ok()) << frames.status();
  ASSERT_EQ(frames->size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const Image& frame = (*frames)[i];
    ASSERT_EQ(frame.width, 64);
    ASSERT_EQ(frame.height, 48);
    const int left = 10 * i;  // the square's left edge in frame 10 i
    EXPECT_GT(frame.at(left + 10, 20)[0], 180) << "frame " << 10 * i << ": inside the square";
    EXPECT_LT(frame.at(left + 30, 20)[0], 80) << "frame " << 10 * i << ": right of the square";
    if (left > 5) {
      EXPECT_LT(frame.at(left - 5, 20)[0], 80) << "frame " << 10 * i << ": left of the square";
    }
  }
  auto all = ReadVideoFrames(path, 100);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 31u);
  EXPECT_EQ(ReadVideoFrames(path, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadVideoFrames(path + ".none", 3).status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove(path);
}

TEST(Mp4WriterTest, AbandonedWriterLeavesNoFile) {
  const std::string path = TempPath("abandoned.mp4");
  {
    auto writer = Mp4Writer::Open(path, VideoOptions{.width = 16, .height = 16});
    ASSERT_TRUE(writer.ok()) << writer.status();
    std::vector<uint8_t> rgb(16 * 16 * 3, 7);
    ASSERT_TRUE((*writer)->AddFrame(rgb.data()).ok());
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));
}

TEST(Mp4WriterTest, MissingEncoderIsAClearError) {
  auto writer = Mp4Writer::Open(TempPath("x.mp4"), VideoOptions{.encoder = "no-such-encoder"});
  ASSERT_FALSE(writer.ok());
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(writer.status().message().find("no-such-encoder"), std::string::npos) << writer.status();
}

TEST(Mp4WriterTest, OddSizeIsRefused) {
  auto writer = Mp4Writer::Open(TempPath("odd.mp4"), VideoOptions{.width = 15, .height = 16});
  ASSERT_FALSE(writer.ok());
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kInvalidArgument);
}

// In a child process (the module is loaded once per process): with the
// module named where none is, every call says so, names the path and how to
// turn videos off; nothing is written.
TEST(Mp4WriterTest, MissingModuleIsAClearErrorNamingWhereItLooked) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: not one that loaded the module already
  const std::string path = TempPath("no-module.mp4");
  EXPECT_EXIT(
      {
        setenv("TROUPE_VIDEO_MODULE", "/nonexistent/libtroupe_video_ffmpeg.so", 1);
        const absl::Status available = VideoAvailable();
        auto writer = Mp4Writer::Open(path, VideoOptions{.width = 16, .height = 16});
        const bool clear = available.code() == absl::StatusCode::kFailedPrecondition &&
                           available.message().find("/nonexistent/libtroupe_video_ffmpeg.so") != std::string::npos &&
                           available.message().find("evaluator.record_video: false") != std::string::npos &&
                           !writer.ok() && writer.status() == available &&
                           !std::filesystem::exists(path + ".partial");
        fprintf(stderr, "%s\n", std::string(available.message()).c_str());
        std::exit(clear ? 3 : 4);
      },
      testing::ExitedWithCode(3), "libtroupe_video_ffmpeg.so");
}

// A file that is not the module (here: a text file) is refused, not run.
TEST(Mp4WriterTest, WrongModuleFileIsRefused) {
  const std::string fake = TempPath("libtroupe_video_ffmpeg.so");
  { std::ofstream(fake) << "not a shared object\n"; }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("TROUPE_VIDEO_MODULE", fake.c_str(), 1);
        const absl::Status available = VideoAvailable();
        fprintf(stderr, "%s\n", std::string(available.message()).c_str());
        std::exit(available.code() == absl::StatusCode::kFailedPrecondition ? 3 : 4);
      },
      testing::ExitedWithCode(3), "cannot load");
  std::filesystem::remove(fake);
}

TEST(Mp4WriterTest, DebianFfmpegHasH264) {
  auto encoder = FindVideoEncoder();
  ASSERT_TRUE(encoder.ok()) << encoder.status();
  EXPECT_EQ(*encoder, "libx264");
}

}  // namespace
}  // namespace troupe
