// The device frame table: batches gathered on the device equal the batches
// replay assembles on the host, bit for bit, on the CPU, the strict CPU
// device and the PJRT CPU plugin, over evictions, a replay checkpoint
// restored, prioritized sampling and a table too small for replay (a cache);
// frames go up once; D4PG updates from gathered frames equal updates from
// host batches; a table too small for a batch is refused naming the sizes.
#include "agents/device_frames.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agents/d4pg_agent.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/strict_cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replay/client.h"
#include "replay/grpc_client.h"
#include "replay/replay.h"
#include "replay/server.h"
#include "replay/test_util.h"
#ifdef TROUPE_HAVE_PJRT
#include "engine/pjrt/pjrt_backend.h"
#endif

namespace troupe::agents {
namespace {

using ::testing::HasSubstr;
using replay::testing::kC;
using replay::testing::kH;
using replay::testing::kStack;
using replay::testing::kW;

constexpr int64_t kFrameBytes = kH * kW * kC;
constexpr int kFramesPerItem = 2 * kStack;

std::string PjrtPlugin() {
  const char* path = std::getenv("TROUPE_PJRT_PLUGIN");
  return path != nullptr && std::filesystem::exists(path) ? path : "";
}

// A replay with test_util's "pixels" table (max_size items) and a writer
// whose frame window is short, so that frames die soon after their items.
struct PixelReplay {
  explicit PixelReplay(const std::string& table_extra) {
    auto r = replay::Replay::Create(replay::testing::TestConfig(table_extra));
    TROUPE_CHECK(r.ok());
    replay = *std::move(r);
    client = replay::NewLocalClient(replay.get());
    auto w = client->NewWriter({.frame_window = 8});
    TROUPE_CHECK(w.ok());
    writer = *std::move(w);
    table = *replay->FindTable("pixels");
  }
  // One episode of `steps` transitions (steps + 1 new frames).
  void Write(int steps) {
    TROUPE_CHECK(replay::testing::WriteEpisode(*writer, steps, next_frame).ok());
    next_frame += steps + 1;
  }
  std::unique_ptr<replay::Replay> replay;
  std::unique_ptr<replay::ReplayClient> client;
  std::unique_ptr<replay::Writer> writer;
  replay::Table* table = nullptr;
  int next_frame = 0;
};

// Samples `n` items, assembles them on the host (FillBatch) and as
// references, resolves the references into `frames` and gathers every
// item's six frames inside a step; true when each gathered frame equals the
// host batch's byte for byte. `seen` collects the frame ids resolved.
::testing::AssertionResult GatherEqualsHost(PixelReplay& p, nn::Backend& backend, DeviceFrameTable& frames, int n,
                                            std::set<uint64_t>* seen) {
  std::vector<replay::SampledItem> items;
  int64_t table_size = 0;
  if (absl::Status s = p.table->Sample(n, absl::Seconds(5), &items, &table_size); !s.ok()) {
    return ::testing::AssertionFailure() << s;
  }
  const replay::Signature& signature = p.table->signature();
  replay::SampledBatch host, references;
  replay::FrameDecoder decoder, table_decoder;
  replay::ShapeBatch(signature, n, &host);
  replay::ShapeBatch(signature, n, &references, /*frame_references=*/true);
  if (absl::Status s = replay::FillBatch(signature, items, table_size, false, 0, decoder, &host); !s.ok()) {
    return ::testing::AssertionFailure() << s;
  }
  replay::FillBatchReferences(signature, items, table_size, false, 0, &references);
  for (const replay::FramePtr& f : references.frames) seen->insert(f->id());
  std::vector<int32_t> slots;
  if (absl::Status s = frames.Resolve(references.frames, table_decoder, &slots); !s.ok()) {
    return ::testing::AssertionFailure() << s;
  }
  // The gather inside a step, read at its end (as the learner's step does).
  const int64_t count = static_cast<int64_t>(slots.size());
  nn::DeviceBuffer device_slots(backend, count), gathered(backend, count * kFrameBytes / 4),
      planes(backend, count * kFrameBytes);
  std::vector<uint8_t> back(count * kFrameBytes);
  std::vector<float> planes_back(count * kFrameBytes);
  {
    nn::StepScope step(backend);
    backend.Upload(slots.data(), device_slots.data(), sizeof(int32_t) * count);
    const auto* device_slot_data = reinterpret_cast<const int32_t*>(device_slots.data());
    frames.Gather(count, device_slot_data, reinterpret_cast<uint8_t*>(gathered.data()));
    frames.GatherToFloatPlanar(count, device_slot_data, kC, 1.0f / 255.0f, planes.data());
    backend.ReadAtStepEnd(gathered.data(), back.data(), back.size());
    backend.ReadAtStepEnd(planes.data(), planes_back.data(), sizeof(float) * planes_back.size());
  }
  // Item i's frame j: observation (j < 3) or next observation, stack slot j % 3.
  nn::CpuBackend reference(1);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < kFramesPerItem; ++j) {
      const replay::SampledField& field = host.fields[j < kStack ? 0 : 3];
      const uint8_t* want = field.data.data() + (i * kStack + j % kStack) * kFrameBytes;
      if (std::memcmp(back.data() + (i * kFramesPerItem + j) * kFrameBytes, want, kFrameBytes) != 0) {
        return ::testing::AssertionFailure() << "item " << i << " frame " << j << " differs from the host batch";
      }
      // The first layer's input: the CPU's BytesToFloatPlanar of the host
      // batch's frame, bit for bit.
      std::vector<float> want_planes(kFrameBytes);
      reference.BytesToFloatPlanar(1, kH * kW, kC, 1.0f / 255.0f, want, want_planes.data());
      if (std::memcmp(planes_back.data() + (i * kFramesPerItem + j) * kFrameBytes, want_planes.data(),
                      sizeof(float) * kFrameBytes) != 0) {
        return ::testing::AssertionFailure() << "item " << i << " frame " << j << ": float planes differ";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Rounds of inserts (evicting once the table is full) and gathered batches
// equal to host-assembled ones, on `backend` with a table of `slots`.
// Returns the table for its counters.
std::unique_ptr<DeviceFrameTable> CheckRounds(nn::Backend& backend, int64_t slots, const std::string& table_extra,
                                              int rounds, std::set<uint64_t>* seen) {
  PixelReplay p(table_extra);
  auto frames = std::make_unique<DeviceFrameTable>(&backend, slots, kFrameBytes);
  for (int round = 0; round < rounds; ++round) {
    p.Write(/*steps=*/5);
    EXPECT_TRUE(GatherEqualsHost(p, backend, *frames, /*n=*/8, seen)) << "round " << round;
  }
  return frames;
}

TEST(DeviceFrameTableTest, GatheredBatchesEqualHostAssembledOnesOverEvictions) {
  nn::CpuBackend cpu(1);
  std::set<uint64_t> seen;
  // 25 rounds of 6 frames: 150 frames through a table of 30 items (~36
  // frames), into 80 slots: the slots of evicted frames are reused.
  auto frames = CheckRounds(cpu, /*slots=*/80, "max_size: 30", /*rounds=*/25, &seen);
  EXPECT_GT(static_cast<int64_t>(seen.size()), 80) << "more distinct frames than slots went through";
  EXPECT_EQ(frames->stats().replaced, 0) << "evicted frames' slots were free: no live frame was dropped";
  EXPECT_EQ(frames->stats().frames_uploaded, static_cast<int64_t>(seen.size())) << "each frame uploaded once";
  EXPECT_EQ(frames->stats().resolved, 25 * 8 * kFramesPerItem);
  EXPECT_LE(frames->resident(), 80);
}

TEST(DeviceFrameTableTest, GatheredBatchesEqualHostAssembledOnesOnTheStrictDevice) {
  nn::StrictCpuBackend strict(1, size_t{64} << 20);
  std::set<uint64_t> seen;
  auto frames = CheckRounds(strict, /*slots=*/80, "max_size: 30", /*rounds=*/12, &seen);
  EXPECT_EQ(frames->stats().frames_uploaded, static_cast<int64_t>(seen.size()));
}

TEST(DeviceFrameTableTest, GatheredBatchesEqualHostAssembledOnesOnPjrt) {
#ifdef TROUPE_HAVE_PJRT
  const std::string plugin = PjrtPlugin();
  if (plugin.empty()) GTEST_SKIP() << "no PJRT plugin at TROUPE_PJRT_PLUGIN";
  auto backend = pjrt::PjrtBackend::Create({.plugin = plugin, .cache_dir = ""});
  ASSERT_TRUE(backend.ok()) << backend.status();
  std::set<uint64_t> seen;
  auto frames = CheckRounds(**backend, /*slots=*/80, "max_size: 30", /*rounds=*/12, &seen);
  EXPECT_EQ(frames->stats().frames_uploaded, static_cast<int64_t>(seen.size()));
#else
  GTEST_SKIP() << "built without the PJRT backend";
#endif
}

TEST(DeviceFrameTableTest, PrioritizedSamplingGathersWhatTheHostAssembles) {
  nn::CpuBackend cpu(1);
  PixelReplay p("max_size: 30 selector: prioritized priority_exponent: 1");
  DeviceFrameTable frames(&cpu, /*slots=*/200, kFrameBytes);
  std::set<uint64_t> seen;
  for (int round = 0; round < 10; ++round) {
    p.Write(/*steps=*/5);
    // Skewed priorities over the keys present.
    proto::MutatePrioritiesRequest request;
    request.set_table("pixels");
    for (uint64_t key = 0; key < static_cast<uint64_t>(6 * (round + 1)); ++key) {
      request.add_keys(key);
      request.add_priorities(1.0 + static_cast<double>(key % 7));
    }
    ASSERT_TRUE(p.replay->MutatePriorities(request).ok());
    EXPECT_TRUE(GatherEqualsHost(p, cpu, frames, /*n=*/8, &seen)) << "round " << round;
  }
  EXPECT_EQ(frames.stats().frames_uploaded, static_cast<int64_t>(seen.size()));
}

TEST(DeviceFrameTableTest, AReplayRestoredFromItsCheckpointGathersWhatTheHostAssembles) {
  nn::CpuBackend cpu(1);
  PixelReplay p("max_size: 30");
  DeviceFrameTable frames(&cpu, /*slots=*/120, kFrameBytes);
  std::set<uint64_t> seen;
  for (int round = 0; round < 6; ++round) {
    p.Write(/*steps=*/5);
    ASSERT_TRUE(GatherEqualsHost(p, cpu, frames, /*n=*/8, &seen));
  }
  const std::string path = ::testing::TempDir() + "/device_frames_replay.ckpt";
  ASSERT_TRUE(p.replay->Checkpoint(path).ok());
  // Restored in place: every frame is a new one (new ids), the old ones die.
  auto restored = p.replay->Restore(path);
  ASSERT_TRUE(restored.ok()) << restored.status();
  const int64_t uploaded_before = frames.stats().frames_uploaded;
  for (int round = 0; round < 6; ++round) {
    ASSERT_TRUE(GatherEqualsHost(p, cpu, frames, /*n=*/8, &seen)) << "after restore, round " << round;
    p.Write(/*steps=*/5);
  }
  EXPECT_GT(frames.stats().frames_uploaded, uploaded_before) << "the restored frames went up";
  EXPECT_EQ(frames.stats().frames_uploaded, static_cast<int64_t>(seen.size())) << "each once";
  EXPECT_EQ(frames.stats().replaced, 0);
  // A new process resuming from the checkpoint: a fresh replay and table.
  config::ReplayConfig resumed = replay::testing::TestConfig("max_size: 30");
  resumed.set_restore_path(path);
  auto fresh = replay::Replay::Create(resumed);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  PixelReplay q("max_size: 30");
  q.replay = *std::move(fresh);
  q.table = *q.replay->FindTable("pixels");
  DeviceFrameTable fresh_frames(&cpu, /*slots=*/120, kFrameBytes);
  std::set<uint64_t> fresh_seen;
  for (int round = 0; round < 4; ++round) EXPECT_TRUE(GatherEqualsHost(q, cpu, fresh_frames, 8, &fresh_seen));
  std::filesystem::remove(path);
}

// A table smaller than what replay holds is a cache: live frames are
// replaced (counted), uploaded again when sampled again, and every batch is
// still exact.
TEST(DeviceFrameTableTest, ATableSmallerThanReplayIsACacheThatStaysExact) {
  nn::CpuBackend cpu(1);
  std::set<uint64_t> seen;
  auto frames = CheckRounds(cpu, /*slots=*/kFramesPerItem * 8, "max_size: 200", /*rounds=*/20, &seen);
  EXPECT_GT(frames->stats().replaced, 0);
  EXPECT_GT(frames->stats().frames_uploaded, static_cast<int64_t>(seen.size())) << "misses went up again";
  EXPECT_LE(frames->resident(), kFramesPerItem * 8);
}

TEST(DeviceFrameTableTest, TheBatchNotTheTableDecidesWhatIsUploaded) {
  // Steady state: after a first batch, each batch uploads only the frames
  // the device has not seen, at most the frames inserted since.
  nn::CpuBackend cpu(1);
  PixelReplay p("max_size: 1000");
  DeviceFrameTable frames(&cpu, /*slots=*/1000, kFrameBytes);
  std::set<uint64_t> seen;
  p.Write(/*steps=*/40);
  ASSERT_TRUE(GatherEqualsHost(p, cpu, frames, /*n=*/64, &seen));
  for (int round = 0; round < 10; ++round) {
    const size_t seen_before = seen.size();
    const int64_t uploaded_before = frames.stats().frames_uploaded;
    p.Write(/*steps=*/2);
    ASSERT_TRUE(GatherEqualsHost(p, cpu, frames, /*n=*/64, &seen));
    const int64_t uploaded = frames.stats().frames_uploaded - uploaded_before;
    EXPECT_EQ(uploaded, static_cast<int64_t>(seen.size() - seen_before)) << "only frames new to the device";
    EXPECT_LT(uploaded, 64 * kFramesPerItem / 10) << "not the batch's frames";
  }
}

TEST(DeviceFrameTableTest, ATableSmallerThanABatchIsRefusedNamingTheSizes) {
  absl::Status status = DeviceFrameTable::Check(/*slots=*/40, kFrameBytes, /*batch_frames=*/48);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("40 slots"));
  EXPECT_THAT(status.message(), HasSubstr("48"));
  EXPECT_THAT(DeviceFrameTable::Check(100, /*frame_bytes=*/85 * 85 * 3, 48).message(), HasSubstr("multiple of 4"));

  // The learner's config: 84x84 frames, stacks of 3, batch 256 = 1536
  // frames, in 1 MiB (49 frames): refused before any agent exists.
  config::ExperimentConfig c;
  c.mutable_learner()->set_batch_size(256);
  c.mutable_learner()->set_device_frame_mib(1);
  const ObservationSpec spec{.frames = 3, .height = 84, .width = 84};
  status = ValidateDeviceFrames(c, spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("learner.device_frame_mib 1"));
  EXPECT_THAT(status.message(), HasSubstr("49 slots"));
  EXPECT_THAT(status.message(), HasSubstr("1536"));
  auto replicator = engine::MakeReplicator(c.learner().engine());
  ASSERT_TRUE(replicator.ok());
  EXPECT_THAT(D4pgAgent::Create(c, spec, 1, replicator->get()).status().message(),
              HasSubstr("learner.device_frame_mib 1"));
  // The host-assembled path needs no table.
  c.mutable_learner()->set_device_frames(false);
  EXPECT_TRUE(ValidateDeviceFrames(c, spec).ok());
}

// A remote replay (`troupe replay`, here a server on loopback): sampled
// with frame references, each frame crosses the stream once, and the device
// gets each once per learner life (a frame sent twice would be a new frame
// to the sampler, and go up again); a restarted learner (a new stream, a new
// table) gets the frames it samples again; every gathered frame is what was
// inserted, also while replay evicts and the stream forgets frames.
void CheckRemoteLives(const std::string& table_extra, int initial, int per_batch, int batches, int64_t slots_held,
                      int lives) {
  auto server = replay::Server::Start(replay::testing::TestConfig(table_extra));
  ASSERT_TRUE(server.ok()) << server.status();
  auto local = replay::NewLocalClient((*server)->replay());
  auto writer = local->NewWriter();
  ASSERT_TRUE(writer.ok());
  // A stream of frames (frame k is TestFrame(k)); item s observes frames
  // s..s+2, then s+3..s+5, and its action is {s, -s}.
  std::vector<uint64_t> keys;
  int next_item = 0;
  auto write = [&](int items) {
    for (int n = 0; n < items; ++n, ++next_item) {
      const int s = next_item;
      while (static_cast<int>(keys.size()) < s + 6) {
        const std::vector<uint8_t> frame = replay::testing::TestFrame(static_cast<int>(keys.size()));
        keys.push_back(*(*writer)->AppendFrame(frame.data(), kH, kW, kC));
      }
      const float action[2] = {static_cast<float>(s), static_cast<float>(-s)}, reward = 0;
      ASSERT_TRUE((*writer)
                      ->Insert("pixels", 1.0,
                               {replay::FieldValue::Frames({keys[s], keys[s + 1], keys[s + 2]}),
                                replay::FieldValue::Dense(proto::DTYPE_FLOAT32, {2}, action),
                                replay::FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &reward),
                                replay::FieldValue::Frames({keys[s + 3], keys[s + 4], keys[s + 5]})})
                      .ok());
    }
    ASSERT_TRUE((*writer)->Flush().ok());
  };
  write(initial);
  auto client = replay::NewGrpcClient((*server)->address());
  nn::CpuBackend cpu(1);
  replay::FrameDecoder decoder;
  for (int life = 0; life < lives; ++life) {
    SCOPED_TRACE(::testing::Message() << "learner life " << life);
    auto sampler = client->NewSampler({.table = "pixels", .batch_size = 16, .frame_references = true});
    ASSERT_TRUE(sampler.ok()) << sampler.status();
    DeviceFrameTable table(&cpu, slots_held, kFrameBytes);
    std::set<int> server_frames;
    replay::SampledBatch batch;
    std::vector<int32_t> slots;
    for (int b = 0; b < batches; ++b) {
      write(per_batch);
      ASSERT_TRUE((*sampler)->Next(&batch).ok());
      ASSERT_EQ(batch.frames.size(), 16u * kFramesPerItem);
      EXPECT_TRUE(batch.fields[0].data.empty()) << "pixels are references, not bytes";
      ASSERT_TRUE(table.Resolve(batch.frames, decoder, &slots).ok());
      const int64_t count = static_cast<int64_t>(slots.size());
      nn::DeviceBuffer device_slots(cpu, count), gathered(cpu, count * kFrameBytes / 4);
      cpu.Upload(slots.data(), device_slots.data(), sizeof(int32_t) * count);
      table.Gather(count, reinterpret_cast<const int32_t*>(device_slots.data()),
                   reinterpret_cast<uint8_t*>(gathered.data()));
      std::vector<uint8_t> back(count * kFrameBytes);
      cpu.Download(gathered.data(), back.data(), back.size());
      for (int i = 0; i < 16; ++i) {
        const int s = static_cast<int>(batch.fields[1].as<float>()[2 * i]);
        for (int j = 0; j < kFramesPerItem; ++j) {
          server_frames.insert(s + j);
          ASSERT_EQ(std::memcmp(back.data() + (i * kFramesPerItem + j) * kFrameBytes,
                                replay::testing::TestFrame(s + j).data(), kFrameBytes),
                    0)
              << "batch " << b << " item " << i << " (transition " << s << ") frame " << j;
        }
      }
    }
    EXPECT_EQ(table.stats().frames_uploaded, static_cast<int64_t>(server_frames.size()))
        << "each frame of the server once in this life";
    EXPECT_EQ(table.stats().replaced, 0) << "slots of frames the stream forgot were free again";
    if (per_batch > 0) {
      EXPECT_GT(static_cast<int64_t>(server_frames.size()), slots_held) << "more frames than slots";
    }
  }
}

TEST(DeviceFrameTableTest, ARemoteReplaySendsEachFrameOncePerLearnerLife) {
  CheckRemoteLives("max_size: 1000", /*initial=*/150, /*per_batch=*/0, /*batches=*/25, /*slots_held=*/1000,
                   /*lives=*/2);
}

TEST(DeviceFrameTableTest, ARemoteReplaysEvictedFramesAreForgottenAndBatchesStayExact) {
  // 40 items held, 5 new before each of 120 batches: more frames than the
  // 260 slots go through (what the sampler holds peaks near 200: replay's
  // and the writer's live frames, and 16 batches' worth not yet forgotten);
  // frames die on the server, the stream forgets them (every 16 batches),
  // the sampler lets them go, their slots free (nothing replaced; with the
  // forgetting turned off, live frames were), batches stay exact.
  // The rate limiter keeps the server's sampling (which streams ahead of
  // the client) within ~12 batches of the inserts. One learner life: with
  // a second, the test's inserts (made only between its samples) and the
  // limiter can wait on each other, depending on how far the first life's
  // stream sampled ahead.
  CheckRemoteLives("max_size: 40 rate_limiter { samples_per_insert: 3.2 error_buffer: 200 }", /*initial=*/40,
                   /*per_batch=*/5, /*batches=*/120, /*slots_held=*/260, /*lives=*/1);
}

// --- D4PG on gathered frames ----------------------------------------------------------

config::ExperimentConfig PixelAgentConfig() {
  config::ExperimentConfig c;
  config::LearnerConfig* l = c.mutable_learner();
  l->set_batch_size(8);
  l->set_replay_size(40);
  l->set_min_replay_size(1);
  l->mutable_engine()->set_threads(1);
  l->mutable_engine()->set_seed(3);
  config::D4pgConfig* d = c.mutable_d4pg();
  d->add_hidden(16);
  d->add_hidden(16);
  d->set_atoms(11);
  d->set_v_min(0);
  d->set_v_max(1);
  d->set_conv_channels(4);
  d->set_encoder_features(8);
  d->set_augment_pad(2);
  return c;
}

// The D4PG transitions table with `transitions` inserted: a stream of
// frames, transition t observing frames t..t+2 and then t+3..t+5.
std::unique_ptr<replay::Replay> FilledD4pgReplay(const config::ExperimentConfig& c, const ObservationSpec& spec,
                                                 int transitions) {
  config::ReplayConfig rc;
  *rc.add_tables() = D4pgTransitionTable(spec, 1, c);
  auto r = replay::Replay::Create(rc);
  TROUPE_CHECK(r.ok());
  auto client = replay::NewLocalClient(r->get());
  auto writer = client->NewWriter({.frame_window = 16});
  TROUPE_CHECK(writer.ok());
  std::vector<uint64_t> keys;
  auto append = [&](int t) { keys.push_back(*(*writer)->AppendFrame(replay::testing::SceneFrame(t).data(), 64, 64, 3)); };
  for (int t = 0; t < 5; ++t) append(t);
  for (int t = 0; t < transitions; ++t) {
    append(t + 5);
    const float action = 0.1f * static_cast<float>(t % 7) - 0.3f, reward = 0.05f * static_cast<float>(t % 5),
                discount = 0.9f;
    TROUPE_CHECK((*writer)
                     ->Insert("transitions", 1.0,
                              {replay::FieldValue::Frames({keys[t], keys[t + 1], keys[t + 2]}),
                               replay::FieldValue::Dense(proto::DTYPE_FLOAT32, {1}, &action),
                               replay::FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &reward),
                               replay::FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &discount),
                               replay::FieldValue::Frames({keys[t + 3], keys[t + 4], keys[t + 5]})})
                     .ok());
  }
  TROUPE_CHECK((*writer)->Close().ok());
  return *std::move(r);
}

// `updates` D4PG updates sampled from a filled replay, in Train calls of
// `per_call`: with frame references (the device frame table) or
// host-assembled batches, with the input made one update ahead or not.
uint64_t TrainOnReplay(config::EngineConfig::Device device, bool device_frames, int updates,
                       DeviceFrameStats* stats = nullptr, bool prefetch = true, int per_call = 1000,
                       double* input_wait_s = nullptr, std::vector<float>* policy = nullptr) {
  config::ExperimentConfig c = PixelAgentConfig();
  c.mutable_learner()->mutable_engine()->set_device(device);
  if (device == config::EngineConfig::PJRT) {
    c.mutable_learner()->mutable_engine()->set_pjrt_plugin(PjrtPlugin());
    c.mutable_learner()->mutable_engine()->set_pjrt_cache_dir("");
  }
  c.mutable_learner()->set_device_frames(device_frames);
  c.mutable_learner()->set_prefetch_input(prefetch);
  const ObservationSpec spec{.frames = 3, .height = 64, .width = 64};
  auto replay = FilledD4pgReplay(c, spec, /*transitions=*/40);
  auto replicator = engine::MakeReplicator(c.learner().engine());
  TROUPE_CHECK(replicator.ok());
  auto agent = D4pgAgent::Create(c, spec, 1, replicator->get());
  TROUPE_CHECK(agent.ok());
  EXPECT_EQ((*agent)->frame_references(), device_frames);
  auto client = replay::NewLocalClient(replay.get());
  auto sampler = client->NewSampler(
      {.table = "transitions", .batch_size = 8, .frame_references = (*agent)->frame_references()});
  TROUPE_CHECK(sampler.ok());
  for (int done = 0; done < updates; done += per_call) {
    const absl::Status trained = (*agent)->Train(
        std::min(per_call, updates - done), [&](int, int64_t, replay::SampledBatch* out) { return (*sampler)->Next(out); });
    EXPECT_TRUE(trained.ok()) << trained;
  }
  if (stats != nullptr) *stats = (*agent)->frame_stats();
  if (input_wait_s != nullptr) *input_wait_s = (*agent)->metrics().input_wait_s;
  if (policy != nullptr) (*agent)->PolicyParameters(policy);
  return (*agent)->StateChecksum();
}

TEST(D4pgDeviceFramesTest, UpdatesFromGatheredFramesEqualHostBatchesBitForBit) {
  DeviceFrameStats stats;
  const uint64_t gathered = TrainOnReplay(config::EngineConfig::CPU, true, 6, &stats);
  EXPECT_EQ(gathered, TrainOnReplay(config::EngineConfig::CPU, false, 6));
  EXPECT_NE(gathered, TrainOnReplay(config::EngineConfig::CPU, true, 0)) << "the updates moved the state";
  // 6 batches of 8 transitions resolved 288 frames; the replay has 45.
  EXPECT_EQ(stats.resolved, 6 * 8 * kFramesPerItem);
  EXPECT_LE(stats.frames_uploaded, 45);
}

// The input made one update ahead (a thread per replica) changes no update:
// the same batches in the same order, gathered or host-assembled, in one
// Train call or several.
TEST(D4pgDeviceFramesTest, PrefetchedInputChangesNoUpdateBitForBit) {
  const uint64_t plain = TrainOnReplay(config::EngineConfig::CPU, true, 7, nullptr, /*prefetch=*/false);
  double waited = -1;
  EXPECT_EQ(TrainOnReplay(config::EngineConfig::CPU, true, 7, nullptr, /*prefetch=*/true, 1000, &waited), plain);
  EXPECT_GE(waited, 0.0);
  EXPECT_EQ(TrainOnReplay(config::EngineConfig::CPU, true, 7, nullptr, /*prefetch=*/true, /*per_call=*/3), plain);
  EXPECT_EQ(TrainOnReplay(config::EngineConfig::CPU, false, 7, nullptr, /*prefetch=*/true, /*per_call=*/2),
            TrainOnReplay(config::EngineConfig::CPU, false, 7, nullptr, /*prefetch=*/false));
}

// On PJRT the gather is inside the step's one compiled program: the
// updates from gathered frames are the CPU's within float32 rounding (XLA's
// fused kernels against Eigen's) and those of host batches on PJRT.
TEST(D4pgDeviceFramesTest, UpdatesFromGatheredFramesInACompiledPjrtStepMatchTheCpu) {
  if (PjrtPlugin().empty()) GTEST_SKIP() << "no PJRT plugin at TROUPE_PJRT_PLUGIN";
  std::vector<float> cpu, gathered, host, start;
  TrainOnReplay(config::EngineConfig::CPU, false, 0, nullptr, true, 1000, nullptr, &start);
  TrainOnReplay(config::EngineConfig::CPU, false, 4, nullptr, true, 1000, nullptr, &cpu);
  DeviceFrameStats stats;
  TrainOnReplay(config::EngineConfig::PJRT, true, 4, &stats, true, 1000, nullptr, &gathered);
  TrainOnReplay(config::EngineConfig::PJRT, false, 4, nullptr, true, 1000, nullptr, &host);
  ASSERT_EQ(gathered.size(), cpu.size());
  ASSERT_EQ(host.size(), cpu.size());
  double moved = 0, to_cpu = 0, to_host = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    moved = std::max(moved, std::fabs(double{cpu[i]} - start[i]));
    to_cpu = std::max(to_cpu, std::fabs(double{gathered[i]} - cpu[i]));
    to_host = std::max(to_host, std::fabs(double{gathered[i]} - host[i]));
  }
  EXPECT_GT(moved, 1e-4);
  EXPECT_LT(to_cpu, 1e-4);
  EXPECT_LT(to_host, 1e-4);
  EXPECT_EQ(stats.resolved, 4 * 8 * kFramesPerItem);
}

TEST(D4pgDeviceFramesTest, UpdatesFromGatheredFramesOnTheStrictDeviceEqualTheCpusBitForBit) {
  EXPECT_EQ(TrainOnReplay(config::EngineConfig::CPU_STRICT, true, 3),
            TrainOnReplay(config::EngineConfig::CPU, false, 3));
}

}  // namespace
}  // namespace troupe::agents
