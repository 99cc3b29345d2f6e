#include "gan/idx.h"

#include <zlib.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace troupe::gan {
namespace {

// Whole file, decompressed if gzip (zlib reads plain files unchanged).
absl::StatusOr<std::string> ReadMaybeGzip(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, n);
  const bool failed = n < 0;
  gzclose(f);
  if (failed) return absl::DataLossError(absl::StrCat(path, ": read or decompression error"));
  return out;
}

uint32_t BigEndian32(const std::string& s, size_t at) {
  return (uint32_t{static_cast<uint8_t>(s[at])} << 24) | (uint32_t{static_cast<uint8_t>(s[at + 1])} << 16) |
         (uint32_t{static_cast<uint8_t>(s[at + 2])} << 8) | uint32_t{static_cast<uint8_t>(s[at + 3])};
}

}  // namespace

absl::StatusOr<IdxImages> ReadIdxImages(const std::string& path) {
  auto bytes = ReadMaybeGzip(path);
  if (!bytes.ok()) return bytes.status();
  const std::string& s = *bytes;
  if (s.size() >= 4 && BigEndian32(s, 0) != 0x803) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: magic number 0x%08x, expected 0x00000803 (u8 images, 3 dims)", path, BigEndian32(s, 0)));
  }
  if (s.size() < 16) return absl::DataLossError(absl::StrCat(path, ": ", s.size(), " bytes, shorter than an IDX header"));
  IdxImages images;
  images.count = BigEndian32(s, 4);
  images.rows = BigEndian32(s, 8);
  images.cols = BigEndian32(s, 12);
  const size_t expected = 16 + static_cast<size_t>(images.count * images.rows * images.cols);
  if (s.size() != expected) {
    return absl::DataLossError(absl::StrCat(path, ": ", s.size(), " bytes, header says ", images.count, "x",
                                            images.rows, "x", images.cols, " = ", expected, " bytes"));
  }
  images.pixels.assign(s.begin() + 16, s.end());
  return images;
}

absl::StatusOr<std::vector<int32_t>> ReadIdxLabels(const std::string& path, int num_classes) {
  auto bytes = ReadMaybeGzip(path);
  if (!bytes.ok()) return bytes.status();
  const std::string& s = *bytes;
  if (s.size() >= 4 && BigEndian32(s, 0) != 0x801) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: magic number 0x%08x, expected 0x00000801 (u8 labels, 1 dim)", path, BigEndian32(s, 0)));
  }
  if (s.size() < 8) return absl::DataLossError(absl::StrCat(path, ": ", s.size(), " bytes, shorter than an IDX header"));
  const size_t count = BigEndian32(s, 4);
  if (s.size() != 8 + count) {
    return absl::DataLossError(absl::StrCat(path, ": ", s.size(), " bytes, header says ", count, " labels"));
  }
  std::vector<int32_t> labels(count);
  for (size_t i = 0; i < count; ++i) {
    labels[i] = static_cast<uint8_t>(s[8 + i]);
    if (labels[i] >= num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": label ", i, " is ", labels[i], ", expected < ", num_classes));
    }
  }
  return labels;
}

}  // namespace troupe::gan
