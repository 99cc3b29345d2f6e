#include "replay/frame_store.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace troupe::replay {

Frame::Frame(std::string data, proto::Compression codec, int32_t height, int32_t width, int32_t channels,
             std::shared_ptr<FrameCounters> counters, FramePtr reference)
    : data_(std::move(data)),
      codec_(codec),
      height_(height),
      width_(width),
      channels_(channels),
      depth_(reference ? reference->depth() + 1 : 0),
      id_(counters->next_id.fetch_add(1, std::memory_order_relaxed)),
      counters_(std::move(counters)),
      reference_(std::move(reference)) {
  data_.shrink_to_fit();
  counters_->frames.fetch_add(1, std::memory_order_relaxed);
  counters_->bytes.fetch_add(static_cast<int64_t>(data_.size()), std::memory_order_relaxed);
}

Frame::~Frame() {
  counters_->frames.fetch_sub(1, std::memory_order_relaxed);
  counters_->bytes.fetch_sub(static_cast<int64_t>(data_.size()), std::memory_order_relaxed);
}

absl::Status FrameDecoder::Decode(const Frame& frame, void* dst) {
  BeginBatch();
  return DecodeInBatch(frame, static_cast<uint8_t*>(dst));
}

absl::Status FrameDecoder::Check(const Frame& frame) {
  BeginBatch();
  return Place(frame, nullptr).status();
}

void FrameDecoder::BeginBatch() {
  ++batch_;
  placed_ = 0;
  scratch_used_ = 0;
}

absl::Status FrameDecoder::DecodeInBatch(const Frame& frame, uint8_t* dst) {
  ASSIGN_OR_RETURN(const uint8_t* at, Place(frame, dst));
  if (at != dst) std::memcpy(dst, at, static_cast<size_t>(frame.raw_bytes()));
  return absl::OkStatus();
}

uint8_t* FrameDecoder::Scratch(int64_t bytes) {
  if (scratch_used_ == scratch_.size()) {
    scratch_.push_back(nullptr);
    scratch_bytes_.push_back(0);
  }
  if (scratch_bytes_[scratch_used_] < bytes) {
    scratch_[scratch_used_] = std::make_unique<uint8_t[]>(bytes);
    scratch_bytes_[scratch_used_] = bytes;
  }
  return scratch_[scratch_used_++].get();
}

absl::StatusOr<const uint8_t*> FrameDecoder::Place(const Frame& frame, uint8_t* dst) {
  // Grow the table to keep it at most half full (rehashing this batch's entries).
  if (static_cast<size_t>(2 * (placed_ + 1)) > slots_.size()) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(std::max<size_t>(64, 2 * old.size()), Slot{});
    for (const Slot& s : old) {
      if (s.batch != batch_) continue;
      size_t i = std::hash<const Frame*>()(s.frame) * 0x9E3779B97F4A7C15ull >> 20;
      while (slots_[i & (slots_.size() - 1)].batch == batch_) ++i;
      slots_[i & (slots_.size() - 1)] = s;
    }
  }
  // Decoded already in this batch?
  const size_t mask = slots_.size() - 1;
  size_t i = std::hash<const Frame*>()(&frame) * 0x9E3779B97F4A7C15ull >> 20;
  for (; slots_[i & mask].batch == batch_; ++i) {
    if (slots_[i & mask].frame == &frame) return slots_[i & mask].data;
  }
  // Its reference first, then the frame itself (into dst, else scratch).
  const uint8_t* reference = nullptr;
  if (frame.reference() != nullptr) {
    ASSIGN_OR_RETURN(reference, Place(*frame.reference(), nullptr));
  }
  uint8_t* out = dst != nullptr ? dst : Scratch(frame.raw_bytes());
  RETURN_IF_ERROR(decompressor_.Decode(frame.data(), frame.codec(), frame.raw_bytes(), out, reference));
  // The table may have grown while placing the reference: find a free slot again.
  const size_t mask_now = slots_.size() - 1;
  size_t j = std::hash<const Frame*>()(&frame) * 0x9E3779B97F4A7C15ull >> 20;
  while (slots_[j & mask_now].batch == batch_) ++j;
  slots_[j & mask_now] = Slot{&frame, out, batch_};
  ++placed_;
  return out;
}

FrameStore::FrameStore() : counters_(std::make_shared<FrameCounters>()) {}

namespace {

// Checks a wire frame's dtype and shape; returns its raw byte count.
absl::StatusOr<int64_t> CheckFrameTensor(const proto::Tensor& tensor, const std::string& where) {
  if (tensor.dtype() != proto::DTYPE_UINT8 || tensor.shape_size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": a frame must be uint8 [H, W, C], got dtype ",
                                                   proto::DType_Name(tensor.dtype()), " with ", tensor.shape_size(),
                                                   " dimensions"));
  }
  for (int64_t d : tensor.shape()) {
    if (d <= 0 || d > 65536) return absl::InvalidArgumentError(absl::StrCat(where, ": frame dimension ", d, " out of range"));
  }
  const int64_t raw = tensor.shape(0) * tensor.shape(1) * tensor.shape(2);
  if (raw > kMaxFrameBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": frame of ", raw, " bytes is larger than the ", kMaxFrameBytes, " bytes allowed"));
  }
  return raw;
}

}  // namespace

absl::StatusOr<FramePtr> FrameStore::FromTensor(proto::Tensor* tensor, FrameCompressor& compressor,
                                                FrameDecoder& decoder, FramePtr reference, const std::string& where) {
  // A frame is uint8 [H, W, C] with positive sizes.
  ASSIGN_OR_RETURN(const int64_t raw, CheckFrameTensor(*tensor, where));
  if (reference != nullptr) {
    // Coded against a frame of the same shape, in a chain of bounded depth.
    if (reference->height() != tensor->shape(0) || reference->width() != tensor->shape(1) ||
        reference->channels() != tensor->shape(2)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": its reference frame has another shape"));
    }
    if (reference->depth() + 1 > kMaxReferenceDepth) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": reference chain deeper than ", kMaxReferenceDepth,
                                                     " frames; send a key frame"));
    }
    if (tensor->compression() == proto::COMPRESSION_NONE) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": a frame with a reference must be compressed"));
    }
  }
  const int32_t height = static_cast<int32_t>(tensor->shape(0)), width = static_cast<int32_t>(tensor->shape(1)),
                channels = static_cast<int32_t>(tensor->shape(2));
  if (tensor->compression() == proto::COMPRESSION_NONE) {
    // Raw pixels: compress here.
    if (static_cast<int64_t>(tensor->data().size()) != raw) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": frame has ", tensor->data().size(), " bytes, shape says ", raw));
    }
    std::string data;
    compressor.Compress(tensor->data().data(), tensor->data().size(), &data);
    return std::make_shared<const Frame>(std::move(data), compressor.codec(), height, width, channels, counters_,
                                         std::move(reference));
  }
  // Compressed by the client: checked, then kept as sent.
  std::string data;
  data.swap(*tensor->mutable_data());
  return Checked(std::move(data), tensor->compression(), height, width, channels, std::move(reference), decoder,
                 where, absl::StatusCode::kInvalidArgument);
}

absl::StatusOr<FramePtr> FrameStore::FromCompressed(std::string data, proto::Compression codec, int32_t height,
                                                    int32_t width, int32_t channels, FramePtr reference,
                                                    FrameDecoder& decoder, const std::string& where) {
  if (height <= 0 || width <= 0 || channels <= 0 || int64_t{height} * width * channels > kMaxFrameBytes) {
    return absl::DataLossError(absl::StrCat(where, ": stored frame has shape ", height, "x", width, "x", channels));
  }
  if (reference != nullptr && (reference->height() != height || reference->width() != width ||
                               reference->channels() != channels || reference->depth() + 1 > kMaxReferenceDepth)) {
    return absl::DataLossError(absl::StrCat(where, ": stored frame does not match its reference"));
  }
  return Checked(std::move(data), codec, height, width, channels, std::move(reference), decoder, where,
                 absl::StatusCode::kDataLoss);
}

absl::StatusOr<FramePtr> FrameStore::Checked(std::string data, proto::Compression codec, int32_t height,
                                             int32_t width, int32_t channels, FramePtr reference,
                                             FrameDecoder& decoder, const std::string& where,
                                             absl::StatusCode error_code) {
  const int64_t raw = int64_t{height} * width * channels;
  // The codec, the size, and (LZ4) the block's structure.
  if (absl::Status status = CheckCompressedFrame(data, codec, raw, reference != nullptr ? raw : 0); !status.ok()) {
    return absl::Status(error_code, absl::StrCat(where, ": ", status.message()));
  }
  auto frame = std::make_shared<const Frame>(std::move(data), codec, height, width, channels, counters_,
                                             std::move(reference));
  // zstd carries no structure to check cheaply: decode it once.
  if (codec == proto::COMPRESSION_ZSTD) {
    if (absl::Status status = decoder.Check(*frame); !status.ok()) {
      return absl::Status(error_code, absl::StrCat(where, ": ", status.message()));
    }
  }
  return frame;
}

}  // namespace troupe::replay
