#include "replay/frame_store.h"

#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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

TEST(FrameStoreTest, StoresAWritersEncodedFramesAtDepthOneAndDecodesThemByteIdentical) {
  constexpr int kSize = testing::kSceneSize;
  FrameStore store;
  FrameCompressor compressor;
  FrameEncoder encoder({.group = 8});
  std::vector<FramePtr> stored;
  for (int t = 0; t < 40; ++t) {
    const std::vector<uint8_t> pixels = testing::SceneFrame(t);
    FrameEncoder::Encoded encoded;
    encoder.Encode(t, pixels.data(), kSize, kSize, 3, &encoded);
    stored.push_back(StoreEncoded(store, compressor, stored, encoded, kSize));
    ASSERT_NE(stored.back(), nullptr);
    EXPECT_EQ(stored.back()->depth(), encoded.has_reference ? 1 : 0) << "the encoder codes against key frames only";
  }
  // Each frame decodes alone and in a batch (newest first: references
  // decoded on the way) to exactly its pixels.
  FrameDecoder decoder;
  std::vector<uint8_t> out(kSize * kSize * 3);
  decoder.BeginBatch();
  for (int t = 39; t >= 0; --t) {
    ASSERT_TRUE(decoder.DecodeInBatch(*stored[t], out.data()).ok());
    EXPECT_EQ(out, testing::SceneFrame(t)) << "frame " << t << " in a batch";
  }
  for (int t = 0; t < 40; ++t) {
    ASSERT_TRUE(decoder.Decode(*stored[t], out.data()).ok());
    EXPECT_EQ(out, testing::SceneFrame(t)) << "frame " << t;
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

TEST(FrameStoreTest, CorruptLz4FrameIsRefusedNamingItAndNothingIsStored) {
  const auto rendered = testing::RenderedFrames();
  ASSERT_FALSE(rendered.empty());
  FrameStore store;
  FrameCompressor compressor;
  FrameDecoder decoder;
  proto::Tensor t;
  t.set_dtype(proto::DTYPE_UINT8);
  for (int d : {testing::kRendered, testing::kRendered, 3}) t.add_shape(d);
  t.set_compression(proto::COMPRESSION_LZ4);
  std::string block;
  compressor.Compress(rendered[20].data(), testing::kRenderedBytes, &block);
  // Cut short: the block no longer makes the whole frame.
  t.set_data(block.substr(0, block.size() - 9));
  auto truncated = store.FromTensor(&t, compressor, decoder, nullptr, "frame key 3");
  EXPECT_EQ(truncated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(truncated.status().message(), "frame key 3: LZ4 block (")) << truncated.status();
  // Larger than LZ4 could ever make a frame of this size.
  t.set_data(std::string(testing::kRenderedBytes + testing::kRenderedBytes / 255 + 17, '\0'));
  auto oversized = store.FromTensor(&t, compressor, decoder, nullptr, "frame key 4");
  EXPECT_TRUE(absl::StrContains(oversized.status().message(), "exceeds LZ4's bound")) << oversized.status();
  // A checkpoint's corrupt frame is data loss.
  auto restored = store.FromCompressed(block.substr(0, 100), proto::COMPRESSION_LZ4, testing::kRendered, testing::kRendered, 3, nullptr,
                                       decoder, "checkpoint x frame 0");
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(store.live_frames(), 0);
}

}  // namespace
}  // namespace troupe::replay
