// Fashion-MNIST for the GAN mode: Debian's dataset-fashion-mnist IDX files
// read with validation (gan/idx.h checks magic numbers, header sizes
// and truncation; the counts are checked here), pixels scaled to [-1, 1] (the
// generator's tanh range), and the input pipeline's sharding: every epoch is
// one permutation of the 60,000 training images drawn from (seed, epoch), the
// global batch is the next `batch` images of that stream, and replica r of K
// takes rows [r * batch / K, (r + 1) * batch / K) of it. The stream position
// is a count of images, so a resumed run continues the same stream.
//
// Immutable after loading; ShardSampler is per replica (not thread-safe).
#ifndef TROUPE_GAN_DATA_H_
#define TROUPE_GAN_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace troupe::gan {

inline constexpr int kImageSize = 28;
inline constexpr int64_t kPixels = kImageSize * kImageSize;
inline constexpr char kDataPackage[] = "dataset-fashion-mnist";

struct GanData {
  int64_t train_count = 0, test_count = 0;
  std::vector<float> train;   // [train_count, 1, 28, 28] in [-1, 1]
  std::vector<float> test;    // [test_count, 1, 28, 28] in [0, 1] (the classifier's range)
  std::vector<float> train01; // the training images in [0, 1] (the real-against-real FID floor)
};

// Reads the four IDX files from `dir`. Errors: NotFound naming the file and
// the Debian package to install when a file is missing; InvalidArgument (bad
// magic number) or DataLoss (truncated, wrong sizes or counts) naming the file.
absl::StatusOr<GanData> LoadGanData(const std::string& dir);

// OK when `dir` holds the four Fashion-MNIST files as regular files (what a
// config is checked for before a run starts; their contents are checked by
// LoadGanData). NotFound "gan.data_dir ...: ... not found: install ..."
// otherwise.
absl::Status CheckGanDataFiles(const std::string& dir);

// One replica's view of the global batch stream.
class ShardSampler {
 public:
  // `data` must outlive the sampler; 0 <= replica < replicas, and replicas
  // divides global_batch (checked by the config's validation).
  ShardSampler(const GanData* data, uint64_t seed, int64_t global_batch, int replica, int replicas);

  int64_t shard() const { return shard_; }
  // Copies this replica's rows of the global batch that starts at stream
  // position `position` (images) into out[shard * 784].
  void Fill(int64_t position, float* out);

 private:
  void EnsureEpoch(int64_t epoch);
  const GanData* data_;
  uint64_t seed_;
  int64_t shard_, offset_;
  int64_t epoch_ = -1;
  std::vector<int32_t> order_;
};

}  // namespace troupe::gan

#endif  // TROUPE_GAN_DATA_H_
