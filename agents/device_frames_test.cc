// The device frame table: batches gathered on the device equal the batches
// replay assembles on the host, bit for bit, on the CPU, the strict CPU
// device and the PJRT CPU plugin, over evictions, a replay checkpoint
// restored, prioritized sampling and a table too small for replay (a cache);
// a full table grows up to its max instead; frames go up once; D4PG updates
// from gathered frames equal updates from host batches; a table too small
// for a batch is refused naming the sizes; the learner's table starts at
// about one frame per transition of replay (not two stacks, not the
// budget), a long run at capacity never outgrows it, and the budget caps it.
#include "agents/device_frames.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "agents/d4pg_agent.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/state_match.h"
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

// A batch sampled, assembled on the host and resolved into the table.
struct ResolvedBatch {
  int n = 0;
  replay::SampledBatch host;
  std::vector<int32_t> slots;
};

// Samples `n` items, assembles them on the host (FillBatch) and as
// references, and resolves the references into `frames` (`upload` false:
// prepares them, their Upload the caller's). `seen` collects the frame ids
// resolved.
::testing::AssertionResult SampleAndResolve(PixelReplay& p, DeviceFrameTable& frames, int n,
                                            std::set<uint64_t>* seen, ResolvedBatch* out, bool upload = true) {
  out->n = n;
  replay::SampledBatch& host = out->host;
  std::vector<int32_t>& slots = out->slots;
  std::vector<replay::SampledItem> items;
  int64_t table_size = 0;
  if (absl::Status s = p.table->Sample(n, absl::Seconds(5), &items, &table_size); !s.ok()) {
    return ::testing::AssertionFailure() << s;
  }
  const replay::Signature& signature = p.table->signature();
  replay::SampledBatch references;
  replay::FrameDecoder decoder, table_decoder;
  replay::ShapeBatch(signature, n, &host);
  replay::ShapeBatch(signature, n, &references, /*frame_references=*/true);
  if (absl::Status s = replay::FillBatch(signature, items, table_size, false, 0, decoder, &host); !s.ok()) {
    return ::testing::AssertionFailure() << s;
  }
  replay::FillBatchReferences(signature, items, table_size, false, 0, &references);
  for (const replay::FramePtr& f : references.frames) seen->insert(f->id());
  const absl::Status s = upload ? frames.Resolve(references.frames, table_decoder, &slots)
                                : frames.Prepare(references.frames, table_decoder, &slots);
  if (!s.ok()) return ::testing::AssertionFailure() << s;
  return ::testing::AssertionSuccess();
}

// Gathers every item's six frames of `batch` from `frames` inside a step;
// true when each gathered frame equals the host batch's byte for byte.
::testing::AssertionResult GatheredEqualsHost(nn::Backend& backend, DeviceFrameTable& frames,
                                              const ResolvedBatch& batch) {
  const int n = batch.n;
  const replay::SampledBatch& host = batch.host;
  const std::vector<int32_t>& slots = batch.slots;
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

// SampleAndResolve, then GatheredEqualsHost.
::testing::AssertionResult GatherEqualsHost(PixelReplay& p, nn::Backend& backend, DeviceFrameTable& frames, int n,
                                            std::set<uint64_t>* seen) {
  ResolvedBatch batch;
  if (::testing::AssertionResult resolved = SampleAndResolve(p, frames, n, seen, &batch); !resolved) return resolved;
  return GatheredEqualsHost(backend, frames, batch);
}

// Rounds of inserts (evicting once the table is full) and gathered batches
// equal to host-assembled ones, on `backend` with a table of `slots`
// (growing up to `max_slots`; 0: fixed). Returns the table for its counters.
std::unique_ptr<DeviceFrameTable> CheckRounds(nn::Backend& backend, int64_t slots, const std::string& table_extra,
                                              int rounds, std::set<uint64_t>* seen, int64_t max_slots = 0) {
  PixelReplay p(table_extra);
  auto frames = std::make_unique<DeviceFrameTable>(&backend, slots, kFrameBytes, max_slots);
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
  // Each upload's scatter is a step: recorded twice per bucket and table
  // size, replayed after that (no program written or looked up).
  EXPECT_GT((*backend)->stats().step_replays, 0);
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

// A table full of live frames grows (doubling, the frames it held copied
// on the device) instead of replacing any, up to its max_slots; at it, it is
// a cache. Batches stay exact across each growth, on the CPU and on the
// strict device (the copy a device kernel).
// Two batches in flight (set_batches_in_flight 2, as two updates in one
// execution): the second batch's new frames never take the first's slots,
// so both gather exactly after both resolved, though the table is a cache
// replacing live frames (fixed at two batches' frames, replay holding more).
TEST(DeviceFrameTableTest, TheBatchesInFlightKeepTheirFramesTillTheirStep) {
  nn::CpuBackend cpu(1);
  PixelReplay p("max_size: 200");
  DeviceFrameTable frames(&cpu, /*slots=*/2 * 8 * kFramesPerItem, kFrameBytes);
  frames.set_batches_in_flight(2);
  std::set<uint64_t> seen;
  for (int round = 0; round < 20; ++round) {
    p.Write(/*steps=*/5);
    ResolvedBatch first, second;
    ASSERT_TRUE(SampleAndResolve(p, frames, /*n=*/8, &seen, &first));
    ASSERT_TRUE(SampleAndResolve(p, frames, /*n=*/8, &seen, &second));
    EXPECT_TRUE(GatheredEqualsHost(cpu, frames, first)) << "round " << round << ": the first batch";
    EXPECT_TRUE(GatheredEqualsHost(cpu, frames, second)) << "round " << round << ": the second batch";
  }
  EXPECT_GT(frames.stats().replaced, 0) << "the table never had to replace a live frame";
}

// Batches prepared ahead of their uploads (an input thread a whole
// execution ahead of the device's): four batches staged, then sent one per
// Upload in their order, each gathered exactly; across growths between
// staged batches (the device's table grown at an Upload to slots a later
// staged batch took), and in a cache keeping four batches' frames. DropPending forgets what is
// staged: the slots of its new frames are free again and later batches
// stay exact. A batch prepared beyond batches_in_flight before an upload is
// refused.
TEST(DeviceFrameTableTest, BatchesPreparedAheadGoUpInTheirOrder) {
  nn::CpuBackend cpu(1);
  nn::StrictCpuBackend strict(1, size_t{64} << 20);
  struct Case {
    nn::Backend* backend;
    int64_t slots, max_slots;
    const char* replay;
    int steps;  // per round
  };
  for (const Case& c : {Case{&cpu, 5, 1000, "max_size: 30", 5}, Case{&strict, 5, 1000, "max_size: 30", 5},
                        Case{&cpu, 4 * 8 * kFramesPerItem, 0, "max_size: 400", 60}}) {
    SCOPED_TRACE(::testing::Message() << c.backend->name() << ", " << c.slots << " slots up to " << c.max_slots);
    PixelReplay p(c.replay);
    DeviceFrameTable frames(c.backend, c.slots, kFrameBytes, c.max_slots);
    frames.set_batches_in_flight(4);
    std::set<uint64_t> seen;
    for (int round = 0; round < 12; ++round) {
      p.Write(c.steps);
      std::vector<ResolvedBatch> batches(4);
      for (ResolvedBatch& batch : batches) {
        ASSERT_TRUE(SampleAndResolve(p, frames, /*n=*/8, &seen, &batch, /*upload=*/false));
      }
      EXPECT_EQ(frames.pending(), 4);
      if (round == 0) {
        // A fifth before an upload: refused, saying why; the four stay staged.
        std::set<uint64_t> not_sent;
        ResolvedBatch fifth;
        const ::testing::AssertionResult refused = SampleAndResolve(p, frames, /*n=*/8, &not_sent, &fifth, false);
        EXPECT_FALSE(refused);
        EXPECT_THAT(refused.message(), HasSubstr("4 batches prepared and not uploaded"));
        EXPECT_EQ(frames.pending(), 4);
      }
      for (size_t k = 0; k < batches.size(); ++k) {
        frames.Upload();
        EXPECT_EQ(frames.pending(), static_cast<int64_t>(batches.size() - k - 1));
        EXPECT_TRUE(GatheredEqualsHost(*c.backend, frames, batches[k])) << "round " << round << ", batch " << k;
      }
    }
    if (c.max_slots > 0) {
      EXPECT_GE(frames.stats().grown, 2);
      EXPECT_EQ(frames.stats().frames_uploaded, static_cast<int64_t>(seen.size())) << "each frame once";
    } else {
      EXPECT_GT(frames.stats().replaced, 0) << "the cache never replaced a live frame";
    }
    // Two batches staged, then dropped: nothing goes up, and what follows is exact.
    const int64_t uploaded = frames.stats().frames_uploaded;
    p.Write(/*steps=*/5);
    ResolvedBatch dropped;
    ASSERT_TRUE(SampleAndResolve(p, frames, /*n=*/8, &seen, &dropped, /*upload=*/false));
    ASSERT_TRUE(SampleAndResolve(p, frames, /*n=*/8, &seen, &dropped, /*upload=*/false));
    frames.DropPending();
    EXPECT_EQ(frames.pending(), 0);
    frames.Upload();
    EXPECT_EQ(frames.stats().frames_uploaded, uploaded);
    for (int round = 0; round < 3; ++round) {
      EXPECT_TRUE(GatherEqualsHost(p, *c.backend, frames, /*n=*/8, &seen)) << "after the drop, round " << round;
    }
  }
}

TEST(DeviceFrameTableTest, AFullTableGrowsUpToItsMaxInsteadOfReplacingLiveFrames) {
  nn::CpuBackend cpu(1);
  nn::StrictCpuBackend strict(1, size_t{64} << 20);
  for (nn::Backend* backend : {static_cast<nn::Backend*>(&cpu), static_cast<nn::Backend*>(&strict)}) {
    SCOPED_TRACE(backend->name());
    // Replay's 30 items hold ~36 frames, a batch up to 48; from 5 slots
    // (fewer than a batch: it grows inside a Resolve too).
    std::set<uint64_t> seen;
    auto frames = CheckRounds(*backend, /*slots=*/5, "max_size: 30", /*rounds=*/25, &seen, /*max_slots=*/1000);
    const DeviceFrameStats stats = frames->stats();
    EXPECT_EQ(stats.replaced, 0) << "no live frame dropped below max_slots";
    EXPECT_EQ(stats.frames_uploaded, static_cast<int64_t>(seen.size())) << "each frame once, across growths";
    EXPECT_GE(stats.grown, 2);
    EXPECT_EQ(stats.slots, frames->slots());
    EXPECT_GE(frames->slots(), 20);
    EXPECT_LE(frames->slots(), 160) << "grown to what replay and the batch held, not to max_slots";
    EXPECT_GT(static_cast<int64_t>(seen.size()), frames->slots()) << "slots of evicted frames were reused";
  }
  // Capped: at max_slots live frames are replaced (a cache), batches exact.
  std::set<uint64_t> seen;
  auto capped = CheckRounds(cpu, /*slots=*/8, "max_size: 200", /*rounds=*/20, &seen,
                            /*max_slots=*/kFramesPerItem * 8);
  EXPECT_EQ(capped->slots(), kFramesPerItem * 8);
  EXPECT_GT(capped->stats().replaced, 0);
  EXPECT_GT(capped->stats().frames_uploaded, static_cast<int64_t>(seen.size()));
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
  // frames, two batches in flight (the one stepping and the one made
  // ahead), in 1 MiB (49 frames): refused before any agent exists.
  config::ExperimentConfig c;
  c.mutable_learner()->set_batch_size(256);
  c.mutable_learner()->set_device_frame_mib(1);
  const ObservationSpec spec{.frames = 3, .height = 84, .width = 84};
  status = ValidateDeviceFrames(c, spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("learner.device_frame_mib 1"));
  EXPECT_THAT(status.message(), HasSubstr("49 slots"));
  EXPECT_THAT(status.message(), HasSubstr("3072"));
  // 4 updates per execution, prefetched: eight batches; without the
  // prefetch, the execution's four.
  c.mutable_learner()->set_updates_per_execution(4);
  EXPECT_THAT(ValidateDeviceFrames(c, spec).message(), HasSubstr("12288"));
  c.mutable_learner()->set_prefetch_input(false);
  EXPECT_THAT(ValidateDeviceFrames(c, spec).message(), HasSubstr("6144"));
  c.mutable_learner()->set_prefetch_input(true);
  c.mutable_learner()->set_updates_per_execution(1);
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
// actors_insert false: no inserts after the first `initial`; true: a thread
// writes as actors do (on its own, paced only by the rate limiter), and a
// sample that waits on the limiter for 30 s fails the test (no hang).
void CheckRemoteLives(const std::string& table_extra, int initial, bool actors_insert, int batches,
                      int64_t slots_held, int lives) {
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
  std::atomic<bool> stop_inserting = false;
  std::thread inserter;
  if (actors_insert) {
    inserter = std::thread([&] {
      while (!stop_inserting.load()) write(1);
    });
  }
  auto client = replay::NewGrpcClient((*server)->address());
  nn::CpuBackend cpu(1);
  replay::FrameDecoder decoder;
  for (int life = 0; life < lives; ++life) {
    SCOPED_TRACE(::testing::Message() << "learner life " << life);
    auto sampler = client->NewSampler(
        {.table = "pixels", .batch_size = 16, .timeout = absl::Seconds(30), .frame_references = true});
    ASSERT_TRUE(sampler.ok()) << sampler.status();
    DeviceFrameTable table(&cpu, slots_held, kFrameBytes);
    std::set<int> server_frames;
    replay::SampledBatch batch;
    std::vector<int32_t> slots;
    for (int b = 0; b < batches; ++b) {
      const absl::Status sampled = (*sampler)->Next(&batch);
      ASSERT_TRUE(sampled.ok()) << "batch " << b << ": " << sampled;
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
    if (actors_insert) {
      EXPECT_GT(static_cast<int64_t>(server_frames.size()), slots_held) << "more frames than slots";
    }
  }
  if (inserter.joinable()) {
    stop_inserting = true;
    (*server)->replay()->StopLimitingInserts();  // an insert waiting for samples goes in
    inserter.join();
  }
}

TEST(DeviceFrameTableTest, ARemoteReplaySendsEachFrameOncePerLearnerLife) {
  CheckRemoteLives("max_size: 1000", /*initial=*/150, /*actors_insert=*/false, /*batches=*/25, /*slots_held=*/1000,
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
  // the client) within ~12 batches of the inserts, which a thread makes as
  // actors do, whatever the learner samples. Two learner lives: the second
  // starts where the first's stream left the limiter (it sampled ahead and
  // never used those batches). (With the inserts made only between the
  // test's samples, the second life and the inserts could wait on each
  // other: a deadlock of that test, not of replay.)
  CheckRemoteLives("max_size: 40 rate_limiter { samples_per_insert: 3.2 error_buffer: 200 }", /*initial=*/40,
                   /*actors_insert=*/true, /*batches=*/120, /*slots_held=*/260, /*lives=*/2);
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
  // Every part of the state moves in a few updates by more than the
  // equivalence tests' tolerances (the targets too).
  d->set_actor_learning_rate(1e-3f);
  d->set_critic_learning_rate(1e-3f);
  d->set_target_tau(0.2f);
  return c;
}

// The D4PG transitions table with `transitions` inserted: a stream of
// frames, transition t observing frames t..t+2 and then t+3..t+5.
std::unique_ptr<replay::Replay> FilledD4pgReplay(const config::ExperimentConfig& c, const ObservationSpec& spec,
                                                 int transitions) {
  config::ReplayConfig rc;
  *rc.add_tables() = TransitionTable(spec, 1, c);
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
// host-assembled batches, with the input made ahead or not, the input
// started once for every call (StartInput, the learner's way) or each
// call's own (Train(n, sample)).
struct ReplayRun {
  config::EngineConfig::Device device = config::EngineConfig::CPU;
  bool device_frames = true;
  int updates = 0;
  bool prefetch = true;
  int per_call = 1000;
  bool started_input = false;
  int per_execution = 1;
};
struct ReplayRunResult {
  uint64_t checksum = 0;  // StateChecksum
  std::vector<nn::CheckpointTensor> state;  // CheckpointState
  DeviceFrameStats stats;
  std::vector<float> policy;
  int64_t batches_sampled = 0;
};
// An agent of `run`'s config and a sampler of a filled replay (members in
// the order they go: the agent, whose input samples, first).
struct AgentOnReplay {
  explicit AgentOnReplay(const ReplayRun& run) {
    config::ExperimentConfig c = PixelAgentConfig();
    c.mutable_learner()->mutable_engine()->set_device(run.device);
    if (run.device == config::EngineConfig::PJRT) {
      c.mutable_learner()->mutable_engine()->set_pjrt_plugin(PjrtPlugin());
      c.mutable_learner()->mutable_engine()->set_pjrt_cache_dir("");
    }
    c.mutable_learner()->set_device_frames(run.device_frames);
    c.mutable_learner()->set_prefetch_input(run.prefetch);
    c.mutable_learner()->set_updates_per_execution(run.per_execution);
    const ObservationSpec spec{.frames = 3, .height = 64, .width = 64};
    replay = FilledD4pgReplay(c, spec, /*transitions=*/40);
    auto made = engine::MakeReplicator(c.learner().engine());
    TROUPE_CHECK(made.ok());
    replicator = std::move(*made);
    auto created = D4pgAgent::Create(c, spec, 1, replicator.get());
    TROUPE_CHECK(created.ok());
    agent = std::move(*created);
    EXPECT_EQ(agent->frame_references(), run.device_frames);
    client = replay::NewLocalClient(replay.get());
    auto opened =
        client->NewSampler({.table = "transitions", .batch_size = 8, .frame_references = agent->frame_references()});
    TROUPE_CHECK(opened.ok());
    sampler = std::move(*opened);
  }
  std::unique_ptr<replay::Replay> replay;
  std::unique_ptr<replay::ReplayClient> client;
  std::unique_ptr<replay::Sampler> sampler;
  std::unique_ptr<replicator::Replicator> replicator;
  std::unique_ptr<D4pgAgent> agent;
};

ReplayRunResult TrainOnReplay(const ReplayRun& run) {
  AgentOnReplay on(run);
  D4pgAgent* agent = on.agent.get();
  ReplayRunResult result;
  const D4pgAgent::SampleFn sample = [&](int, int64_t, replay::SampledBatch* out) {
    ++result.batches_sampled;
    return on.sampler->Next(out);
  };
  if (run.started_input) agent->StartInput(sample);
  for (int done = 0; done < run.updates; done += run.per_call) {
    const int n = std::min(run.per_call, run.updates - done);
    const absl::Status trained = run.started_input ? agent->Train(n) : agent->Train(n, sample);
    EXPECT_TRUE(trained.ok()) << trained;
  }
  agent->StopInput();
  result.stats = agent->frame_stats();
  agent->PolicyParameters(&result.policy);
  result.checksum = agent->StateChecksum();
  result.state = agent->CheckpointState();
  return result;
}

TEST(D4pgDeviceFramesTest, UpdatesFromGatheredFramesEqualHostBatchesBitForBit) {
  const ReplayRunResult gathered = TrainOnReplay({.updates = 6});
  EXPECT_EQ(gathered.checksum, TrainOnReplay({.device_frames = false, .updates = 6}).checksum);
  EXPECT_NE(gathered.checksum, TrainOnReplay({.updates = 0}).checksum) << "the updates moved the state";
  // 6 batches of 8 transitions resolved 288 frames; the replay has 45.
  EXPECT_EQ(gathered.stats.resolved, 6 * 8 * kFramesPerItem);
  EXPECT_LE(gathered.stats.frames_uploaded, 45);
}

// The input made ahead (a thread per replica; one update an execution
// here) changes no update:
// the same batches in the same order, gathered or host-assembled, in one
// Train call or several, each call's own input or one started for all
// (made ahead into the next call). Each call's own input samples exactly
// its updates' batches; a started one at most one more.
TEST(D4pgDeviceFramesTest, PrefetchedInputChangesNoUpdateBitForBit) {
  const ReplayRunResult plain = TrainOnReplay({.updates = 7, .prefetch = false});
  EXPECT_EQ(plain.batches_sampled, 7);
  const ReplayRunResult ahead = TrainOnReplay({.updates = 7});
  EXPECT_EQ(ahead.checksum, plain.checksum);
  EXPECT_EQ(ahead.batches_sampled, 7) << "a call's own input sampled past its updates";
  const ReplayRunResult per_call = TrainOnReplay({.updates = 7, .per_call = 3});
  EXPECT_EQ(per_call.checksum, plain.checksum);
  EXPECT_EQ(per_call.batches_sampled, 7) << "a call's own input sampled past its updates";
  for (const bool prefetch : {true, false}) {
    const ReplayRunResult started = TrainOnReplay({.updates = 7, .prefetch = prefetch, .per_call = 2, .started_input = true});
    EXPECT_EQ(started.checksum, plain.checksum) << "prefetch " << prefetch;
    EXPECT_GE(started.batches_sampled, 7);
    EXPECT_LE(started.batches_sampled, prefetch ? 8 : 7);
  }
  EXPECT_EQ(TrainOnReplay({.device_frames = false, .updates = 7, .per_call = 2}).checksum,
            TrainOnReplay({.device_frames = false, .updates = 7, .prefetch = false}).checksum);
  EXPECT_EQ(TrainOnReplay({.device_frames = false, .updates = 7, .per_call = 2, .started_input = true}).checksum,
            TrainOnReplay({.device_frames = false, .updates = 7, .prefetch = false}).checksum);
}

// The input made ahead draws each batch's random shifts for the update it
// is made for, counted from the updates as the input opened. A Load while
// it runs moves the updates: each update then draws its own. B loads A's
// state of 4 updates after 2 updates of its own (its input has made batches
// for its updates 2 and on) and runs 3 more; C loads the same state and
// runs the same 3 batches on its own input: the same state.
TEST(D4pgDeviceFramesTest, ALoadWhileTheInputRunsAheadShiftsEachUpdateByItsOwnCount) {
  const std::string path = ::testing::TempDir() + "/shifts_after_load.ckpt";
  {
    AgentOnReplay a({.device_frames = false});
    const absl::Status trained =
        a.agent->Train(4, [&](int, int64_t, replay::SampledBatch* out) { return a.sampler->Next(out); });
    ASSERT_TRUE(trained.ok()) << trained;
    ASSERT_TRUE(a.agent->Save(path).ok());
  }
  std::vector<replay::SampledBatch> taken;  // (the input's thread's, read once it stopped)
  AgentOnReplay b({.device_frames = false});
  b.agent->StartInput([&](int, int64_t, replay::SampledBatch* out) {
    const absl::Status sampled = b.sampler->Next(out);
    taken.push_back(*out);
    return sampled;
  });
  ASSERT_TRUE(b.agent->Train(2).ok());
  ASSERT_TRUE(b.agent->Load(path).ok());
  ASSERT_TRUE(b.agent->Train(3).ok());
  b.agent->StopInput();
  ASSERT_GE(taken.size(), 5u);

  AgentOnReplay c({.device_frames = false});
  ASSERT_TRUE(c.agent->Load(path).ok());
  size_t next = 2;
  const absl::Status trained = c.agent->Train(3, [&](int, int64_t, replay::SampledBatch* out) {
    *out = taken[next++];
    return absl::OkStatus();
  });
  ASSERT_TRUE(trained.ok()) << trained;
  EXPECT_EQ(b.agent->StateChecksum(), c.agent->StateChecksum());
}

// The input made ahead is made on a thread of its own that runs
// SCHED_BATCH (woken by the learner's Free, it does not preempt the
// learner's thread); without prefetching, on the caller's thread as it runs.
TEST(D4pgDeviceFramesTest, ThePrefetchingThreadRunsAsABatchThread) {
  for (const bool prefetch : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "prefetch " << prefetch);
    AgentOnReplay on({.prefetch = prefetch});
    const std::thread::id caller = std::this_thread::get_id();
    const int caller_policy = sched_getscheduler(0);
    std::vector<int> policies;
    std::vector<bool> on_caller;
    const absl::Status trained = on.agent->Train(3, [&](int, int64_t, replay::SampledBatch* out) {
      policies.push_back(sched_getscheduler(0));
      on_caller.push_back(std::this_thread::get_id() == caller);
      return on.sampler->Next(out);
    });
    ASSERT_TRUE(trained.ok()) << trained;
    ASSERT_EQ(policies.size(), 3u);
    for (size_t i = 0; i < policies.size(); ++i) {
      EXPECT_EQ(policies[i], prefetch ? SCHED_BATCH : caller_policy) << "batch " << i;
      EXPECT_EQ(on_caller[i], !prefetch) << "batch " << i;
    }
  }
  EXPECT_NE(sched_getscheduler(0), SCHED_BATCH) << "the caller's own policy changed";
}

// Three updates per execution (learner.updates_per_execution): their three
// batches' frames all go up before the step that gathers them (the table
// keeping them: TheBatchesInFlightKeepTheirFramesTillTheirStep; this replay
// is smaller than the table, nothing is replaced), the next execution's
// batches made ahead go to three more buffers, and the updates are the
// single ones bit for bit: gathered or
// host-assembled, prefetched or not, in calls of 2 and 7 (executions of
// 2, or of 3, 3 and 1), with a started input.
TEST(D4pgDeviceFramesTest, ThreeUpdatesPerExecutionChangeNoUpdateBitForBit) {
  const ReplayRunResult plain = TrainOnReplay({.updates = 7, .prefetch = false});
  for (const bool frames : {true, false}) {
    for (const bool prefetch : {true, false}) {
      for (const int per_call : {2, 7}) {
        SCOPED_TRACE(::testing::Message() << "device_frames " << frames << ", prefetch " << prefetch << ", calls of "
                                          << per_call);
        const ReplayRunResult three = TrainOnReplay({.device_frames = frames, .updates = 7, .prefetch = prefetch,
                                                     .per_call = per_call, .per_execution = 3});
        EXPECT_EQ(three.checksum, plain.checksum);
        EXPECT_EQ(three.batches_sampled, 7);
      }
    }
  }
  // A started input makes the next call's first execution's batches too:
  // at most three more than the updates'.
  const ReplayRunResult started = TrainOnReplay({.updates = 7, .per_call = 2, .started_input = true, .per_execution = 3});
  EXPECT_EQ(started.checksum, plain.checksum);
  EXPECT_GE(started.batches_sampled, 7);
  EXPECT_LE(started.batches_sampled, 10);
}

// A started input makes the next Train call's first execution's batches
// while the caller works between calls (the learner publishing a policy),
// and no batch more (Train allows those): those updates do not wait for
// their input (with each call's own input they waited the whole sample, one
// execution in publish_every). One update an execution, and four (the
// input a whole execution ahead of the device, not one batch).
TEST(D4pgDeviceFramesTest, AStartedInputMakesTheNextCallsFirstExecutionBetweenCalls) {
  for (const int n : {1, 4}) {
    SCOPED_TRACE(::testing::Message() << n << " updates an execution");
    AgentOnReplay on({.per_execution = n});
    constexpr auto kSampleTime = std::chrono::milliseconds(60);
    const double sample_s = std::chrono::duration<double>(kSampleTime).count();
    std::atomic<int64_t> sampled = 0;
    on.agent->StartInput([&](int, int64_t, replay::SampledBatch* out) {
      std::this_thread::sleep_for(kSampleTime);  // a slow sampler
      const absl::Status status = on.sampler->Next(out);
      ++sampled;
      return status;
    });
    ASSERT_TRUE(on.agent->Train(n).ok());
    // (metrics: a mean per update since the last call)
    EXPECT_GE(on.agent->metrics().input_wait_s, 0.9 * sample_s) << "the first execution waits for its batches";
    for (int64_t call = 1; call <= 3; ++call) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (sampled.load() < n * (call + 1) && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      ASSERT_EQ(sampled.load(), n * (call + 1)) << "the next call's batches were not made between the calls";
      std::this_thread::sleep_for(3 * kSampleTime);  // (their frames prepared; and no batch more)
      EXPECT_EQ(sampled.load(), n * (call + 1)) << "the input ran more than one execution ahead";
      ASSERT_TRUE(on.agent->Train(n).ok());
    }
    EXPECT_LT(on.agent->metrics().input_wait_s, 0.2 * sample_s) << "a later call's updates waited for their batches";
    on.agent->StopInput();  // (while the next call's batches are sampled, or before they start)
    EXPECT_GE(sampled.load(), 4 * n);
    EXPECT_LE(sampled.load(), 5 * n) << "the input ran more than one execution ahead";
    EXPECT_EQ(on.agent->updates(), 4 * n);
  }
}

// An input stopped with a batch made ahead (its new frames prepared, not
// uploaded) leaves the frame table as if that batch had never been made:
// the agent trains again on an input started anew, and on a call's own.
TEST(D4pgDeviceFramesTest, AnInputStoppedWithABatchMadeAheadStartsAgain) {
  AgentOnReplay on({});
  std::atomic<int64_t> sampled = 0;
  const D4pgAgent::SampleFn sample = [&](int, int64_t, replay::SampledBatch* out) {
    const absl::Status status = on.sampler->Next(out);
    ++sampled;
    return status;
  };
  for (int life = 0; life < 2; ++life) {
    on.agent->StartInput(sample);
    ASSERT_TRUE(on.agent->Train(1).ok()) << "life " << life;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (sampled.load() < 2 * (life + 1) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ASSERT_EQ(sampled.load(), 2 * (life + 1)) << "the next call's batch was not made ahead";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // its frames prepared too
    on.agent->StopInput();
  }
  const absl::Status own = on.agent->Train(2, sample);
  EXPECT_TRUE(own.ok()) << own;
  EXPECT_EQ(on.agent->updates(), 4);
}

// StopInput ends a sample blocked on the rate limiter through the input's
// cancel (a replay::Sampler's Cancel); Train then wants an input again, and
// Train(n, sample) is refused while a started input runs.
TEST(D4pgDeviceFramesTest, StopInputCancelsABlockedSampleAndTrainWantsAnInput) {
  AgentOnReplay on({});
  absl::Notification cancelled;
  std::atomic<bool> cancel_seen = false;
  std::atomic<int> calls = 0;
  on.agent->StartInput(
      [&](int, int64_t, replay::SampledBatch* out) -> absl::Status {
        if (calls++ == 0) return on.sampler->Next(out);
        // The next call's batch: replay's rate limiter holds it back.
        cancel_seen = cancelled.WaitForNotificationWithTimeout(absl::Seconds(20));
        return absl::CancelledError("sampler cancelled");
      },
      [&] { cancelled.Notify(); });
  ASSERT_TRUE(on.agent->Train(1).ok());
  // The next call's batch is being sampled (blocked) before the input stops.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (calls.load() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(calls.load(), 2) << "the next call's batch was not sampled between the calls";
  const absl::Status refused = on.agent->Train(1, [&](int, int64_t, replay::SampledBatch* out) {
    return on.sampler->Next(out);
  });
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("StartInput's input runs"));
  const auto start = std::chrono::steady_clock::now();
  on.agent->StopInput();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(cancel_seen.load()) << "StopInput did not cancel the blocked sample";
  const absl::Status no_input = on.agent->Train(1);
  EXPECT_TRUE(absl::IsFailedPrecondition(no_input)) << no_input;
  EXPECT_THAT(no_input.message(), HasSubstr("call StartInput first"));
  EXPECT_EQ(on.agent->updates(), 1);
}

// On PJRT the gather is inside the step's one compiled program: the
// updates from gathered frames are the CPU's within float32 rounding (XLA's
// fused kernels against Eigen's) and those of host batches on PJRT, the
// whole state compared (networks, targets, Adam's moments, counters).
TEST(D4pgDeviceFramesTest, UpdatesFromGatheredFramesInACompiledPjrtStepMatchTheCpu) {
  if (PjrtPlugin().empty()) GTEST_SKIP() << "no PJRT plugin at TROUPE_PJRT_PLUGIN";
  const ReplayRunResult start = TrainOnReplay({.device_frames = false, .updates = 0});
  const ReplayRunResult cpu = TrainOnReplay({.device_frames = false, .updates = 4});
  const ReplayRunResult gathered = TrainOnReplay({.device = config::EngineConfig::PJRT, .updates = 4});
  const ReplayRunResult host = TrainOnReplay({.device = config::EngineConfig::PJRT, .device_frames = false, .updates = 4});
  TROUPE_EXPECT_SAME_STATE(start.state, cpu.state, gathered.state, .tolerance = 5e-5);  // 7.7e-6 seen
  TROUPE_EXPECT_SAME_STATE(start.state, host.state, gathered.state, .tolerance = 5e-5);
  EXPECT_EQ(gathered.stats.resolved, 4 * 8 * kFramesPerItem);
}

TEST(D4pgDeviceFramesTest, UpdatesFromGatheredFramesOnTheStrictDeviceEqualTheCpusBitForBit) {
  EXPECT_EQ(TrainOnReplay({.device = config::EngineConfig::CPU_STRICT, .updates = 3}).checksum,
            TrainOnReplay({.device_frames = false, .updates = 3}).checksum);
}

// --- The table's size for a learner -------------------------------------------------------

// The learner's config of a walker pixel run: 84x84 frames stacked 3,
// batch 256, replay capped at 20,000 transitions, the default budget.
config::ExperimentConfig SmallReplayConfig() {
  config::ExperimentConfig c;
  c.mutable_learner()->set_batch_size(256);
  c.mutable_learner()->set_replay_size(20000);
  return c;
}

// A small replay's table is about one frame per transition (the frames an
// actor's stacked stream keeps in replay), with room for episode edges and
// the batches in flight: not 2 stacks per transition, nor the 2 GiB budget.
TEST(DeviceFrameSlotsTest, ASmallReplayStartsNearOneFramePerTransitionNotTwoStacks) {
  const ObservationSpec spec{.frames = 3, .height = 84, .width = 84};
  const config::ExperimentConfig c = SmallReplayConfig();
  const int64_t frame_bytes = 84 * 84 * 3, budget = (int64_t{2048} << 20) / frame_bytes;
  for (const int replicas : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << replicas << " replicas");
    const DeviceFrameSizing sizing = DeviceFrameSlots(c, spec, replicas);
    const int64_t in_flight = 2 * (256 / replicas) * 2 * 3;  // the batch stepping and the one made ahead
    EXPECT_EQ(sizing.slots, 20000 + 20000 / 8 + in_flight);
    EXPECT_LT(sizing.slots, 2 * 3 * 20000 / 4) << "not every stack's frames distinct";
    EXPECT_LT(sizing.slots * frame_bytes, int64_t{600} << 20) << "not the 2 GiB budget";
    EXPECT_FALSE(sizing.budget_bound);
    EXPECT_EQ(sizing.max_slots, budget) << "it may grow to the budget (6 frames a transition would exceed it)";
    EXPECT_THAT(sizing.description, HasSubstr(absl::StrCat(sizing.slots, " slots of 84x84 frames")));
    EXPECT_THAT(sizing.description, HasSubstr("bounded by replay (20000 transitions"));
    EXPECT_THAT(sizing.description, HasSubstr(absl::StrCat("up to ", budget, " slots (2048 MiB, the budget")));
  }
  // The agent's table is that size (the learner's, made by Create).
  auto replicator = engine::MakeReplicator(c.learner().engine());
  ASSERT_TRUE(replicator.ok());
  auto agent = D4pgAgent::Create(c, spec, 1, replicator->get());
  ASSERT_TRUE(agent.ok()) << agent.status();
  EXPECT_EQ((*agent)->frame_stats().slots, DeviceFrameSlots(c, spec, 1).slots);
}

// The budget (learner.device_frame_mib) caps the start and the growth: the
// default replay of a million transitions gets the budget, a cache.
TEST(DeviceFrameSlotsTest, TheBudgetCapsTheTable) {
  const ObservationSpec spec{.frames = 3, .height = 84, .width = 84};
  config::ExperimentConfig c = SmallReplayConfig();
  c.mutable_learner()->set_replay_size(1000000);
  const int64_t budget = (int64_t{2048} << 20) / (84 * 84 * 3);
  DeviceFrameSizing sizing = DeviceFrameSlots(c, spec, 1);
  EXPECT_EQ(sizing.slots, budget);
  EXPECT_EQ(sizing.max_slots, budget);
  EXPECT_TRUE(sizing.budget_bound);
  EXPECT_THAT(sizing.description, HasSubstr("bounded by the budget learner.device_frame_mib 2048"));
  EXPECT_THAT(sizing.description, HasSubstr("least recently sampled make room"));
  // A small replay under a smaller budget: capped at start too.
  c.mutable_learner()->set_replay_size(20000);
  c.mutable_learner()->set_device_frame_mib(256);
  sizing = DeviceFrameSlots(c, spec, 1);
  EXPECT_EQ(sizing.slots, (int64_t{256} << 20) / (84 * 84 * 3));
  EXPECT_EQ(sizing.max_slots, sizing.slots);
  EXPECT_TRUE(sizing.budget_bound);
  // No table without device frames or pixels.
  c.mutable_learner()->set_device_frames(false);
  EXPECT_EQ(DeviceFrameSlots(c, spec, 1).slots, 0);
  EXPECT_EQ(DeviceFrameSlots(SmallReplayConfig(), ObservationSpec{.state_size = 5}, 1).slots, 0);
}

// An actor's stream into the D4PG transitions table, as
// actors::TransitionWriter writes it: `envs` envs stepped in turn, each
// episode of `episode` steps appending one frame per observation (its first
// once, repeated by the first stacks), n-step transitions (observation
// stack ending at frame t, next observation stack at t + n, clipped to the
// episode; the last ones flushed at its end).
class ActorStream {
 public:
  ActorStream(replay::Writer* writer, int envs, int episode, int n_step)
      : writer_(writer), envs_(envs), episode_(episode), n_step_(n_step) {}

  // One step of the next env: its new frame and the transitions that completed.
  absl::Status Step() {
    Env& env = envs_[next_env_];
    next_env_ = (next_env_ + 1) % static_cast<int>(envs_.size());
    if (env.keys.empty()) RETURN_IF_ERROR(Append(env));  // the episode's first observation
    RETURN_IF_ERROR(Append(env));
    const int t = static_cast<int>(env.keys.size()) - 1;  // the newest frame's step
    if (t >= n_step_) RETURN_IF_ERROR(Insert(env, t - n_step_, t));
    if (t == episode_) {
      for (int s = std::max(0, t - n_step_ + 1); s < t; ++s) RETURN_IF_ERROR(Insert(env, s, t));
      env.keys.clear();
    }
    return absl::OkStatus();
  }
  int64_t inserted() const { return inserted_; }

 private:
  struct Env {
    std::vector<uint64_t> keys;  // this episode's frames
  };
  absl::Status Append(Env& env) {
    ASSIGN_OR_RETURN(const uint64_t key, writer_->AppendFrame(replay::testing::SceneFrame(frame_++).data(), 64, 64, 3));
    env.keys.push_back(key);
    return absl::OkStatus();
  }
  replay::FieldValue Stack(const Env& env, int t) const {
    return replay::FieldValue::Frames(
        {env.keys[std::max(0, t - 2)], env.keys[std::max(0, t - 1)], env.keys[static_cast<size_t>(t)]});
  }
  absl::Status Insert(const Env& env, int t, int next) {
    const float action = 0.1f, reward = 1.0f, discount = 0.9f;
    ++inserted_;
    return writer_->Insert(kTransitionTable, 1.0,
                           {Stack(env, t), replay::FieldValue::Dense(proto::DTYPE_FLOAT32, {1}, &action),
                            replay::FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &reward),
                            replay::FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &discount), Stack(env, next)});
  }

  replay::Writer* writer_;
  std::vector<Env> envs_;
  int episode_, n_step_;
  int next_env_ = 0;
  int frame_ = 0;
  int64_t inserted_ = 0;
};

// A long run through a replay at capacity (ten times its transitions
// evicted), sampled as the learner samples it (two batches alive: the one
// stepping and the one made ahead): the table the learner makes never runs
// out of slots (nothing grown, nothing replaced), each frame goes up once,
// and what replay's frame store holds stays within it.
TEST(DeviceFrameSlotsTest, AReplayAtCapacityNeverOutgrowsTheTableItsSizeStartsAt) {
  config::ExperimentConfig c = PixelAgentConfig();
  c.mutable_learner()->set_replay_size(400);
  const ObservationSpec spec{.frames = 3, .height = 64, .width = 64};
  const DeviceFrameSizing sizing = DeviceFrameSlots(c, spec, 1);
  EXPECT_EQ(sizing.slots, 400 + 50 + 2 * 8 * 2 * 3);
  config::ReplayConfig rc;
  *rc.add_tables() = TransitionTable(spec, 1, c);
  auto made = replay::Replay::Create(rc);
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<replay::Replay> replay = *std::move(made);
  auto client = replay::NewLocalClient(replay.get());
  auto writer = client->NewWriter();
  ASSERT_TRUE(writer.ok());
  // Two envs at once, episodes of 100 steps (dm_control's 1000 at
  // action_repeat 10), n_step 3.
  ActorStream stream(writer->get(), /*envs=*/2, /*episode=*/100, /*n_step=*/3);
  while (stream.inserted() < 400) ASSERT_TRUE(stream.Step().ok());
  ASSERT_TRUE((*writer)->Flush().ok());
  auto sampler = client->NewSampler({.table = kTransitionTable, .batch_size = 8, .frame_references = true});
  ASSERT_TRUE(sampler.ok());
  nn::CpuBackend cpu(1);
  DeviceFrameTable table(&cpu, sizing.slots, sizing.frame_bytes, sizing.max_slots);
  replay::FrameDecoder decoder;
  replay::SampledBatch batches[2];
  std::vector<int32_t> slots;
  std::set<uint64_t> seen;
  int64_t most_resident = 0, most_stored = 0;
  for (int b = 0; b < 2000; ++b) {
    for (int step = 0; step < 2; ++step) ASSERT_TRUE(stream.Step().ok());
    ASSERT_TRUE((*writer)->Flush().ok());
    replay::SampledBatch& batch = batches[b % 2];  // batches[(b + 1) % 2] still alive
    ASSERT_TRUE((*sampler)->Next(&batch).ok());
    for (const replay::FramePtr& f : batch.frames) seen.insert(f->id());
    ASSERT_TRUE(table.Resolve(batch.frames, decoder, &slots).ok());
    most_resident = std::max(most_resident, table.resident());
    most_stored = std::max(most_stored, replay->Info().frames());
  }
  EXPECT_GT(stream.inserted(), 10 * 400);
  const DeviceFrameStats stats = table.stats();
  EXPECT_EQ(stats.grown, 0) << "the frames replay held outgrew the start size";
  EXPECT_EQ(stats.replaced, 0);
  EXPECT_EQ(stats.slots, sizing.slots);
  EXPECT_EQ(stats.frames_uploaded, static_cast<int64_t>(seen.size())) << "each frame once";
  EXPECT_GT(most_resident, 400) << "the table held about replay's frames (the test reached capacity)";
  EXPECT_LE(most_stored, sizing.slots) << "replay's frame store held more frames than the table has slots";
}

}  // namespace
}  // namespace troupe::agents
