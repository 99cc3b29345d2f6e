#include "replay/frame_store.h"

#include <vector>

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
  FrameCompressor compressor(/*level=*/1);
  const proto::Tensor t = RawFrame(84, 84, 3, /*seed=*/9);
  auto frame = store.FromTensor(t, compressor, "test");
  ASSERT_TRUE(frame.ok()) << frame.status();
  EXPECT_LT((*frame)->zstd().size(), t.data().size() / 2);
  EXPECT_EQ(store.live_frames(), 1);
  EXPECT_EQ(store.live_bytes(), static_cast<int64_t>((*frame)->zstd().size()));
  std::vector<uint8_t> decoded(84 * 84 * 3);
  FrameDecoder decoder;
  ASSERT_TRUE(decoder.Decode(**frame, decoded.data()).ok());
  EXPECT_EQ(std::string(decoded.begin(), decoded.end()), t.data());
}

TEST(FrameStoreTest, FramesAreFreedWithTheirLastReference) {
  FrameStore store;
  FrameCompressor compressor;
  auto a = store.FromTensor(RawFrame(4, 4, 3, 1), compressor, "a");
  auto b = store.FromTensor(RawFrame(4, 4, 3, 2), compressor, "b");
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
  proto::Tensor t = RawFrame(8, 8, 3, 0);
  t.set_dtype(proto::DTYPE_FLOAT32);
  auto wrong_dtype = store.FromTensor(t, compressor, "frame key 4");
  EXPECT_EQ(wrong_dtype.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(wrong_dtype.status().message(),
            "frame key 4: a frame must be uint8 [H, W, C], got dtype DTYPE_FLOAT32 with 3 dimensions");
  t = RawFrame(8, 8, 3, 0);
  t.mutable_data()->pop_back();
  auto short_data = store.FromTensor(t, compressor, "frame key 5");
  EXPECT_EQ(short_data.status().message(), "frame key 5: frame has 191 bytes, shape says 192");
  // zstd bytes that declare a different size than the shape.
  t = RawFrame(8, 8, 3, 0);
  std::string zstd;
  compressor.Compress(t.data().data(), 100, &zstd);
  t.set_data(zstd);
  t.set_compression(proto::COMPRESSION_ZSTD);
  auto mismatch = store.FromTensor(t, compressor, "frame key 6");
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.live_frames(), 0);
}

TEST(FrameStoreTest, DecoderReportsCorruptBytes) {
  FrameDecoder decoder;
  std::vector<uint8_t> out(64);
  EXPECT_EQ(decoder.Decode(std::string("not zstd at all"), 64, out.data()).code(), absl::StatusCode::kDataLoss);
}

// Stores frame `key` as a writer's FrameEncoder coded it (against a frame
// stored earlier in `stored`, by key).
FramePtr StoreEncoded(FrameStore& store, FrameCompressor& compressor, const std::vector<FramePtr>& stored,
                      const FrameEncoder::Encoded& encoded, int size) {
  proto::Tensor t;
  t.set_dtype(proto::DTYPE_UINT8);
  for (int d : {size, size, 3}) t.add_shape(d);
  t.set_compression(proto::COMPRESSION_ZSTD);
  t.set_data(encoded.zstd);
  auto frame = store.FromTensor(&t, compressor, encoded.has_reference ? stored.at(encoded.reference_key) : nullptr,
                                "test");
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
  const std::vector<uint8_t> a = testing::SceneFrame(0), b = testing::SceneFrame(1);
  auto key = store.FromZstd([&] { std::string z; compressor.Compress(a.data(), a.size(), &z); return z; }(), 64, 64, 3,
                            nullptr, "key");
  ASSERT_TRUE(key.ok());
  std::string delta;
  compressor.Compress(b.data(), b.size(), &delta, a.data());
  auto coded = store.FromZstd(delta, 64, 64, 3, *key, "coded");
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
  auto tensor = [&](int size, proto::Compression compression) {
    proto::Tensor t = RawFrame(size, size, 3, 1);
    if (compression == proto::COMPRESSION_ZSTD) {
      std::string z;
      compressor.Compress(t.data().data(), t.data().size(), &z);
      t.set_data(z);
    }
    t.set_compression(compression);
    return t;
  };
  proto::Tensor t = tensor(8, proto::COMPRESSION_NONE);
  FramePtr chain = *store.FromTensor(&t, compressor, nullptr, "key");
  // A 4x4 frame against an 8x8 one.
  t = tensor(4, proto::COMPRESSION_ZSTD);
  auto other_shape = store.FromTensor(&t, compressor, chain, "frame key 1");
  EXPECT_EQ(other_shape.status().message(), "frame key 1: its reference frame has another shape");
  // A raw frame cannot have a reference.
  t = tensor(8, proto::COMPRESSION_NONE);
  EXPECT_EQ(store.FromTensor(&t, compressor, chain, "frame key 2").status().code(), absl::StatusCode::kInvalidArgument);
  // Chains stop at kMaxReferenceDepth.
  for (int depth = 1; depth <= kMaxReferenceDepth; ++depth) {
    t = tensor(8, proto::COMPRESSION_ZSTD);
    auto next = store.FromTensor(&t, compressor, chain, "chain");
    ASSERT_TRUE(next.ok()) << depth << ": " << next.status();
    chain = *next;
  }
  t = tensor(8, proto::COMPRESSION_ZSTD);
  auto too_deep = store.FromTensor(&t, compressor, chain, "frame key 9");
  EXPECT_EQ(too_deep.status().message(), "frame key 9: reference chain deeper than 4 frames; send a key frame");
}

TEST(FrameDecoderTest, BatchDecodingHandlesManyFramesAndSharedReferences) {
  // 300 frames against 30 keys, decoded in one batch twice over (the slot
  // table grows mid-batch; repeats are copies).
  constexpr int kSize = testing::kSceneSize;
  FrameStore store;
  FrameCompressor compressor;
  std::vector<FramePtr> keys, frames;
  std::string z;
  for (int k = 0; k < 30; ++k) {
    const std::vector<uint8_t> key = testing::SceneFrame(100 * k);
    compressor.Compress(key.data(), key.size(), &z);
    keys.push_back(*store.FromZstd(z, kSize, kSize, 3, nullptr, "key"));
    for (int j = 1; j <= 10; ++j) {
      const std::vector<uint8_t> f = testing::SceneFrame(100 * k + j);
      compressor.Compress(f.data(), f.size(), &z, key.data());
      frames.push_back(*store.FromZstd(z, kSize, kSize, 3, keys.back(), "frame"));
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

}  // namespace
}  // namespace troupe::replay
