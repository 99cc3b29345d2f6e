#include "replay/frame_store.h"

#include <zstd.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace troupe::replay {

Frame::Frame(std::string zstd, int32_t height, int32_t width, int32_t channels,
             std::shared_ptr<FrameCounters> counters)
    : zstd_(std::move(zstd)), height_(height), width_(width), channels_(channels), counters_(std::move(counters)) {
  zstd_.shrink_to_fit();
  counters_->frames.fetch_add(1, std::memory_order_relaxed);
  counters_->bytes.fetch_add(static_cast<int64_t>(zstd_.size()), std::memory_order_relaxed);
}

Frame::~Frame() {
  counters_->frames.fetch_sub(1, std::memory_order_relaxed);
  counters_->bytes.fetch_sub(static_cast<int64_t>(zstd_.size()), std::memory_order_relaxed);
}

FrameCompressor::FrameCompressor(int level) : ctx_(ZSTD_createCCtx()), level_(level) { TROUPE_CHECK(ctx_ != nullptr); }
FrameCompressor::~FrameCompressor() { ZSTD_freeCCtx(ctx_); }

void FrameCompressor::Compress(const void* raw, size_t bytes, std::string* out) {
  out->resize(ZSTD_compressBound(bytes));
  const size_t n = ZSTD_compressCCtx(ctx_, out->data(), out->size(), raw, bytes, level_);
  TROUPE_CHECK(!ZSTD_isError(n));  // the bound always suffices
  out->resize(n);
}

FrameDecoder::FrameDecoder() : ctx_(ZSTD_createDCtx()) { TROUPE_CHECK(ctx_ != nullptr); }
FrameDecoder::~FrameDecoder() { ZSTD_freeDCtx(ctx_); }

absl::Status FrameDecoder::Decode(const Frame& frame, void* dst) { return Decode(frame.zstd(), frame.raw_bytes(), dst); }

absl::Status FrameDecoder::Decode(const std::string& zstd, int64_t raw_bytes, void* dst) {
  const size_t n = ZSTD_decompressDCtx(ctx_, dst, static_cast<size_t>(raw_bytes), zstd.data(), zstd.size());
  if (ZSTD_isError(n)) return absl::DataLossError(absl::StrCat("frame does not decode: ", ZSTD_getErrorName(n)));
  if (static_cast<int64_t>(n) != raw_bytes) {
    return absl::DataLossError(absl::StrCat("frame decodes to ", n, " bytes, expected ", raw_bytes));
  }
  return absl::OkStatus();
}

FrameStore::FrameStore() : counters_(std::make_shared<FrameCounters>()) {}

absl::StatusOr<FramePtr> FrameStore::FromTensor(const proto::Tensor& tensor, FrameCompressor& compressor,
                                                const std::string& where) {
  // A frame is uint8 [H, W, C] with positive sizes.
  if (tensor.dtype() != proto::DTYPE_UINT8 || tensor.shape_size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a frame must be uint8 [H, W, C], got dtype ",
                                                   proto::DType_Name(tensor.dtype()), " with ", tensor.shape_size(),
                                                   " dimensions"));
  }
  for (int64_t d : tensor.shape()) {
    if (d <= 0 || d > 65536) return absl::InvalidArgumentError(absl::StrCat(where, ": frame dimension ", d, " out of range"));
  }
  const int64_t raw = tensor.shape(0) * tensor.shape(1) * tensor.shape(2);
  std::string zstd;
  switch (tensor.compression()) {
    case proto::COMPRESSION_NONE:
      // Raw pixels: compress here.
      if (static_cast<int64_t>(tensor.data().size()) != raw) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": frame has ", tensor.data().size(), " bytes, shape says ", raw));
      }
      compressor.Compress(tensor.data().data(), tensor.data().size(), &zstd);
      break;
    case proto::COMPRESSION_ZSTD: {
      // Compressed by the client: its declared content size must match.
      const unsigned long long size = ZSTD_getFrameContentSize(tensor.data().data(), tensor.data().size());
      if (size == ZSTD_CONTENTSIZE_ERROR || size == ZSTD_CONTENTSIZE_UNKNOWN || static_cast<int64_t>(size) != raw) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": zstd frame content size does not match shape (",
                                                       raw, " bytes expected)"));
      }
      zstd = tensor.data();
      break;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown compression ", tensor.compression()));
  }
  return std::make_shared<const Frame>(std::move(zstd), static_cast<int32_t>(tensor.shape(0)),
                                       static_cast<int32_t>(tensor.shape(1)), static_cast<int32_t>(tensor.shape(2)),
                                       counters_);
}

absl::StatusOr<FramePtr> FrameStore::FromZstd(std::string zstd, int32_t height, int32_t width, int32_t channels,
                                              const std::string& where) {
  const unsigned long long size = ZSTD_getFrameContentSize(zstd.data(), zstd.size());
  if (height <= 0 || width <= 0 || channels <= 0 ||
      size != static_cast<unsigned long long>(int64_t{height} * width * channels)) {
    return absl::DataLossError(absl::StrCat(where, ": stored frame does not match its shape"));
  }
  return std::make_shared<const Frame>(std::move(zstd), height, width, channels, counters_);
}

}  // namespace troupe::replay
