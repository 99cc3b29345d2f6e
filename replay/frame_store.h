// Frames: rendered uint8 images [H, W, C] kept compressed (LZ4 by default,
// or zstd), each stored once and shared by every item that refers to it.
// A frame lives as long as something holds its std::shared_ptr (items,
// insert streams, sampled batches, frames coded against it); it is freed
// when the last reference goes.
//
// Codecs (the wire's proto::Compression ids): LZ4 block format, the
// default, decodes faster than zstd on rendered frames (sampling decodes ~4
// frames per transition) for somewhat more bytes (docs/design.md, "Measured costs");
// zstd stays readable (older writers, checkpoints).
//
// Reference coding: a frame may be compressed with another frame of the same
// stream (its `reference`, usually a recent frame of the same env) as the
// preceding history (an LZ4 dictionary, a zstd prefix), so only what changed
// costs bytes (troupe bench replay: frame size as written). Decoding it
// needs the reference decoded first; the reference is kept alive by the
// frames coded against it. Writers keep chains at most kMaxReferenceDepth
// deep (FrameEncoder makes depth 1: a key frame and the frames coded
// against it).
//
// Validation: a frame that arrives compressed is checked before it is
// stored, so a sample never meets a frame that fails to decode: an LZ4
// block is parsed (without decoding it, which is cheap) and must produce exactly the
// frame's H*W*C bytes with every match inside the frame or its reference; a
// zstd frame is decoded once.
//
// Locking: FrameStore's counters are atomics; a Frame is immutable after
// creation, so any thread may read or decode it without a lock. Compressor,
// encoder and decoder objects belong to one thread at a time.
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

struct ZSTD_CCtx_s;
struct ZSTD_DCtx_s;
union LZ4_stream_u;
union LZ4_streamHC_u;

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

// Reusable compression state (one per writer thread). COMPRESSION_LZ4 (the
// default): `level` 1 is LZ4's fast mode (troupe bench replay: frame
// compress), 2..12 LZ4HC at that level (a little smaller, several times
// slower to write, as fast to decode); higher levels mean 12.
// COMPRESSION_ZSTD: zstd `level` with literals left uncompressed and matches
// of at least 6 bytes (faster to decode than plain zstd level 1 for a few
// more bytes).
class FrameCompressor {
 public:
  explicit FrameCompressor(int level = 1, proto::Compression codec = proto::COMPRESSION_LZ4);
  ~FrameCompressor();
  FrameCompressor(const FrameCompressor&) = delete;
  FrameCompressor& operator=(const FrameCompressor&) = delete;
  // Compresses `bytes` raw bytes into *out (replacing its contents). With
  // `reference` (`bytes` raw bytes of another frame), compresses against it:
  // the result decodes only with that reference.
  void Compress(const void* raw, size_t bytes, std::string* out, const void* reference = nullptr);
  proto::Compression codec() const { return codec_; }

 private:
  proto::Compression codec_;
  int level_;
  ZSTD_CCtx_s* zstd_ = nullptr;
  LZ4_stream_u* lz4_ = nullptr;
  LZ4_streamHC_u* lz4hc_ = nullptr;
};

// Checks compressed frame bytes without storing them: `codec` known, and
// the bytes decode to exactly `raw_bytes` bytes, against `reference_bytes`
// bytes of reference when > 0. LZ4: the block is parsed (not decoded) by
// the rules LZ4's safe decoder enforces, so a block that passes always
// decodes; zstd: the declared content size only (FrameStore decodes it
// once more). InvalidArgument with the reason otherwise.
absl::Status CheckCompressedFrame(const std::string& data, proto::Compression codec, int64_t raw_bytes,
                                  int64_t reference_bytes);

// Reusable decompression state with scratch space for references (one per
// sampling thread).
class FrameDecoder {
 public:
  FrameDecoder();
  ~FrameDecoder();
  FrameDecoder(const FrameDecoder&) = delete;
  FrameDecoder& operator=(const FrameDecoder&) = delete;

  // Decodes `frame` into dst (frame.raw_bytes() bytes), decoding its
  // references first into scratch space. Allocates only when the scratch
  // grows. DataLoss if the stored bytes do not decode to exactly
  // raw_bytes().
  absl::Status Decode(const Frame& frame, void* dst);
  // Decodes bytes compressed with `codec` that must hold exactly
  // `raw_bytes` bytes; with `reference` (raw_bytes bytes), bytes compressed
  // against it. DataLoss otherwise.
  absl::Status Decode(const std::string& data, proto::Compression codec, int64_t raw_bytes, void* dst,
                      const void* reference = nullptr);
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
  ZSTD_DCtx_s* ctx_;
  uint64_t batch_ = 1;
  std::vector<Slot> slots_;  // open addressing on the frame pointer; size a power of 2
  int64_t placed_ = 0;
  std::vector<std::unique_ptr<uint8_t[]>> scratch_;
  std::vector<int64_t> scratch_bytes_;
  size_t scratch_used_ = 0;
};

// Writer-side reference coding (one per insert stream): keeps the raw
// pixels of a few recent key frames and compresses each new frame against
// the most similar one when that pays, so frames of several interleaved
// envs each find their own env's key. A key frame is renewed after
// `group` frames were coded against it, when it leaves the stream's frame
// window, or when coding against it saves too little (a tracking camera);
// such a slot then stays plain for a while before trying again.
class FrameEncoder {
 public:
  struct Options {
    proto::Compression codec = proto::COMPRESSION_LZ4;
    int level = 1;
    int slots = 16;         // key frames kept (>= the envs sharing one stream)
    int group = 8;          // frames coded against one key frame before a new key
    int window = 64;        // only keys among the last `window` frames are used
    double min_saving = 0.5;  // a reference must at least halve the frame's size
  };
  explicit FrameEncoder(const Options& options);

  struct Encoded {
    std::string data;  // compressed with the encoder's codec
    bool has_reference = false;
    uint64_t reference_key = 0;
  };
  // Compresses frame `key` (keys strictly increasing) into *out.
  void Encode(uint64_t key, const uint8_t* pixels, int height, int width, int channels, Encoded* out);

 private:
  struct Key {
    uint64_t key = 0;
    std::vector<uint8_t> pixels;
    int height = 0, width = 0, channels = 0;
    int64_t plain_bytes = 0;  // its own compressed size
    int coded = 0;            // frames coded against it
    int plain_left = 0;       // frames to keep plain before trying references again
    uint64_t last_used = 0;
  };
  // Share of sampled bytes equal in `a` and `b`.
  static double Similarity(const uint8_t* a, const uint8_t* b, size_t bytes);
  void MakeKey(Key* slot, uint64_t key, const uint8_t* pixels, int height, int width, int channels,
               int64_t plain_bytes);

  Options options_;
  FrameCompressor compressor_;
  std::vector<Key> keys_;
  uint64_t uses_ = 0;
};

class FrameStore {
 public:
  FrameStore();

  // Makes a frame from a wire tensor: uint8 [H, W, C], raw (compressed here
  // with `compressor`) or compressed by the client (COMPRESSION_LZ4 or
  // COMPRESSION_ZSTD; kept as sent after checking it: see Validation
  // above), optionally against `reference` (a frame of the same stream:
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
