// IDX files (the MNIST / Fashion-MNIST format), plain or gzip-compressed:
// magic 0x00000803 (u8 images, [n, rows, cols]) or 0x00000801 (u8 labels, [n]).
#ifndef TROUPE_GAN_IDX_H_
#define TROUPE_GAN_IDX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace troupe::gan {

struct IdxImages {
  int64_t count = 0, rows = 0, cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols
};

// Reads an image file; errors name the path and what is wrong (magic number,
// header, size mismatch).
absl::StatusOr<IdxImages> ReadIdxImages(const std::string& path);
// Reads a label file; every label must be < `num_classes`.
absl::StatusOr<std::vector<int32_t>> ReadIdxLabels(const std::string& path, int num_classes);

}  // namespace troupe::gan

#endif  // TROUPE_GAN_IDX_H_
