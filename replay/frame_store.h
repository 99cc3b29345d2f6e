// Frames: rendered uint8 images [H, W, C] kept compressed (LZ4 by default,
// or zstd: replay/frame_codec.h), each stored once and shared by every item
// that refers to it. A frame lives as long as something holds its
// std::shared_ptr (items, insert streams, sampled batches, frames coded
// against it); it is freed when the last reference goes.
//
// A frame coded against another (frame_codec.h, "Reference coding") holds
// that reference alive; decoding it decodes the reference first. Stored
// chains are at most kMaxReferenceDepth deep (FrameEncoder makes depth 1: a
// key frame and the frames coded against it).
//
// A frame that arrives compressed is checked before it is stored
// (frame_codec.h, "Validation"; a zstd frame is also decoded once), so a
// sample never meets a frame that fails to decode.
//
// Locking: FrameStore's counters are atomics; a Frame is immutable after
// creation, so any thread may read or decode it without a lock. Decoder
// objects belong to one thread at a time.
#ifndef TROUPE_REPLAY_FRAME_STORE_H_
#define TROUPE_REPLAY_FRAME_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/tensor.pb.h"
#include "replay/frame_codec.h"

namespace troupe::replay {

// Live frames and their compressed bytes, shared by the store and its frames
// (so a frame may outlive the store).
struct FrameCounters {
  std::atomic<int64_t> frames{0};
  std::atomic<int64_t> bytes{0};
  std::atomic<uint64_t> next_id{1};  // the next frame's Frame::id()
};

// Longest chain of references a stored frame may sit on (a frame coded
// against a frame coded against ... a key frame).
inline constexpr int kMaxReferenceDepth = 4;

// Largest frame (H*W*C bytes) the store accepts.
inline constexpr int64_t kMaxFrameBytes = int64_t{1} << 26;

class Frame;
using FramePtr = std::shared_ptr<const Frame>;

// One stored frame. Immutable.
class Frame {
 public:
  // `data` holds the frame compressed with `codec` (COMPRESSION_LZ4 or
  // COMPRESSION_ZSTD); `reference` (may be null) must have the same shape,
  // and `data` was compressed against its raw bytes when set.
  Frame(std::string data, proto::Compression codec, int32_t height, int32_t width, int32_t channels,
        std::shared_ptr<FrameCounters> counters, FramePtr reference = nullptr);
  ~Frame();
  Frame(const Frame&) = delete;
  Frame& operator=(const Frame&) = delete;

  const std::string& data() const { return data_; }
  proto::Compression codec() const { return codec_; }
  int32_t height() const { return height_; }
  int32_t width() const { return width_; }
  int32_t channels() const { return channels_; }
  int64_t raw_bytes() const { return int64_t{height_} * width_ * channels_; }
  // The frame this one was coded against, or null for a key frame.
  const FramePtr& reference() const { return reference_; }
  // 0 for a key frame, else 1 + the reference's depth.
  int depth() const { return depth_; }
  // This frame's number, unique among the frames of its store for the
  // store's life (never reused, never 0): what a holder of per-frame state
  // elsewhere (the learner's device frame table) keys it by.
  uint64_t id() const { return id_; }

 private:
  std::string data_;
  proto::Compression codec_;
  int32_t height_, width_, channels_;
  int depth_;
  uint64_t id_;
  std::shared_ptr<FrameCounters> counters_;
  FramePtr reference_;
};

// Decodes stored frames (a FrameDecompressor with scratch space for
// references; one per sampling thread).
class FrameDecoder {
 public:
  FrameDecoder() = default;
  FrameDecoder(const FrameDecoder&) = delete;
  FrameDecoder& operator=(const FrameDecoder&) = delete;

  // Decodes `frame` into dst (frame.raw_bytes() bytes), decoding its
  // references first into scratch space. Allocates only when the scratch
  // grows. DataLoss if the stored bytes do not decode to exactly
  // raw_bytes().
  absl::Status Decode(const Frame& frame, void* dst);
  // Decodes `frame` (and its references) into scratch space, only to check
  // that it decodes. DataLoss otherwise.
  absl::Status Check(const Frame& frame);

  // Batch decoding: between BeginBatch calls each distinct frame (and each
  // reference) is decoded once; DecodeInBatch copies a frame decoded
  // earlier in the batch. Pointers given to DecodeInBatch must stay valid
  // until the next BeginBatch. Allocates only when the batch is larger than
  // any before.
  void BeginBatch();
  absl::Status DecodeInBatch(const Frame& frame, uint8_t* dst);

 private:
  // Where `frame` is decoded in this batch (decoding it, into `dst` or else
  // scratch, if not yet).
  absl::StatusOr<const uint8_t*> Place(const Frame& frame, uint8_t* dst);
  uint8_t* Scratch(int64_t bytes);

  struct Slot {
    const Frame* frame = nullptr;
    const uint8_t* data = nullptr;
    uint64_t batch = 0;
  };
  FrameDecompressor decompressor_;
  uint64_t batch_ = 1;
  std::vector<Slot> slots_;  // open addressing on the frame pointer; size a power of 2
  int64_t placed_ = 0;
  std::vector<std::unique_ptr<uint8_t[]>> scratch_;
  std::vector<int64_t> scratch_bytes_;
  size_t scratch_used_ = 0;
};

class FrameStore {
 public:
  FrameStore();

  // Makes a frame from a wire tensor: uint8 [H, W, C], raw (compressed here
  // with `compressor`) or compressed by the client (COMPRESSION_LZ4 or
  // COMPRESSION_ZSTD; kept as sent after checking it: see the top of this
  // file), optionally against `reference` (a frame of the same stream:
  // same shape, depth at most kMaxReferenceDepth). The tensor's bytes are
  // moved out. InvalidArgument naming `where` for a wrong dtype, rank, size,
  // codec or bytes that do not decode to the frame.
  absl::StatusOr<FramePtr> FromTensor(proto::Tensor* tensor, FrameCompressor& compressor, FrameDecoder& decoder,
                                      FramePtr reference, const std::string& where);
  // Makes a frame from bytes stored earlier (a checkpoint), compressed with
  // `codec` against `reference` when not null; checked as FromTensor
  // checks, DataLoss naming `where` when they do not decode.
  absl::StatusOr<FramePtr> FromCompressed(std::string data, proto::Compression codec, int32_t height, int32_t width,
                                          int32_t channels, FramePtr reference, FrameDecoder& decoder,
                                          const std::string& where);

  int64_t live_frames() const { return counters_->frames.load(std::memory_order_relaxed); }
  int64_t live_bytes() const { return counters_->bytes.load(std::memory_order_relaxed); }

 private:
  // Makes a frame of compressed bytes after checking them; errors carry
  // `error_code` and name `where`.
  absl::StatusOr<FramePtr> Checked(std::string data, proto::Compression codec, int32_t height, int32_t width,
                                   int32_t channels, FramePtr reference, FrameDecoder& decoder,
                                   const std::string& where, absl::StatusCode error_code);

  std::shared_ptr<FrameCounters> counters_;
};

}  // namespace troupe::replay

#endif  // TROUPE_REPLAY_FRAME_STORE_H_
