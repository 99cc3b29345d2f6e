#include "replay/frame_store.h"

#include <vector>

#include "gtest/gtest.h"

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

}  // namespace
}  // namespace troupe::replay
