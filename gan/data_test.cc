// Bad data files give clear errors; shards of K replicas make the global batch.
#include "gan/data.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::gan {
namespace {

using ::testing::HasSubstr;

std::string BigEndian(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

// A directory with the four file names, plain (uncompressed) IDX contents.
class BadDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() /
            ("troupe_gan_data_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    std::filesystem::create_directories(dir_);
    Write("train-labels-idx1-ubyte.gz", BigEndian(0x801) + BigEndian(60000) + std::string(60000, '\1'));
    Write("t10k-images-idx3-ubyte.gz", BigEndian(0x803) + BigEndian(10000) + BigEndian(28) + BigEndian(28) +
                                           std::string(10000 * 784, '\0'));
    Write("t10k-labels-idx1-ubyte.gz", BigEndian(0x801) + BigEndian(10000) + std::string(10000, '\2'));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void Write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << bytes;
  }
  std::string dir_;
};

TEST(GanDataTest, MissingFilesNameTheDebianPackage) {
  auto data = LoadGanData("/nonexistent/fashion");
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(), HasSubstr("/nonexistent/fashion/train-images-idx3-ubyte.gz"));
  EXPECT_THAT(data.status().message(), HasSubstr("dataset-fashion-mnist"));
}

TEST_F(BadDataTest, TruncatedImageFileIsDataLossNamingTheFile) {
  Write("train-images-idx3-ubyte.gz",
        BigEndian(0x803) + BigEndian(60000) + BigEndian(28) + BigEndian(28) + std::string(1000, '\0'));
  auto data = LoadGanData(dir_);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(data.status().message(), HasSubstr("train-images-idx3-ubyte.gz: 1016 bytes, header says 60000x28x28"));
}

TEST_F(BadDataTest, WrongMagicNumberIsInvalidArgument) {
  Write("train-images-idx3-ubyte.gz", BigEndian(0x801) + BigEndian(60000) + std::string(60000, '\0'));
  auto data = LoadGanData(dir_);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("magic number 0x00000801, expected 0x00000803"));
}

TEST_F(BadDataTest, WrongImageCountIsAnError) {
  Write("train-images-idx3-ubyte.gz",
        BigEndian(0x803) + BigEndian(10) + BigEndian(28) + BigEndian(28) + std::string(10 * 784, '\0'));
  auto data = LoadGanData(dir_);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(data.status().message(), HasSubstr("expected 60000 of 28x28"));
}

TEST_F(BadDataTest, HeaderShorterThanIdxIsAnError) {
  Write("train-images-idx3-ubyte.gz", BigEndian(0x803) + "\0\0");
  auto data = LoadGanData(dir_);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(data.status().message(), HasSubstr("shorter than an IDX header"));
}

TEST(ShardSamplerTest, TwoReplicaShardsMakeTheOneReplicaBatchAcrossEpochs) {
  GanData data;
  data.train_count = 10;
  data.train.resize(10 * kPixels);
  for (int i = 0; i < 10; ++i) std::fill_n(data.train.begin() + i * kPixels, kPixels, static_cast<float>(i));
  ShardSampler whole(&data, /*seed=*/4, /*global_batch=*/4, /*replica=*/0, /*replicas=*/1);
  ShardSampler first(&data, 4, 4, 0, 2), second(&data, 4, 4, 1, 2);
  std::vector<float> a(4 * kPixels), b(4 * kPixels);
  std::vector<int> seen(10, 0);
  for (int64_t position = 0; position < 20; position += 4) {  // two epochs, crossing a boundary at 8..12
    whole.Fill(position, a.data());
    first.Fill(position, b.data());
    second.Fill(position, b.data() + 2 * kPixels);
    EXPECT_EQ(a, b) << "at position " << position;
    for (int row = 0; row < 4; ++row) seen[static_cast<int>(a[row * kPixels])]++;
  }
  // Each epoch is a permutation: every image twice in two epochs.
  for (int i = 0; i < 10; ++i) EXPECT_EQ(seen[i], 2) << "image " << i;
}

}  // namespace
}  // namespace troupe::gan
