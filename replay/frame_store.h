// Frames: rendered uint8 images [H, W, C] kept zstd-compressed, each stored
// once and shared by every item that refers to it. A frame lives as long as
// something holds its std::shared_ptr (items, insert streams, sampled
// batches); it is freed when the last reference goes.
//
// Locking: FrameStore's counters are atomics; a Frame is immutable after
// creation, so any thread may read or decode it without a lock.
#ifndef TROUPE_REPLAY_FRAME_STORE_H_
#define TROUPE_REPLAY_FRAME_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/tensor.pb.h"

struct ZSTD_CCtx_s;
struct ZSTD_DCtx_s;

namespace troupe::replay {

// Live frames and their compressed bytes, shared by the store and its frames
// (so a frame may outlive the store).
struct FrameCounters {
  std::atomic<int64_t> frames{0};
  std::atomic<int64_t> bytes{0};
};

// One stored frame. Immutable.
class Frame {
 public:
  Frame(std::string zstd, int32_t height, int32_t width, int32_t channels, std::shared_ptr<FrameCounters> counters);
  ~Frame();
  Frame(const Frame&) = delete;
  Frame& operator=(const Frame&) = delete;

  const std::string& zstd() const { return zstd_; }
  int32_t height() const { return height_; }
  int32_t width() const { return width_; }
  int32_t channels() const { return channels_; }
  int64_t raw_bytes() const { return int64_t{height_} * width_ * channels_; }

 private:
  std::string zstd_;
  int32_t height_, width_, channels_;
  std::shared_ptr<FrameCounters> counters_;
};

using FramePtr = std::shared_ptr<const Frame>;

// A reusable zstd compression context (one per writer thread).
class FrameCompressor {
 public:
  explicit FrameCompressor(int level = 1);
  ~FrameCompressor();
  FrameCompressor(const FrameCompressor&) = delete;
  FrameCompressor& operator=(const FrameCompressor&) = delete;
  // Compresses `bytes` raw bytes into *out (replacing its contents).
  void Compress(const void* raw, size_t bytes, std::string* out);

 private:
  ZSTD_CCtx_s* ctx_;
  int level_;
};

// A reusable zstd decompression context (one per sampling thread).
class FrameDecoder {
 public:
  FrameDecoder();
  ~FrameDecoder();
  FrameDecoder(const FrameDecoder&) = delete;
  FrameDecoder& operator=(const FrameDecoder&) = delete;
  // Decodes `frame` into dst (frame.raw_bytes() bytes). Does not allocate.
  // DataLoss if the stored bytes do not decode to exactly raw_bytes().
  absl::Status Decode(const Frame& frame, void* dst);
  // Decodes zstd bytes that must hold exactly `raw_bytes` bytes.
  absl::Status Decode(const std::string& zstd, int64_t raw_bytes, void* dst);

 private:
  ZSTD_DCtx_s* ctx_;
};

class FrameStore {
 public:
  FrameStore();

  // Makes a frame from a wire tensor: uint8 [H, W, C], raw (compressed here
  // with `compressor`) or COMPRESSION_ZSTD (kept as sent after checking its
  // declared content size). InvalidArgument naming `where` for a wrong dtype,
  // rank, size or undecodable bytes.
  absl::StatusOr<FramePtr> FromTensor(const proto::Tensor& tensor, FrameCompressor& compressor,
                                      const std::string& where);
  // Makes a frame from bytes already zstd-compressed (checkpoint restore).
  absl::StatusOr<FramePtr> FromZstd(std::string zstd, int32_t height, int32_t width, int32_t channels,
                                    const std::string& where);

  int64_t live_frames() const { return counters_->frames.load(std::memory_order_relaxed); }
  int64_t live_bytes() const { return counters_->bytes.load(std::memory_order_relaxed); }

 private:
  std::shared_ptr<FrameCounters> counters_;
};

}  // namespace troupe::replay

#endif  // TROUPE_REPLAY_FRAME_STORE_H_
