#include "replay/replay.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include <zlib.h>

#include "absl/strings/str_cat.h"
#include "common/durability_check.h"
#include "common/generations.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/replay_checkpoint.pb.h"
#include "replay/checkpoint.h"
#include "replay/client.h"
#include "replay/test_util.h"

namespace troupe::replay {
namespace {

using testing::TestConfig;

struct Embedded {
  explicit Embedded(const config::ReplayConfig& config) {
    auto r = Replay::Create(config);
    EXPECT_TRUE(r.ok()) << r.status();
    replay = std::move(*r);
    client = NewLocalClient(replay.get());
  }
  std::unique_ptr<Replay> replay;
  std::unique_ptr<ReplayClient> client;
};

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/replay_test_", ::getpid(), "_", name);
}

TEST(ReplayTest, StackedPixelEpisodeStoresEachFrameOnceAndSamplesIdenticalBytes) {
  Embedded e(TestConfig());
  auto writer = *e.client->NewWriter();
  ASSERT_TRUE(testing::WriteEpisode(*writer, /*steps=*/40).ok());
  ASSERT_TRUE(writer->Close().ok());
  writer.reset();
  // 40 transitions of 2 x 3 frame references, but only 41 distinct frames.
  const proto::InfoResponse info = e.replay->Info();
  EXPECT_EQ(info.tables(0).size(), 40);
  EXPECT_EQ(info.frames(), 41);
  auto sampler = *e.client->NewSampler({.table = "pixels", .batch_size = 64});
  SampledBatch batch;
  ASSERT_TRUE(sampler->Next(&batch).ok());
  EXPECT_EQ(batch.fields[0].shape, (std::vector<int64_t>{64, 3, 16, 16, 3}));
  EXPECT_EQ(batch.fields[2].shape, (std::vector<int64_t>{64}));
  for (int i = 0; i < 64; ++i) EXPECT_TRUE(testing::RowMatchesEpisode(batch, i));
}

TEST(ReplayTest, CheckBatchNamesTheFieldWhoseShapeIsNotTheSignatures) {
  Signature signature;
  signature.fields = {{.name = "observation", .dtype = proto::DTYPE_UINT8, .shape = {16, 16, 3}, .frames = 3,
                       .bytes = 768},
                      {.name = "reward", .dtype = proto::DTYPE_FLOAT32, .shape = {}, .bytes = 4},
                      {.name = "action", .dtype = proto::DTYPE_FLOAT32, .shape = {2}, .bytes = 8}};
  signature.num_frames = 3;
  for (const bool references : {false, true}) {
    SampledBatch batch;
    ShapeBatch(signature, 4, &batch, references);
    EXPECT_TRUE(CheckBatch(signature, batch, 4, references).ok());
    EXPECT_FALSE(CheckBatch(signature, batch, 5, references).ok());  // every field's rows
  }
  // Each way a field's shape can differ: its rows, its frames, an item
  // dimension, a dimension more or fewer.
  const struct {
    size_t field;
    std::vector<int64_t> shape;
    const char* says;
  } wrong[] = {{0, {5, 3, 16, 16, 3}, "field 0 (observation): got uint8[5,3,16,16,3]"},
               {0, {4, 2, 16, 16, 3}, "field 0 (observation): got uint8[4,2,16,16,3]"},
               {0, {4, 3, 16, 8, 3}, "field 0 (observation): got uint8[4,3,16,8,3]"},
               {0, {4, 16, 16, 3}, "field 0 (observation): got uint8[4,16,16,3]"},
               {1, {4, 1}, "field 1 (reward): got float32[4,1]"},
               {2, {4, 3}, "field 2 (action): got float32[4,3]"},
               {2, {4}, "field 2 (action): got float32[4]"}};
  for (const auto& w : wrong) {
    SampledBatch batch;
    ShapeBatch(signature, 4, &batch);
    batch.fields[w.field].shape = w.shape;
    const absl::Status status = CheckBatch(signature, batch, 4, false);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), ::testing::HasSubstr(w.says));
  }
}

TEST(ReplayTest, FramesAreFreedWhenNoItemRefersToThem) {
  Embedded e(TestConfig(/*pixels_extra=*/"max_size: 5"));
  auto writer = *e.client->NewWriter({.frame_window = 4});
  ASSERT_TRUE(testing::WriteEpisode(*writer, /*steps=*/50).ok());
  ASSERT_TRUE(writer->Close().ok());
  writer.reset();
  // Items for steps 45..49 remain; they refer to frames 43..50.
  EXPECT_EQ(e.replay->Info().tables(0).size(), 5);
  EXPECT_EQ(e.replay->Info().frames(), 8);
}

TEST(ReplayTest, BadRequestInsertsNothingAndSaysWhatAndWhere) {
  Embedded e(TestConfig());
  auto writer = *e.client->NewWriter();
  ASSERT_TRUE(testing::InsertState(*writer, "state", 1).ok());
  // Same request: a valid item, then one with obs of 23 floats.
  std::vector<float> obs(23, 0.f);
  const float action[2] = {0, 0};
  ASSERT_TRUE(writer->Insert("state", 1, {FieldValue::Dense(proto::DTYPE_FLOAT32, {23}, obs.data()),
                                           FieldValue::Dense(proto::DTYPE_FLOAT32, {2}, action)})
                  .ok());
  const absl::Status status = writer->Flush();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "item 1 (table 'state') field 'obs': expected float32[24], got float32[23]");
  EXPECT_EQ(e.replay->Info().tables(1).size(), 0) << "the valid item of a bad request was inserted";
}

TEST(ReplayTest, RejectsWrongDtypeUnknownTableAndUnknownFrames) {
  Embedded e(TestConfig());
  auto writer = *e.client->NewWriter();
  std::vector<double> obs(24, 0.0);
  const float action[2] = {0, 0};
  ASSERT_TRUE(writer->Insert("state", 1, {FieldValue::Dense(proto::DTYPE_FLOAT64, {24}, obs.data()),
                                           FieldValue::Dense(proto::DTYPE_FLOAT32, {2}, action)})
                  .ok());
  absl::Status status = writer->Flush();
  EXPECT_EQ(status.message(), "item 0 (table 'state') field 'obs': expected float32[24], got float64[24]");

  ASSERT_TRUE(testing::InsertState(*writer, "replay_buffer", 1).ok());
  status = writer->Flush();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(status.message(), "item 0: unknown table 'replay_buffer'; tables: pixels, state, queue");

  ASSERT_TRUE(testing::InsertState(*writer, "state", 1).ok());
  ASSERT_TRUE(writer->Insert("state", 1, {FieldValue::Dense(proto::DTYPE_FLOAT32, {2}, action)}).ok());
  status = writer->Flush();
  EXPECT_EQ(status.message(), "item 1 (table 'state'): has 1 fields, the table has 2 (obs, action)");

  // A frame key never sent: caught by the writer before anything is sent.
  const float reward = 0;
  status = writer->Insert("pixels", 1, {FieldValue::Frames({0, 0, 0}), FieldValue::Dense(proto::DTYPE_FLOAT32, {2}, action),
                                        FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &reward),
                                        FieldValue::Frames({0, 0, 0})});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "Insert into 'pixels' field 0: frame key 0 is not among the last 64 appended frames [0, 0)");
  EXPECT_EQ(e.replay->Info().tables(1).size(), 0);
}

TEST(ReplayTest, ServerRejectsFrameKeysItDoesNotHold) {
  Embedded e(TestConfig());
  InsertSession session(e.replay.get());
  proto::InsertRequest request;
  auto* item = request.add_items();
  item->set_table("pixels");
  auto* obs = item->add_fields();
  for (int j = 0; j < 3; ++j) obs->add_frame_keys(7);
  auto* action = item->add_fields()->mutable_tensor();
  action->set_dtype(proto::DTYPE_FLOAT32);
  action->add_shape(2);
  action->set_data(std::string(8, '\0'));
  auto* reward = item->add_fields()->mutable_tensor();
  reward->set_dtype(proto::DTYPE_FLOAT32);
  reward->set_data(std::string(4, '\0'));
  *item->add_fields() = *obs;
  const absl::Status status = session.Prepare(&request);
  EXPECT_EQ(status.message(),
            "item 0 (table 'pixels') field 'obs': frame key 7 was not sent on this stream (or was forgotten)");
}

TEST(ReplayTest, ItemGroupWithWrongColumnsOrPriorityIsRefusedWhole) {
  Embedded e(TestConfig());
  InsertSession session(e.replay.get());
  // Two "state" items (obs float32[24], action float32[2]) in columns.
  auto group_request = [](int dense_bytes, double second_priority) {
    proto::InsertRequest request;
    proto::ItemGroup* group = request.add_item_groups();
    group->set_table("state");
    for (int size : {24, 2}) {
      proto::FieldLayout* layout = group->add_fields();
      layout->set_dtype(proto::DTYPE_FLOAT32);
      layout->add_shape(size);
    }
    group->add_priorities(1.0);
    group->add_priorities(second_priority);
    group->set_dense(std::string(dense_bytes, '\0'));
    return request;
  };
  proto::InsertRequest request = group_request(/*dense_bytes=*/200, 1.0);
  absl::Status status = session.Prepare(&request);
  EXPECT_EQ(status.message(), "items 0..1 (table 'state'): 200 dense bytes and 0 frame keys, expected 208 and 0");
  request = group_request(/*dense_bytes=*/208, std::nan(""));
  status = session.Prepare(&request);
  EXPECT_EQ(status.message(), "item 1 (table 'state'): priority nan must be finite and >= 0");
  EXPECT_FALSE(session.has_pending()) << "a bad group queues none of its items";
  request = group_request(/*dense_bytes=*/208, 2.0);
  ASSERT_TRUE(session.Prepare(&request).ok());
  ASSERT_TRUE(session.InsertPending(absl::InfiniteDuration()).ok());
  EXPECT_EQ(e.replay->Info().tables(1).size(), 2);
  // A layout that differs from the table's says which field, as for single items.
  request = group_request(/*dense_bytes=*/208, 1.0);
  request.mutable_item_groups(0)->mutable_fields(1)->set_frames(3);
  status = session.Prepare(&request);
  EXPECT_EQ(status.message(), "item 0 (table 'state') field 'action': expected float32[2], got 3 frame keys");
}

TEST(ReplayTest, PrioritizedSamplesCarryImportanceWeights) {
  Embedded e(TestConfig("max_size: 1000", R"pb(
    tables { name: "prio" selector: prioritized priority_exponent: 1 importance_exponent: 1 seed: 5
             fields { name: "x" } })pb"));
  auto writer = *e.client->NewWriter();
  for (int i = 0; i < 2; ++i) {
    const float x = static_cast<float>(i);
    ASSERT_TRUE(writer->Insert("prio", /*priority=*/i == 0 ? 1.0 : 3.0,
                               {FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &x)}).ok());
  }
  ASSERT_TRUE(writer->Flush().ok());
  auto sampler = *e.client->NewSampler({.table = "prio", .batch_size = 200});
  SampledBatch batch;
  ASSERT_TRUE(sampler->Next(&batch).ok());
  // w = (N P)^-1 normalized by the max: key 0 (P = 1/4) gets 1, key 1 (P = 3/4) gets 1/3.
  bool saw[2] = {false, false};
  for (int i = 0; i < 200; ++i) {
    saw[batch.keys[i]] = true;
    EXPECT_FLOAT_EQ(batch.weights[i], batch.keys[i] == 0 ? 1.0f : 1.0f / 3.0f);
    EXPECT_DOUBLE_EQ(batch.probabilities[i], batch.keys[i] == 0 ? 0.25 : 0.75);
  }
  EXPECT_TRUE(saw[0] && saw[1]);
  // The learner lowers key 1's priority to 0: only key 0 comes back.
  proto::MutatePrioritiesRequest update;
  update.set_table("prio");
  update.add_keys(1);
  update.add_priorities(0);
  update.add_keys(99);
  update.add_priorities(1);
  auto missing = e.client->MutatePriorities(update);
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_EQ(*missing, 1);
  ASSERT_TRUE(sampler->Next(&batch).ok());
  for (uint64_t key : batch.keys) EXPECT_EQ(key, 0u);
}

TEST(ReplayTest, CheckpointRoundTripRestoresItemsFramesAndCounters) {
  const std::string path = TempPath("roundtrip.ckpt");
  proto::InfoResponse before;
  {
    Embedded e(TestConfig());
    auto writer = *e.client->NewWriter();
    ASSERT_TRUE(testing::WriteEpisode(*writer, /*steps=*/30).ok());
    for (int i = 0; i < 7; ++i) ASSERT_TRUE(testing::InsertState(*writer, "queue", i).ok());
    ASSERT_TRUE(writer->Close().ok());
    auto q = *e.client->NewSampler({.table = "queue", .batch_size = 2});
    SampledBatch b;
    ASSERT_TRUE(q->Next(&b).ok());  // takes items 0 and 1
    auto bytes = e.replay->Checkpoint(path);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_GT(*bytes, 0);
    before = e.replay->Info();
  }
  Embedded restored(TestConfig());
  auto items = restored.replay->Restore(path);
  ASSERT_TRUE(items.ok()) << items.status();
  EXPECT_EQ(*items, 30 + 5);
  const proto::InfoResponse after = restored.replay->Info();
  EXPECT_EQ(after.frames(), 31);
  for (int t = 0; t < 3; ++t) {
    EXPECT_EQ(after.tables(t).size(), before.tables(t).size()) << t;
    EXPECT_EQ(after.tables(t).rate_limiter().inserts(), before.tables(t).rate_limiter().inserts()) << t;
    EXPECT_EQ(after.tables(t).rate_limiter().samples(), before.tables(t).rate_limiter().samples()) << t;
  }
  auto sampler = *restored.client->NewSampler({.table = "pixels", .batch_size = 32});
  SampledBatch batch;
  ASSERT_TRUE(sampler->Next(&batch).ok());
  for (int i = 0; i < 32; ++i) EXPECT_TRUE(testing::RowMatchesEpisode(batch, i));
  // The FIFO queue continues where it stopped: items 2..6, with their keys.
  auto q = *restored.client->NewSampler({.table = "queue", .batch_size = 5});
  ASSERT_TRUE(q->Next(&batch).ok());
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(batch.keys[i], static_cast<uint64_t>(i + 2));
    EXPECT_EQ(batch.fields[0].as<float>()[24 * i], static_cast<float>(i + 2));
  }
  std::remove(path.c_str());
}

TEST(ReplayTest, CorruptOrTruncatedCheckpointIsRefusedAndDataKept) {
  const std::string path = TempPath("corrupt.ckpt");
  Embedded e(TestConfig());
  auto writer = *e.client->NewWriter();
  ASSERT_TRUE(testing::WriteEpisode(*writer, /*steps=*/10).ok());
  ASSERT_TRUE(e.replay->Checkpoint(path).ok());
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // More data arrives after the checkpoint.
  ASSERT_TRUE(testing::WriteEpisode(*writer, /*steps=*/5, /*frame_offset=*/100).ok());
  auto write = [&](const std::string& content) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << content;
  };
  // One flipped byte in the middle.
  std::string flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x40;
  write(flipped);
  auto status = e.replay->Restore(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(status.message().find("is corrupt or truncated (checksum mismatch"), std::string::npos) << status;
  EXPECT_NE(status.message().find(path), std::string::npos) << "the message must name the file";
  // Truncated.
  write(bytes.substr(0, bytes.size() - 100));
  status = e.replay->Restore(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(status.message().find("no trailer: truncated"), std::string::npos) << status;
  // Missing.
  EXPECT_EQ(e.replay->Restore(path + ".missing").status().code(), absl::StatusCode::kNotFound);
  // Every refusal left the live data alone.
  EXPECT_EQ(e.replay->Info().tables(0).size(), 15);
  std::remove(path.c_str());
}

TEST(ReplayTest, FailedCheckpointWriteKeepsThePreviousFile) {
  const std::string path = TempPath("keep.ckpt");
  Embedded e(TestConfig());
  auto writer = *e.client->NewWriter();
  ASSERT_TRUE(testing::WriteEpisode(*writer, /*steps=*/10).ok());
  ASSERT_TRUE(e.replay->Checkpoint(path).ok());
  // A checkpoint into a directory that does not exist fails cleanly.
  const std::string bad = TempPath("no_such_dir/x.ckpt");
  auto status = e.replay->Checkpoint(bad).status();
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("no_such_dir/x.ckpt.tmp"), std::string::npos) << status;
  // The good one still restores.
  Embedded other(TestConfig());
  auto items = other.replay->Restore(path);
  ASSERT_TRUE(items.ok()) << items.status();
  EXPECT_EQ(*items, 10);
  std::remove(path.c_str());
}

// Replay's checkpoint in a generation, as the learner commits one (its
// crc32 from the writer, AddWritten), recorded through common/files.h's
// seam: its bytes fsynced before its rename, the folder synced before the
// MANIFEST's rename, everything synced past the page cache
// (common/durability_check.h). Two commits, the second pruning the first.
TEST(ReplayTest, CheckpointGenerationWithReplayIsDurableInOrder) {
  const std::string dir = TempPath("durable/checkpoints");
  std::filesystem::remove_all(TempPath("durable"));
  Embedded e(TestConfig());
  auto writer = *e.client->NewWriter();
  ASSERT_TRUE(testing::WriteEpisode(*writer, /*steps=*/20).ok());
  ASSERT_TRUE(writer->Close().ok());
  FileOpRecorder recorder;
  for (int step = 1; step <= 2; ++step) {
    absl::StatusOr<GenerationWriter> generation = GenerationWriter::Begin(dir);
    ASSERT_TRUE(generation.ok()) << generation.status();
    uint32_t crc32 = 0;
    absl::StatusOr<int64_t> bytes = e.replay->Checkpoint(generation->File("replay.ckpt"), &crc32);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    ASSERT_TRUE(generation->AddWritten("replay.ckpt", *bytes, crc32).ok());
    ASSERT_TRUE(generation->AddText("counters.txt", absl::StrCat("frames ", step, "\n")).ok());
    absl::StatusOr<std::string> note = generation->Commit(/*keep=*/1);
    ASSERT_TRUE(note.ok()) << note.status();
    EXPECT_EQ(*note, "");
  }
  const DurabilityReport report = CheckDurability(recorder.ops(), dir);
  EXPECT_EQ(report.commits, 2) << report.trace;
  EXPECT_EQ(report.removals, 2) << report.trace;  // the first generation's MANIFEST, then its folder
  EXPECT_THAT(report.violations, ::testing::IsEmpty()) << report.trace;
  std::filesystem::remove_all(TempPath("durable"));
}

TEST(ReplayTest, CheckpointOfAnotherSignatureIsRefused) {
  const std::string path = TempPath("signature.ckpt");
  Embedded e(TestConfig());
  ASSERT_TRUE(e.replay->Checkpoint(path).ok());
  config::ReplayConfig other = testing::ParseConfig(
      R"pb(tables { name: "pixels" fields { name: "obs" shape: 7 } })pb");
  Embedded o(other);
  const absl::Status status = o.replay->Restore(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(), absl::StrCat(path, ": table 'pixels' has a different signature in the checkpoint"));
  std::remove(path.c_str());
}

TEST(ReplayTest, ReferenceCodedFramesSampleByteIdenticalAndCostAFractionOfPlainOnes) {
  Embedded e(testing::SceneConfig(/*max_size=*/1000));
  auto writer = *e.client->NewWriter();
  ASSERT_TRUE(testing::WriteScene(*writer, /*steps=*/100).ok());
  ASSERT_TRUE(writer->Close().ok());
  const proto::InfoResponse info = e.replay->Info();
  EXPECT_EQ(info.frames(), 101) << "each frame stored once";
  // Plain, one scene frame is ~7.7 KB.
  EXPECT_LT(info.frame_bytes(), 101 * 7700 / 3);
  auto sampler = *e.client->NewSampler({.table = "scene", .batch_size = 256});
  SampledBatch batch;
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(sampler->Next(&batch).ok());
    EXPECT_TRUE(testing::SceneBatchMatches(batch));
  }
}

TEST(ReplayTest, EvictedReferenceCodedFramesAreFreedWithTheLastFrameCodedAgainstThem) {
  Embedded e(testing::SceneConfig(/*max_size=*/10));
  auto writer = *e.client->NewWriter({.frame_window = 8});
  ASSERT_TRUE(testing::WriteScene(*writer, /*steps=*/100).ok());
  ASSERT_TRUE(writer->Close().ok());
  writer.reset();
  // Items for steps 90..99 remain; they refer to frames 88..100, and those
  // to key frames at most 8 back (frame_window), of which at most 2 are older.
  EXPECT_EQ(e.replay->Info().tables(0).size(), 10);
  EXPECT_GE(e.replay->Info().frames(), 13);
  EXPECT_LE(e.replay->Info().frames(), 15);
  auto sampler = *e.client->NewSampler({.table = "scene", .batch_size = 64});
  SampledBatch batch;
  ASSERT_TRUE(sampler->Next(&batch).ok());
  EXPECT_TRUE(testing::SceneBatchMatches(batch));
  // Replacing the contents with an empty checkpoint frees every frame.
  const std::string path = TempPath("empty_scene.ckpt");
  Embedded empty(testing::SceneConfig(/*max_size=*/10));
  ASSERT_TRUE(empty.replay->Checkpoint(path).ok());
  ASSERT_TRUE(e.replay->Restore(path).ok());
  batch = SampledBatch();
  EXPECT_EQ(e.replay->Info().frames(), 0);
  EXPECT_EQ(e.replay->Info().frame_bytes(), 0);
  std::remove(path.c_str());
}

TEST(ReplayTest, CheckpointRoundTripKeepsReferenceCodedFrames) {
  for (proto::Compression codec : {proto::COMPRESSION_LZ4, proto::COMPRESSION_ZSTD}) {
    SCOPED_TRACE(proto::Compression_Name(codec));
    const std::string path = TempPath("scene.ckpt");
    proto::InfoResponse before;
    {
      Embedded e(testing::SceneConfig(/*max_size=*/50));
      auto writer = *e.client->NewWriter({.codec = codec});
      ASSERT_TRUE(testing::WriteScene(*writer, /*steps=*/80).ok());  // evicts 30, keeps some keys only as references
      ASSERT_TRUE(writer->Close().ok());
      writer.reset();
      ASSERT_TRUE(e.replay->Checkpoint(path).ok());
      before = e.replay->Info();
    }
    Embedded restored(testing::SceneConfig(/*max_size=*/50));
    auto items = restored.replay->Restore(path);
    ASSERT_TRUE(items.ok()) << items.status();
    EXPECT_EQ(*items, 50);
    const proto::InfoResponse after = restored.replay->Info();
    EXPECT_EQ(after.frames(), before.frames());
    EXPECT_EQ(after.frame_bytes(), before.frame_bytes());
    auto sampler = *restored.client->NewSampler({.table = "scene", .batch_size = 128});
    SampledBatch batch;
    ASSERT_TRUE(sampler->Next(&batch).ok());
    EXPECT_TRUE(testing::SceneBatchMatches(batch));
    std::remove(path.c_str());
  }
}

// Rewrites every record of checkpoint `path` with `edit`, keeping the file
// valid (record lengths, count and checksum), as a writer whose schema
// `edit` describes would have written it.
void RewriteCheckpoint(const std::string& path, const std::function<void(proto::CheckpointRecord*)>& edit) {
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  constexpr size_t kMagic = 8, kTrailer = 20;
  ASSERT_GE(bytes.size(), kMagic + kTrailer);
  std::string out = bytes.substr(0, kMagic);
  uint64_t records = 0;
  for (size_t pos = kMagic; pos < bytes.size() - kTrailer; ++records) {
    uint32_t n = 0;
    std::memcpy(&n, bytes.data() + pos, 4);
    proto::CheckpointRecord record;
    ASSERT_TRUE(record.ParseFromArray(bytes.data() + pos + 4, static_cast<int>(n)));
    pos += 4 + n;
    edit(&record);
    const std::string written = record.SerializeAsString();
    const uint32_t size = static_cast<uint32_t>(written.size());
    out.append(reinterpret_cast<const char*>(&size), 4);
    out += written;
  }
  const uint32_t crc =
      static_cast<uint32_t>(crc32_z(crc32_z(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(out.data()), out.size()));
  out.append(bytes, bytes.size() - kTrailer, 8);  // the trailer's magic
  out.append(reinterpret_cast<const char*>(&records), 8);
  out.append(reinterpret_cast<const char*>(&crc), 4);
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  file << out;
}

// Rewrites the header record of checkpoint `path` to say `version`.
void SetCheckpointVersion(const std::string& path, int version) {
  RewriteCheckpoint(path, [version](proto::CheckpointRecord* record) {
    if (record->has_header()) record->mutable_header()->set_version(version);
  });
}

// A checkpoint written before a table's selector and its fields' dtypes
// were enums (strings, fields 3 and 2 of the table and field configs) is
// restored with the same selector and dtypes.
TEST(ReplayTest, CheckpointWithTheFormerStringSelectorAndDTypesRestores) {
  const std::string path = TempPath("strings.ckpt");
  config::ReplayConfig config = testing::SceneConfig(/*max_size=*/50);
  config.mutable_tables(0)->set_selector(config::ReplayTableConfig::fifo);
  {
    Embedded e(config);
    auto writer = *e.client->NewWriter();
    ASSERT_TRUE(testing::WriteScene(*writer, /*steps=*/20).ok());
    ASSERT_TRUE(writer->Close().ok());
    ASSERT_TRUE(e.replay->Checkpoint(path).ok());
  }
  // The table record as the former schema wrote it: the same bytes as the
  // strings under the former field numbers.
  RewriteCheckpoint(path, [](proto::CheckpointRecord* record) {
    if (!record->has_table()) return;
    config::ReplayTableConfig* table = record->mutable_table()->mutable_config();
    table->clear_selector();
    table->mutable_unknown_fields()->AddLengthDelimited(3, "fifo");
    for (config::ReplayFieldConfig& field : *table->mutable_fields()) {
      field.mutable_unknown_fields()->AddLengthDelimited(2, config::ReplayFieldConfig::DType_Name(field.dtype()));
      field.clear_dtype();
    }
  });
  FrameStore frames;
  auto read = ReadCheckpoint(path, frames);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 1u);
  const config::ReplayTableConfig& table = (*read)[0].config;
  EXPECT_EQ(table.selector(), config::ReplayTableConfig::fifo);
  ASSERT_EQ(table.fields_size(), 3);
  EXPECT_EQ(table.fields(0).dtype(), config::ReplayFieldConfig::uint8);
  EXPECT_EQ(table.fields(1).dtype(), config::ReplayFieldConfig::float32);
  EXPECT_EQ(table.fields(2).dtype(), config::ReplayFieldConfig::uint8);
  EXPECT_TRUE(table.unknown_fields().empty());
  Embedded restored(config);
  auto items = restored.replay->Restore(path);
  ASSERT_TRUE(items.ok()) << items.status();
  EXPECT_EQ(*items, 20);
  // A string the enum never had is refused, naming the table and the field.
  RewriteCheckpoint(path, [](proto::CheckpointRecord* record) {
    if (!record->has_table()) return;
    config::ReplayFieldConfig* field = record->mutable_table()->mutable_config()->mutable_fields(1);
    field->clear_dtype();
    field->mutable_unknown_fields()->AddLengthDelimited(2, "float16");
  });
  const absl::Status refused = restored.replay->Restore(path).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(refused.message().find("table 'scene' fields[1].dtype 'float16' (written by an earlier version): unknown; "
                                   "expected one of float32, float64, int32, int64, uint8"),
            std::string::npos)
      << refused.message();
  std::remove(path.c_str());
}

TEST(ReplayTest, CheckpointOfFormatVersionTwoRestoresItsZstdFrames) {
  // Version 2 files predate the codec field: every frame is zstd.
  const std::string path = TempPath("v2.ckpt");
  {
    Embedded e(testing::SceneConfig(/*max_size=*/50));
    auto writer = *e.client->NewWriter({.codec = proto::COMPRESSION_ZSTD});
    ASSERT_TRUE(testing::WriteScene(*writer, /*steps=*/30).ok());
    ASSERT_TRUE(writer->Close().ok());
    ASSERT_TRUE(e.replay->Checkpoint(path).ok());
  }
  SetCheckpointVersion(path, 2);
  Embedded restored(testing::SceneConfig(/*max_size=*/50));
  auto items = restored.replay->Restore(path);
  ASSERT_TRUE(items.ok()) << items.status();
  EXPECT_EQ(*items, 30);
  auto sampler = *restored.client->NewSampler({.table = "scene", .batch_size = 64});
  SampledBatch batch;
  ASSERT_TRUE(sampler->Next(&batch).ok());
  EXPECT_TRUE(testing::SceneBatchMatches(batch));
  std::remove(path.c_str());
}

TEST(ReplayTest, CheckpointOfFormatVersionOneIsRefusedSayingSo) {
  const std::string path = TempPath("v1.ckpt");
  Embedded e(TestConfig());
  auto writer = *e.client->NewWriter();
  ASSERT_TRUE(testing::WriteEpisode(*writer, /*steps=*/5).ok());
  ASSERT_TRUE(e.replay->Checkpoint(path).ok());
  SetCheckpointVersion(path, 1);
  const absl::Status status = e.replay->Restore(path).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(status.message(), absl::StrCat("checkpoint ", path,
                                           " has format version 1; this build reads versions 2 to 3 (version 1 "
                                           "predates reference-coded frames); refusing it, nothing was restored"));
  EXPECT_EQ(e.replay->Info().tables(0).size(), 5);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace troupe::replay
