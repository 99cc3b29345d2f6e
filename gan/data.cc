#include "gan/data.h"

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "gan/fashion_classifier.h"

namespace troupe::gan {

absl::Status CheckGanDataFiles(const std::string& dir) {
  // A missing directory or file: say which package provides it.
  for (const char* name : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                           "t10k-labels-idx1-ubyte.gz"}) {
    const std::string path = absl::StrCat(dir, "/", name);
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      return absl::NotFoundError(absl::StrCat("gan.data_dir ", dir, ": Fashion-MNIST file ", path,
                                              " not found: install Debian's ", kDataPackage, " (apt-get install ",
                                              kDataPackage, ", or tools/install_deps.sh), or set gan.data_dir"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<GanData> LoadGanData(const std::string& dir) {
  if (absl::Status files = CheckGanDataFiles(dir); !files.ok()) return files;
  // The classifier's loader validates magic numbers, sizes, truncation and counts.
  absl::StatusOr<FashionMnist> raw = LoadFashionMnist(dir);
  if (!raw.ok()) return raw.status();
  GanData data;
  data.train_count = static_cast<int64_t>(raw->train_labels.size());
  data.test_count = static_cast<int64_t>(raw->test_labels.size());
  data.train01 = std::move(raw->train_images);
  data.test = std::move(raw->test_images);
  data.train.resize(data.train01.size());
  for (size_t i = 0; i < data.train01.size(); ++i) data.train[i] = data.train01[i] * 2.0f - 1.0f;
  return data;
}

ShardSampler::ShardSampler(const GanData* data, uint64_t seed, int64_t global_batch, int replica, int replicas)
    : data_(data), seed_(seed), shard_(global_batch / replicas), offset_(replica * (global_batch / replicas)) {}

void ShardSampler::EnsureEpoch(int64_t epoch) {
  if (epoch == epoch_) return;
  // The same permutation on every replica: seeded by (seed, epoch) only.
  order_.resize(data_->train_count);
  std::iota(order_.begin(), order_.end(), 0);
  std::mt19937_64 rng(seed_ * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(epoch) + 1);
  std::shuffle(order_.begin(), order_.end(), rng);
  epoch_ = epoch;
}

void ShardSampler::Fill(int64_t position, float* out) {
  for (int64_t row = 0; row < shard_; ++row) {
    const int64_t p = position + offset_ + row;
    EnsureEpoch(p / data_->train_count);
    const int64_t image = order_[p % data_->train_count];
    std::copy_n(data_->train.data() + image * kPixels, kPixels, out + row * kPixels);
  }
}

}  // namespace troupe::gan
