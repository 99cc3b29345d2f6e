// Frame codecs: how a rendered uint8 frame [H, W, C] is compressed, checked
// and decompressed, alone or against a reference frame. Nothing here knows
// where frames are kept: replay/frame_store.h stores them (ids, references,
// counters) and decodes stored frames with these; writers compress with them
// (replay/client.h).
//
// Codecs (the wire's proto::Compression ids): LZ4 block format, the
// default, decodes faster than zstd on rendered frames (sampling decodes ~4
// frames per transition) for somewhat more bytes (docs/design.md, "Measured costs");
// zstd stays readable (older writers, checkpoints).
//
// Reference coding: a frame may be compressed with another frame (its
// `reference`, usually a recent frame of the same env) as the preceding
// history (an LZ4 dictionary, a zstd prefix), so only what changed costs
// bytes (troupe bench replay: frame size as written). Decoding it needs the
// reference's raw bytes. FrameEncoder picks references on the writer's side.
//
// Validation: CheckCompressedFrame checks bytes that arrive compressed
// before anything keeps them: an LZ4 block is parsed (without decoding it,
// which is cheap) and must produce exactly the frame's H*W*C bytes with
// every match inside the frame or its reference; zstd declares its size.
//
// Locking: compressor, decompressor and encoder objects belong to one thread
// at a time.
#ifndef TROUPE_REPLAY_FRAME_CODEC_H_
#define TROUPE_REPLAY_FRAME_CODEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "proto/tensor.pb.h"

struct ZSTD_CCtx_s;
struct ZSTD_DCtx_s;
union LZ4_stream_u;
union LZ4_streamHC_u;

namespace troupe::replay {

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
// decodes; zstd: the declared content size only (a store decodes it once
// more). InvalidArgument with the reason otherwise.
absl::Status CheckCompressedFrame(const std::string& data, proto::Compression codec, int64_t raw_bytes,
                                  int64_t reference_bytes);

// Reusable decompression state (one per decoding thread).
class FrameDecompressor {
 public:
  FrameDecompressor();
  ~FrameDecompressor();
  FrameDecompressor(const FrameDecompressor&) = delete;
  FrameDecompressor& operator=(const FrameDecompressor&) = delete;

  // Decodes bytes compressed with `codec` that must hold exactly
  // `raw_bytes` bytes into dst; with `reference` (raw_bytes bytes), bytes
  // compressed against it. DataLoss otherwise.
  absl::Status Decode(const std::string& data, proto::Compression codec, int64_t raw_bytes, void* dst,
                      const void* reference = nullptr);

 private:
  ZSTD_DCtx_s* ctx_;
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

}  // namespace troupe::replay

#endif  // TROUPE_REPLAY_FRAME_CODEC_H_
