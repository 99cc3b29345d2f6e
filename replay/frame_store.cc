#include "replay/frame_store.h"

#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_c_literalCompressionMode
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace troupe::replay {

Frame::Frame(std::string zstd, int32_t height, int32_t width, int32_t channels,
             std::shared_ptr<FrameCounters> counters, FramePtr reference)
    : zstd_(std::move(zstd)),
      height_(height),
      width_(width),
      channels_(channels),
      depth_(reference ? reference->depth() + 1 : 0),
      counters_(std::move(counters)),
      reference_(std::move(reference)) {
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

void FrameCompressor::Compress(const void* raw, size_t bytes, std::string* out, const void* reference) {
  // Parameters for fast decoding; a reference applies to this frame only.
  ZSTD_CCtx_reset(ctx_, ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(ctx_, ZSTD_c_compressionLevel, level_);
  ZSTD_CCtx_setParameter(ctx_, ZSTD_c_literalCompressionMode, ZSTD_ps_disable);
  ZSTD_CCtx_setParameter(ctx_, ZSTD_c_minMatch, 6);
  if (reference != nullptr) TROUPE_CHECK(!ZSTD_isError(ZSTD_CCtx_refPrefix(ctx_, reference, bytes)));
  out->resize(ZSTD_compressBound(bytes));
  const size_t n = ZSTD_compress2(ctx_, out->data(), out->size(), raw, bytes);
  TROUPE_CHECK(!ZSTD_isError(n));  // the bound always suffices
  out->resize(n);
}

FrameDecoder::FrameDecoder() : ctx_(ZSTD_createDCtx()) { TROUPE_CHECK(ctx_ != nullptr); }
FrameDecoder::~FrameDecoder() { ZSTD_freeDCtx(ctx_); }

absl::Status FrameDecoder::Decode(const Frame& frame, void* dst) {
  BeginBatch();
  return DecodeInBatch(frame, static_cast<uint8_t*>(dst));
}

absl::Status FrameDecoder::Decode(const std::string& zstd, int64_t raw_bytes, void* dst, const void* reference) {
  if (reference != nullptr) {
    ZSTD_DCtx_reset(ctx_, ZSTD_reset_session_only);
    const size_t r = ZSTD_DCtx_refPrefix(ctx_, reference, static_cast<size_t>(raw_bytes));
    if (ZSTD_isError(r)) return absl::InternalError(absl::StrCat("zstd prefix: ", ZSTD_getErrorName(r)));
  }
  const size_t n = ZSTD_decompressDCtx(ctx_, dst, static_cast<size_t>(raw_bytes), zstd.data(), zstd.size());
  if (ZSTD_isError(n)) {
    ZSTD_DCtx_reset(ctx_, ZSTD_reset_session_only);  // drop an unused prefix
    return absl::DataLossError(absl::StrCat("frame does not decode: ", ZSTD_getErrorName(n)));
  }
  if (static_cast<int64_t>(n) != raw_bytes) {
    return absl::DataLossError(absl::StrCat("frame decodes to ", n, " bytes, expected ", raw_bytes));
  }
  return absl::OkStatus();
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
  RETURN_IF_ERROR(Decode(frame.zstd(), frame.raw_bytes(), out, reference));
  // The table may have grown while placing the reference: find a free slot again.
  const size_t mask_now = slots_.size() - 1;
  size_t j = std::hash<const Frame*>()(&frame) * 0x9E3779B97F4A7C15ull >> 20;
  while (slots_[j & mask_now].batch == batch_) ++j;
  slots_[j & mask_now] = Slot{&frame, out, batch_};
  ++placed_;
  return out;
}

FrameEncoder::FrameEncoder(const Options& options)
    : options_(options), compressor_(options.level), keys_(std::max(1, options.slots)) {}

double FrameEncoder::Similarity(const uint8_t* a, const uint8_t* b, size_t bytes) {
  // 509 samples spread over the frame (a prime stride avoids row aliasing).
  constexpr size_t kSamples = 509;
  const size_t stride = std::max<size_t>(1, bytes / kSamples);
  size_t equal = 0, n = 0;
  for (size_t i = stride / 2; i < bytes; i += stride, ++n) equal += a[i] == b[i];
  return n == 0 ? 0.0 : static_cast<double>(equal) / static_cast<double>(n);
}

void FrameEncoder::MakeKey(Key* slot, uint64_t key, const uint8_t* pixels, int height, int width, int channels,
                           int64_t plain_bytes) {
  slot->key = key;
  slot->pixels.assign(pixels, pixels + static_cast<size_t>(height) * width * channels);
  slot->height = height;
  slot->width = width;
  slot->channels = channels;
  slot->plain_bytes = plain_bytes;
  slot->coded = 0;
  slot->last_used = ++uses_;
}

void FrameEncoder::Encode(uint64_t key, const uint8_t* pixels, int height, int width, int channels, Encoded* out) {
  const size_t bytes = static_cast<size_t>(height) * width * channels;
  out->has_reference = false;
  if (options_.group <= 0) {
    compressor_.Compress(pixels, bytes, &out->zstd);
    return;
  }
  // The most similar usable key frame: same shape, still inside the window.
  Key* best = nullptr;
  double best_similarity = 0;
  for (Key& k : keys_) {
    if (k.pixels.empty() || k.height != height || k.width != width || k.channels != channels) continue;
    if (k.key + static_cast<uint64_t>(options_.window) <= key) {
      k.pixels.clear();  // left the window: the server may have forgotten it
      continue;
    }
    const double s = Similarity(pixels, k.pixels.data(), bytes);
    if (s > best_similarity) best = &k, best_similarity = s;
  }
  if (best_similarity < 0.5) best = nullptr;
  // Coded against it when it is not used up and references paid lately.
  if (best != nullptr && best->plain_left == 0 && best->coded < options_.group) {
    compressor_.Compress(pixels, bytes, &out->zstd, best->pixels.data());
    if (static_cast<double>(out->zstd.size()) <= options_.min_saving * static_cast<double>(best->plain_bytes)) {
      out->has_reference = true;
      out->reference_key = best->key;
      ++best->coded;
      best->last_used = ++uses_;
      return;
    }
    // Too little saved (the view moves): this env's frames stay plain for a while.
    best->plain_left = 4 * options_.group + 1;
  }
  // A key frame: it replaces the matched slot (this env's old key), else an
  // empty or the least recently used one.
  compressor_.Compress(pixels, bytes, &out->zstd);
  Key* slot = best;
  if (slot == nullptr) {
    slot = &keys_[0];
    for (Key& k : keys_) {
      if (k.pixels.empty()) {
        slot = &k;
        break;
      }
      if (k.last_used < slot->last_used) slot = &k;
    }
    slot->plain_left = 0;
  }
  if (slot->plain_left > 0) --slot->plain_left;
  MakeKey(slot, key, pixels, height, width, channels, static_cast<int64_t>(out->zstd.size()));
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
  return tensor.shape(0) * tensor.shape(1) * tensor.shape(2);
}

// Whether zstd bytes declare exactly `raw` bytes of content.
bool DeclaresSize(const std::string& zstd, int64_t raw) {
  const unsigned long long size = ZSTD_getFrameContentSize(zstd.data(), zstd.size());
  return size != ZSTD_CONTENTSIZE_ERROR && size != ZSTD_CONTENTSIZE_UNKNOWN && static_cast<int64_t>(size) == raw;
}

}  // namespace

absl::StatusOr<FramePtr> FrameStore::FromTensor(const proto::Tensor& tensor, FrameCompressor& compressor,
                                                const std::string& where) {
  proto::Tensor copy = tensor;
  return FromTensor(&copy, compressor, nullptr, where);
}

absl::StatusOr<FramePtr> FrameStore::FromTensor(proto::Tensor* tensor, FrameCompressor& compressor,
                                                FramePtr reference, const std::string& where) {
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
    if (tensor->compression() != proto::COMPRESSION_ZSTD) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": a frame with a reference must be zstd-compressed"));
    }
  }
  std::string zstd;
  switch (tensor->compression()) {
    case proto::COMPRESSION_NONE:
      // Raw pixels: compress here.
      if (static_cast<int64_t>(tensor->data().size()) != raw) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": frame has ", tensor->data().size(), " bytes, shape says ", raw));
      }
      compressor.Compress(tensor->data().data(), tensor->data().size(), &zstd);
      break;
    case proto::COMPRESSION_ZSTD:
      // Compressed by the client: its declared content size must match.
      if (!DeclaresSize(tensor->data(), raw)) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": zstd frame content size does not match shape (",
                                                       raw, " bytes expected)"));
      }
      zstd.swap(*tensor->mutable_data());
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown compression ", tensor->compression()));
  }
  return std::make_shared<const Frame>(std::move(zstd), static_cast<int32_t>(tensor->shape(0)),
                                       static_cast<int32_t>(tensor->shape(1)), static_cast<int32_t>(tensor->shape(2)),
                                       counters_, std::move(reference));
}

absl::StatusOr<FramePtr> FrameStore::FromZstd(std::string zstd, int32_t height, int32_t width, int32_t channels,
                                              FramePtr reference, const std::string& where) {
  if (height <= 0 || width <= 0 || channels <= 0 || !DeclaresSize(zstd, int64_t{height} * width * channels)) {
    return absl::DataLossError(absl::StrCat(where, ": stored frame does not match its shape"));
  }
  if (reference != nullptr && (reference->height() != height || reference->width() != width ||
                               reference->channels() != channels || reference->depth() + 1 > kMaxReferenceDepth)) {
    return absl::DataLossError(absl::StrCat(where, ": stored frame does not match its reference"));
  }
  return std::make_shared<const Frame>(std::move(zstd), height, width, channels, counters_, std::move(reference));
}

}  // namespace troupe::replay
