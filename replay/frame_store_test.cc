#include "replay/frame_store.h"

#include <lz4.h>
#include <zstd.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "gtest/gtest.h"
#include "replay/test_util.h"

namespace troupe::replay {
namespace {

proto::Tensor RawFrame(int h, int w, int c, uint8_t seed) {
  proto::Tensor t;
  t.set_dtype(proto::DTYPE_UINT8);
  t.add_shape(h);
  t.add_shape(w);
  t.add_shape(c);
  std::string data(h * w * c, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>((i / 7 + seed) % 251);
  t.set_data(data);
  return t;
}

TEST(FrameStoreTest, RawFrameIsCompressedAndDecodesToTheSameBytes) {
  FrameStore store;
  for (proto::Compression codec : {proto::COMPRESSION_LZ4, proto::COMPRESSION_ZSTD}) {
    FrameCompressor compressor(/*level=*/1, codec);
    FrameDecoder decoder;
    proto::Tensor t = RawFrame(84, 84, 3, /*seed=*/9);
    auto frame = store.FromTensor(&t, compressor, decoder, nullptr, "test");
    ASSERT_TRUE(frame.ok()) << frame.status();
    EXPECT_EQ((*frame)->codec(), codec);
    EXPECT_LT((*frame)->data().size(), t.data().size() / 2);
    EXPECT_EQ(store.live_frames(), 1);
    EXPECT_EQ(store.live_bytes(), static_cast<int64_t>((*frame)->data().size()));
    std::vector<uint8_t> decoded(84 * 84 * 3);
    ASSERT_TRUE(decoder.Decode(**frame, decoded.data()).ok());
    EXPECT_EQ(std::string(decoded.begin(), decoded.end()), t.data());
  }
}

TEST(FrameStoreTest, FramesAreFreedWithTheirLastReference) {
  FrameStore store;
  FrameCompressor compressor;
  FrameDecoder decoder;
  proto::Tensor ta = RawFrame(4, 4, 3, 1), tb = RawFrame(4, 4, 3, 2);
  auto a = store.FromTensor(&ta, compressor, decoder, nullptr, "a");
  auto b = store.FromTensor(&tb, compressor, decoder, nullptr, "b");
  ASSERT_TRUE(a.ok() && b.ok());
  FramePtr copy = *a;
  EXPECT_EQ(store.live_frames(), 2);
  a->reset();
  EXPECT_EQ(store.live_frames(), 2) << "copy still refers to frame a";
  copy.reset();
  EXPECT_EQ(store.live_frames(), 1);
  b->reset();
  EXPECT_EQ(store.live_frames(), 0);
  EXPECT_EQ(store.live_bytes(), 0);
}

TEST(FrameStoreTest, RejectsMalformedFramesNamingThem) {
  FrameStore store;
  FrameCompressor compressor;
  FrameDecoder decoder;
  proto::Tensor t = RawFrame(8, 8, 3, 0);
  t.set_dtype(proto::DTYPE_FLOAT32);
  auto wrong_dtype = store.FromTensor(&t, compressor, decoder, nullptr, "frame key 4");
  EXPECT_EQ(wrong_dtype.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(wrong_dtype.status().message(),
            "frame key 4: a frame must be uint8 [H, W, C], got dtype DTYPE_FLOAT32 with 3 dimensions");
  t = RawFrame(8, 8, 3, 0);
  t.mutable_data()->pop_back();
  auto short_data = store.FromTensor(&t, compressor, decoder, nullptr, "frame key 5");
  EXPECT_EQ(short_data.status().message(), "frame key 5: frame has 191 bytes, shape says 192");
  // zstd or LZ4 bytes of a different size than the shape.
  for (proto::Compression codec : {proto::COMPRESSION_ZSTD, proto::COMPRESSION_LZ4}) {
    FrameCompressor other(/*level=*/1, codec);
    t = RawFrame(8, 8, 3, 0);
    std::string data;
    other.Compress(t.data().data(), 100, &data);
    t.set_data(data);
    t.set_compression(codec);
    auto mismatch = store.FromTensor(&t, compressor, decoder, nullptr, "frame key 6");
    EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument) << proto::Compression_Name(codec);
    EXPECT_TRUE(absl::StrContains(mismatch.status().message(), "frame key 6: ")) << mismatch.status();
  }
  // An unknown codec id.
  t = RawFrame(8, 8, 3, 0);
  t.set_compression(static_cast<proto::Compression>(7));
  auto unknown = store.FromTensor(&t, compressor, decoder, nullptr, "frame key 7");
  EXPECT_EQ(unknown.status().message(), "frame key 7: unknown compression 7 (expected LZ4 or ZSTD)");
  // A frame larger than the store takes.
  t = RawFrame(8, 8, 3, 0);
  t.set_shape(0, 65536);
  t.set_shape(1, 65536);
  EXPECT_EQ(store.FromTensor(&t, compressor, decoder, nullptr, "frame key 8").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.live_frames(), 0);
}

TEST(FrameStoreTest, DecoderReportsCorruptBytes) {
  FrameDecoder decoder;
  std::vector<uint8_t> out(64);
  EXPECT_EQ(decoder.Decode(std::string("not zstd at all"), proto::COMPRESSION_ZSTD, 64, out.data()).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(decoder.Decode(std::string("\xff\xff not lz4"), proto::COMPRESSION_LZ4, 64, out.data()).code(),
            absl::StatusCode::kDataLoss);
}

// Stores frame `key` as a writer's FrameEncoder coded it (against a frame
// stored earlier in `stored`, by key).
FramePtr StoreEncoded(FrameStore& store, FrameCompressor& compressor, const std::vector<FramePtr>& stored,
                      const FrameEncoder::Encoded& encoded, int size) {
  proto::Tensor t;
  t.set_dtype(proto::DTYPE_UINT8);
  for (int d : {size, size, 3}) t.add_shape(d);
  t.set_compression(compressor.codec());
  t.set_data(encoded.data);
  FrameDecoder decoder;
  auto frame = store.FromTensor(&t, compressor, decoder,
                                encoded.has_reference ? stored.at(encoded.reference_key) : nullptr, "test");
  EXPECT_TRUE(frame.ok()) << frame.status();
  return frame.ok() ? *frame : nullptr;
}

TEST(FrameEncoderTest, CodesAStaticSceneAgainstKeyFramesAndDecodesByteIdentical) {
  constexpr int kSize = testing::kSceneSize;
  FrameStore store;
  FrameCompressor compressor;
  FrameEncoder encoder({.group = 8});
  std::vector<FramePtr> stored;
  int64_t plain_bytes = 0;
  int referenced = 0;
  for (int t = 0; t < 40; ++t) {
    const std::vector<uint8_t> pixels = testing::SceneFrame(t);
    FrameEncoder::Encoded encoded;
    encoder.Encode(t, pixels.data(), kSize, kSize, 3, &encoded);
    if (encoded.has_reference) {
      ++referenced;
      EXPECT_LT(encoded.reference_key, static_cast<uint64_t>(t));
    }
    std::string alone;
    compressor.Compress(pixels.data(), pixels.size(), &alone);
    plain_bytes += static_cast<int64_t>(alone.size());
    stored.push_back(StoreEncoded(store, compressor, stored, encoded, kSize));
    ASSERT_NE(stored.back(), nullptr);
    EXPECT_LE(stored.back()->depth(), 1) << "the encoder codes against key frames only";
  }
  // One key per group of 1 + 8 frames; every other frame coded against its key.
  EXPECT_EQ(referenced, 40 - 5);
  EXPECT_LT(store.live_bytes(), plain_bytes / 3);
  // Each frame decodes alone and in a batch to exactly its pixels.
  FrameDecoder decoder;
  std::vector<uint8_t> out(kSize * kSize * 3);
  decoder.BeginBatch();
  for (int t = 39; t >= 0; --t) {
    const std::vector<uint8_t> pixels = testing::SceneFrame(t);
    ASSERT_TRUE(decoder.DecodeInBatch(*stored[t], out.data()).ok());
    EXPECT_EQ(out, pixels) << "frame " << t << " in a batch";
  }
  for (int t = 0; t < 40; ++t) {
    ASSERT_TRUE(decoder.Decode(*stored[t], out.data()).ok());
    EXPECT_EQ(out, testing::SceneFrame(t)) << "frame " << t;
  }
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

TEST(FrameStoreTest, AReferenceLivesWhileFramesCodedAgainstItDo) {
  FrameStore store;
  FrameCompressor compressor;
  FrameDecoder checker;
  const std::vector<uint8_t> a = testing::SceneFrame(0), b = testing::SceneFrame(1);
  auto key = store.FromCompressed([&] { std::string z; compressor.Compress(a.data(), a.size(), &z); return z; }(),
                                  proto::COMPRESSION_LZ4, 64, 64, 3, nullptr, checker, "key");
  ASSERT_TRUE(key.ok());
  std::string delta;
  compressor.Compress(b.data(), b.size(), &delta, a.data());
  auto coded = store.FromCompressed(delta, proto::COMPRESSION_LZ4, 64, 64, 3, *key, checker, "coded");
  ASSERT_TRUE(coded.ok()) << coded.status();
  EXPECT_EQ((*coded)->depth(), 1);
  key->reset();
  EXPECT_EQ(store.live_frames(), 2) << "the coded frame keeps its reference";
  std::vector<uint8_t> out(a.size());
  FrameDecoder decoder;
  ASSERT_TRUE(decoder.Decode(**coded, out.data()).ok());
  EXPECT_EQ(out, b);
  coded->reset();
  EXPECT_EQ(store.live_frames(), 0);
  EXPECT_EQ(store.live_bytes(), 0);
}

TEST(FrameStoreTest, RejectsReferencesOfAnotherShapeOrTooDeep) {
  FrameStore store;
  FrameCompressor compressor;
  FrameDecoder decoder;
  auto tensor = [&](int size, proto::Compression compression) {
    proto::Tensor t = RawFrame(size, size, 3, 1);
    if (compression == proto::COMPRESSION_LZ4) {
      std::string z;
      compressor.Compress(t.data().data(), t.data().size(), &z);
      t.set_data(z);
    }
    t.set_compression(compression);
    return t;
  };
  proto::Tensor t = tensor(8, proto::COMPRESSION_NONE);
  FramePtr chain = *store.FromTensor(&t, compressor, decoder, nullptr, "key");
  // A 4x4 frame against an 8x8 one.
  t = tensor(4, proto::COMPRESSION_LZ4);
  auto other_shape = store.FromTensor(&t, compressor, decoder, chain, "frame key 1");
  EXPECT_EQ(other_shape.status().message(), "frame key 1: its reference frame has another shape");
  // A raw frame cannot have a reference.
  t = tensor(8, proto::COMPRESSION_NONE);
  EXPECT_EQ(store.FromTensor(&t, compressor, decoder, chain, "frame key 2").status().code(),
            absl::StatusCode::kInvalidArgument);
  // Chains stop at kMaxReferenceDepth.
  for (int depth = 1; depth <= kMaxReferenceDepth; ++depth) {
    t = tensor(8, proto::COMPRESSION_LZ4);
    auto next = store.FromTensor(&t, compressor, decoder, chain, "chain");
    ASSERT_TRUE(next.ok()) << depth << ": " << next.status();
    chain = *next;
  }
  t = tensor(8, proto::COMPRESSION_LZ4);
  auto too_deep = store.FromTensor(&t, compressor, decoder, chain, "frame key 9");
  EXPECT_EQ(too_deep.status().message(), "frame key 9: reference chain deeper than 4 frames; send a key frame");
}

TEST(FrameDecoderTest, BatchDecodingHandlesManyFramesAndSharedReferences) {
  // 300 frames against 30 keys, decoded in one batch twice over (the slot
  // table grows mid-batch; repeats are copies).
  constexpr int kSize = testing::kSceneSize;
  FrameStore store;
  FrameCompressor compressor;
  FrameDecoder checker;
  std::vector<FramePtr> keys, frames;
  std::string z;
  for (int k = 0; k < 30; ++k) {
    const std::vector<uint8_t> key = testing::SceneFrame(100 * k);
    compressor.Compress(key.data(), key.size(), &z);
    keys.push_back(*store.FromCompressed(z, proto::COMPRESSION_LZ4, kSize, kSize, 3, nullptr, checker, "key"));
    for (int j = 1; j <= 10; ++j) {
      const std::vector<uint8_t> f = testing::SceneFrame(100 * k + j);
      compressor.Compress(f.data(), f.size(), &z, key.data());
      frames.push_back(*store.FromCompressed(z, proto::COMPRESSION_LZ4, kSize, kSize, 3, keys.back(), checker, "frame"));
    }
  }
  FrameDecoder decoder;
  std::vector<uint8_t> out(2 * frames.size() * kSize * kSize * 3);
  decoder.BeginBatch();
  for (size_t i = 0; i < 2 * frames.size(); ++i) {
    ASSERT_TRUE(decoder.DecodeInBatch(*frames[i % frames.size()], out.data() + i * kSize * kSize * 3).ok());
  }
  for (size_t i = 0; i < 2 * frames.size(); ++i) {
    const int f = static_cast<int>(i % frames.size());
    const std::vector<uint8_t> expected = testing::SceneFrame(100 * (f / 10) + f % 10 + 1);
    ASSERT_EQ(std::memcmp(out.data() + i * kSize * kSize * 3, expected.data(), expected.size()), 0) << i;
  }
}

// The 32 real rendered frames of replay/testdata (16 cartpole.swingup, then
// 16 walker.walk, each run consecutive), 84x84x3.
constexpr int kRendered = 84;
constexpr size_t kRenderedBytes = kRendered * kRendered * 3;

std::vector<std::vector<uint8_t>> RenderedFrames() {
  std::ifstream in(ProjectPath("replay/testdata/rendered_frames.zst"), std::ios::binary);
  const std::string packed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string raw(32 * kRenderedBytes, '\0');
  const size_t n = ZSTD_decompress(raw.data(), raw.size(), packed.data(), packed.size());
  EXPECT_EQ(n, raw.size()) << "replay/testdata/rendered_frames.zst";
  std::vector<std::vector<uint8_t>> frames;
  for (size_t i = 0; n == raw.size() && i < 32; ++i) {
    frames.emplace_back(raw.begin() + i * kRenderedBytes, raw.begin() + (i + 1) * kRenderedBytes);
  }
  return frames;
}

TEST(FrameCodecTest, RenderedFramesRoundTripByteIdenticalWithEitherCodecAndLevel) {
  const auto rendered = RenderedFrames();
  ASSERT_EQ(rendered.size(), 32u);
  struct Setting {
    proto::Compression codec;
    int level;
  };
  for (const Setting setting : {Setting{proto::COMPRESSION_LZ4, 1}, Setting{proto::COMPRESSION_LZ4, 4},
                                Setting{proto::COMPRESSION_ZSTD, 1}}) {
    SCOPED_TRACE(absl::StrCat(proto::Compression_Name(setting.codec), " level ", setting.level));
    FrameStore store;
    FrameCompressor compressor(setting.level, setting.codec);
    FrameEncoder encoder({.codec = setting.codec, .level = setting.level});
    std::vector<FramePtr> stored;
    int referenced = 0;
    for (size_t t = 0; t < rendered.size(); ++t) {
      FrameEncoder::Encoded encoded;
      encoder.Encode(t, rendered[t].data(), kRendered, kRendered, 3, &encoded);
      referenced += encoded.has_reference;
      // Stored only after the store's check passed.
      stored.push_back(StoreEncoded(store, compressor, stored, encoded, kRendered));
      ASSERT_NE(stored.back(), nullptr) << "frame " << t;
    }
    EXPECT_GE(referenced, 12) << "cartpole's static camera codes most frames against a key";
    // Every frame decodes alone and in one batch to exactly its pixels.
    FrameDecoder decoder;
    std::vector<uint8_t> out(kRenderedBytes), batch(rendered.size() * kRenderedBytes);
    decoder.BeginBatch();
    for (size_t t = 0; t < rendered.size(); ++t) {
      ASSERT_TRUE(decoder.DecodeInBatch(*stored[t], batch.data() + t * kRenderedBytes).ok());
    }
    for (size_t t = 0; t < rendered.size(); ++t) {
      ASSERT_TRUE(decoder.Decode(*stored[t], out.data()).ok());
      EXPECT_EQ(out, rendered[t]) << "frame " << t;
      EXPECT_EQ(std::memcmp(batch.data() + t * kRenderedBytes, rendered[t].data(), kRenderedBytes), 0) << t;
    }
    // Under 4 KiB per frame on average (the memory bar has ~0.4 KiB more per transition).
    EXPECT_LT(store.live_bytes(), 32 * 4096);
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
  const auto rendered = RenderedFrames();
  ASSERT_EQ(rendered.size(), 32u);
  std::mt19937 rng(7);
  int accepted_mutants = 0, refused_mutants = 0;
  for (int level : {1, 9}) {
    FrameCompressor compressor(level, proto::COMPRESSION_LZ4);
    for (size_t t = 1; t < rendered.size(); ++t) {
      // Alone, and against the previous frame.
      for (const std::vector<uint8_t>* reference : {static_cast<const std::vector<uint8_t>*>(nullptr), &rendered[t - 1]}) {
        std::string block;
        compressor.Compress(rendered[t].data(), kRenderedBytes, &block, reference ? reference->data() : nullptr);
        const int64_t dict = reference ? static_cast<int64_t>(kRenderedBytes) : 0;
        ASSERT_TRUE(CheckCompressedFrame(block, proto::COMPRESSION_LZ4, kRenderedBytes, dict).ok()) << t;
        // Declared against another size, or needing a reference it lacks: refused.
        EXPECT_FALSE(CheckCompressedFrame(block, proto::COMPRESSION_LZ4, kRenderedBytes - 1, dict).ok());
        EXPECT_FALSE(CheckCompressedFrame(block, proto::COMPRESSION_LZ4, kRenderedBytes + 1, dict).ok());
        if (reference != nullptr && !Lz4DecodesExactly(block, nullptr, kRenderedBytes)) {
          EXPECT_FALSE(CheckCompressedFrame(block, proto::COMPRESSION_LZ4, kRenderedBytes, 0).ok()) << t;
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
          const bool accepted = CheckCompressedFrame(mutant, proto::COMPRESSION_LZ4, kRenderedBytes, dict).ok();
          if (accepted) {
            ASSERT_TRUE(Lz4DecodesExactly(mutant, reference, kRenderedBytes)) << "frame " << t << " mutant " << m;
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

TEST(FrameStoreTest, CorruptLz4FrameIsRefusedNamingItAndNothingIsStored) {
  const auto rendered = RenderedFrames();
  ASSERT_FALSE(rendered.empty());
  FrameStore store;
  FrameCompressor compressor;
  FrameDecoder decoder;
  proto::Tensor t;
  t.set_dtype(proto::DTYPE_UINT8);
  for (int d : {kRendered, kRendered, 3}) t.add_shape(d);
  t.set_compression(proto::COMPRESSION_LZ4);
  std::string block;
  compressor.Compress(rendered[20].data(), kRenderedBytes, &block);
  // Cut short: the block no longer makes the whole frame.
  t.set_data(block.substr(0, block.size() - 9));
  auto truncated = store.FromTensor(&t, compressor, decoder, nullptr, "frame key 3");
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(truncated.status().message(), "frame key 3: LZ4 block (")) << truncated.status();
  // Larger than LZ4 could ever make a frame of this size.
  t.set_data(std::string(kRenderedBytes + kRenderedBytes / 255 + 17, '\0'));
  auto oversized = store.FromTensor(&t, compressor, decoder, nullptr, "frame key 4");
  EXPECT_TRUE(absl::StrContains(oversized.status().message(), "exceeds LZ4's bound")) << oversized.status();
  // A checkpoint's corrupt frame is data loss.
  auto restored = store.FromCompressed(block.substr(0, 100), proto::COMPRESSION_LZ4, kRendered, kRendered, 3, nullptr,
                                       decoder, "checkpoint x frame 0");
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store.live_frames(), 0);
}

}  // namespace
}  // namespace troupe::replay
