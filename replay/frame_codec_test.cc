#include "replay/frame_codec.h"

#include <lz4.h>

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "replay/test_util.h"

namespace troupe::replay {
namespace {

TEST(FrameCodecTest, DecompressorReportsCorruptBytes) {
  FrameDecompressor decoder;
  std::vector<uint8_t> out(64);
  EXPECT_EQ(decoder.Decode(std::string("not zstd at all"), proto::COMPRESSION_ZSTD, 64, out.data()).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(decoder.Decode(std::string("\xff\xff not lz4"), proto::COMPRESSION_LZ4, 64, out.data()).code(),
            absl::StatusCode::kDataLoss);
}

// Encodes `frames` (each `size` x `size` x 3) with `encoder` and checks
// each as a store would (CheckCompressedFrame) and decodes it against its
// reference's pixels: byte-identical. Returns the encoded bytes in all, and
// how many were coded against a reference in *referenced.
int64_t EncodeAndDecode(FrameEncoder& encoder, proto::Compression codec, const std::vector<std::vector<uint8_t>>& frames,
                        int size, int* referenced) {
  FrameDecompressor decompressor;
  const int64_t raw = int64_t{size} * size * 3;
  std::vector<uint8_t> out(raw);
  int64_t bytes = 0;
  *referenced = 0;
  for (size_t t = 0; t < frames.size(); ++t) {
    FrameEncoder::Encoded encoded;
    encoder.Encode(t, frames[t].data(), size, size, 3, &encoded);
    const uint8_t* reference = nullptr;
    if (encoded.has_reference) {
      EXPECT_LT(encoded.reference_key, t);
      reference = frames.at(encoded.reference_key).data();
      ++*referenced;
    }
    EXPECT_TRUE(CheckCompressedFrame(encoded.data, codec, raw, reference != nullptr ? raw : 0).ok()) << "frame " << t;
    const absl::Status decoded = decompressor.Decode(encoded.data, codec, raw, out.data(), reference);
    EXPECT_TRUE(decoded.ok()) << "frame " << t << ": " << decoded;
    EXPECT_EQ(out, frames[t]) << "frame " << t;
    bytes += static_cast<int64_t>(encoded.data.size());
  }
  return bytes;
}

TEST(FrameEncoderTest, CodesAStaticSceneAgainstKeyFramesAndDecodesByteIdentical) {
  std::vector<std::vector<uint8_t>> frames;
  int64_t plain_bytes = 0;
  FrameCompressor compressor;
  std::string alone;
  for (int t = 0; t < 40; ++t) {
    frames.push_back(testing::SceneFrame(t));
    compressor.Compress(frames.back().data(), frames.back().size(), &alone);
    plain_bytes += static_cast<int64_t>(alone.size());
  }
  FrameEncoder encoder({.group = 8});
  int referenced = 0;
  const int64_t bytes = EncodeAndDecode(encoder, proto::COMPRESSION_LZ4, frames, testing::kSceneSize, &referenced);
  // One key per group of 1 + 8 frames; every other frame coded against its key.
  EXPECT_EQ(referenced, 40 - 5);
  EXPECT_LT(bytes, plain_bytes / 3);
}

TEST(FrameEncoderTest, InterleavedScenesFindTheirOwnKeyFrames) {
  // Two envs on one stream: frames alternate between two unrelated scenes;
  // each env's first frame is a key, its next 8 (a group) coded against it.
  constexpr int kSize = testing::kSceneSize;
  FrameEncoder encoder({.group = 8});
  std::vector<std::vector<uint8_t>> frames;
  for (int t = 0; t < 18; ++t) {
    std::vector<uint8_t> f = testing::SceneFrame(t / 2);
    if (t % 2 == 1) {
      for (auto& b : f) b = static_cast<uint8_t>(255 - b);  // the other env's scene
    }
    frames.push_back(f);
    FrameEncoder::Encoded encoded;
    encoder.Encode(t, f.data(), kSize, kSize, 3, &encoded);
    if (t >= 2) {
      ASSERT_TRUE(encoded.has_reference) << "frame " << t;
      EXPECT_EQ(encoded.reference_key % 2, static_cast<uint64_t>(t % 2)) << "frame " << t << " used the other env's key";
    }
  }
}

TEST(FrameEncoderTest, KeepsReferencesInsideTheWindow) {
  constexpr int kSize = testing::kSceneSize;
  FrameEncoder encoder({.group = 100, .window = 4});
  for (int t = 0; t < 30; ++t) {
    const std::vector<uint8_t> pixels = testing::SceneFrame(t);
    FrameEncoder::Encoded encoded;
    encoder.Encode(t, pixels.data(), kSize, kSize, 3, &encoded);
    if (encoded.has_reference) {
      EXPECT_GT(encoded.reference_key + 4, static_cast<uint64_t>(t)) << "frame " << t;
    }
  }
}

TEST(FrameCodecTest, RenderedFramesRoundTripByteIdenticalWithEitherCodecAndLevel) {
  const auto rendered = testing::RenderedFrames();
  ASSERT_EQ(rendered.size(), 32u);
  struct Setting {
    proto::Compression codec;
    int level;
  };
  for (const Setting setting : {Setting{proto::COMPRESSION_LZ4, 1}, Setting{proto::COMPRESSION_LZ4, 4},
                                Setting{proto::COMPRESSION_ZSTD, 1}}) {
    SCOPED_TRACE(absl::StrCat(proto::Compression_Name(setting.codec), " level ", setting.level));
    FrameEncoder encoder({.codec = setting.codec, .level = setting.level});
    int referenced = 0;
    const int64_t bytes = EncodeAndDecode(encoder, setting.codec, rendered, testing::kRendered, &referenced);
    EXPECT_GE(referenced, 12) << "cartpole's static camera codes most frames against a key";
    // Under 4 KiB per frame on average (the memory bar has ~0.4 KiB more per transition).
    EXPECT_LT(bytes, 32 * 4096);
  }
}

// Decodes `block` as the sampler would: exactly `raw` bytes or an error.
bool Lz4DecodesExactly(const std::string& block, const std::vector<uint8_t>* reference, size_t raw) {
  std::vector<char> out(raw);
  const int n = reference != nullptr
                    ? LZ4_decompress_safe_usingDict(block.data(), out.data(), static_cast<int>(block.size()),
                                                    static_cast<int>(raw),
                                                    reinterpret_cast<const char*>(reference->data()),
                                                    static_cast<int>(reference->size()))
                    : LZ4_decompress_safe(block.data(), out.data(), static_cast<int>(block.size()),
                                          static_cast<int>(raw));
  return n == static_cast<int>(raw);
}

TEST(FrameCodecTest, Lz4CheckAcceptsRealBlocksAndOnlyBlocksThatDecode) {
  const auto rendered = testing::RenderedFrames();
  ASSERT_EQ(rendered.size(), 32u);
  std::mt19937 rng(7);
  int accepted_mutants = 0, refused_mutants = 0;
  for (int level : {1, 9}) {
    FrameCompressor compressor(level, proto::COMPRESSION_LZ4);
    for (size_t t = 1; t < rendered.size(); ++t) {
      // Alone, and against the previous frame.
      for (const std::vector<uint8_t>* reference : {static_cast<const std::vector<uint8_t>*>(nullptr), &rendered[t - 1]}) {
        std::string block;
        compressor.Compress(rendered[t].data(), testing::kRenderedBytes, &block, reference ? reference->data() : nullptr);
        const int64_t dict = reference ? static_cast<int64_t>(testing::kRenderedBytes) : 0;
        ASSERT_TRUE(CheckCompressedFrame(block, proto::COMPRESSION_LZ4, testing::kRenderedBytes, dict).ok()) << t;
        // Declared against another size, or needing a reference it lacks: refused.
        EXPECT_FALSE(CheckCompressedFrame(block, proto::COMPRESSION_LZ4, testing::kRenderedBytes - 1, dict).ok());
        EXPECT_FALSE(CheckCompressedFrame(block, proto::COMPRESSION_LZ4, testing::kRenderedBytes + 1, dict).ok());
        if (reference != nullptr && !Lz4DecodesExactly(block, nullptr, testing::kRenderedBytes)) {
          EXPECT_FALSE(CheckCompressedFrame(block, proto::COMPRESSION_LZ4, testing::kRenderedBytes, 0).ok()) << t;
        }
        // Mutants (flipped bytes, truncated, extended): whatever the check
        // accepts decodes to exactly the frame's size.
        for (int m = 0; m < 40; ++m) {
          std::string mutant = block;
          switch (m % 4) {
            case 0: case 1:
              for (int k = 0; k <= m % 3; ++k) mutant[rng() % mutant.size()] ^= static_cast<char>(1 + rng() % 255);
              break;
            case 2: mutant.resize(rng() % mutant.size()); break;
            case 3: mutant.insert(rng() % mutant.size(), 1 + rng() % 8, static_cast<char>(rng())); break;
          }
          const bool accepted = CheckCompressedFrame(mutant, proto::COMPRESSION_LZ4, testing::kRenderedBytes, dict).ok();
          if (accepted) {
            ASSERT_TRUE(Lz4DecodesExactly(mutant, reference, testing::kRenderedBytes)) << "frame " << t << " mutant " << m;
          }
          (accepted ? accepted_mutants : refused_mutants) += 1;
        }
      }
    }
  }
  // Both outcomes occur (literal bytes flipped still decode; broken structure does not).
  EXPECT_GT(accepted_mutants, 100);
  EXPECT_GT(refused_mutants, 100);
}

}  // namespace
}  // namespace troupe::replay
