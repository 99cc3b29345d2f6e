#include "actors/transition_writer.h"

#include <cmath>

#include "common/allocation_counter.h"
#include "gtest/gtest.h"
#include "replay/client.h"
#include "replay/replay.h"

namespace troupe::actors {
namespace {

// The observations of these tests: 2 floats, or stacks of 4x4 RGB frames.
agents::ObservationSpec Spec(bool pixels, int frames = 3) {
  return pixels ? agents::ObservationSpec{.frames = frames, .height = 4, .width = 4}
                : agents::ObservationSpec{.state_size = 2};
}

// A FIFO transition table (agents/transition.h) with 1 action, embedded.
std::unique_ptr<replay::Replay> MakeReplay(bool pixels, int frames = 3) {
  config::ReplayConfig config;
  auto* table = config.add_tables();
  table->set_name(agents::kTransitionTable);
  table->set_selector(config::ReplayTableConfig::fifo);
  table->set_max_size(1000);
  agents::AddTransitionFields(Spec(pixels, frames), /*action_size=*/1, table);
  auto r = replay::Replay::Create(config);
  EXPECT_TRUE(r.ok()) << r.status();
  return std::move(r).value();
}

// The layout of those transitions, n-step `n_step` with `discount`.
TransitionLayout Layout(bool pixels, int n_step, float discount = 0.99f) {
  auto signature = agents::TransitionSignature(Spec(pixels), /*action_size=*/1);
  EXPECT_TRUE(signature.ok()) << signature.status();
  return TransitionLayout{.signature = *std::move(signature), .n_step = n_step, .discount = discount};
}

// Every item in the table, in insertion order.
replay::SampledBatch Drain(replay::ReplayClient& client, int count) {
  auto sampler = client.NewSampler({.table = agents::kTransitionTable, .batch_size = count});
  EXPECT_TRUE(sampler.ok()) << sampler.status();
  replay::SampledBatch batch;
  auto status = (*sampler)->Next(&batch);
  EXPECT_TRUE(status.ok()) << status;
  return batch;
}

TEST(TransitionWriterTest, NStepReturnsAndFlushAtEpisodeEnd) {
  auto replay = MakeReplay(/*pixels=*/false);
  auto client = replay::NewLocalClient(replay.get());
  auto writer = client->NewWriter();
  ASSERT_TRUE(writer.ok());
  const TransitionLayout layout = Layout(/*pixels=*/false, /*n_step=*/3, /*discount=*/0.5f);
  TransitionWriter transitions(writer->get(), /*num_envs=*/1, layout);
  // Observations s_t = (t, -t); rewards r_t = t + 1 for t = 0..4; the episode ends after 5 steps.
  float s[2] = {0, 0};
  ASSERT_TRUE(transitions.Start(0, s, nullptr).ok());
  for (int t = 0; t < 5; ++t) {
    const float action = 10.0f + t;
    s[0] = float(t + 1);
    s[1] = -float(t + 1);
    ASSERT_TRUE(transitions.Step(0, &action, /*reward=*/float(t + 1), /*discount=*/1.0f, /*last=*/t == 4, s, nullptr).ok());
  }
  ASSERT_TRUE((*writer)->Flush().ok());
  ASSERT_EQ(transitions.transitions_inserted(), 5);
  replay::SampledBatch batch = Drain(*client, 5);
  const float* obs = batch.fields[0].as<float>();
  const float* action = batch.fields[1].as<float>();
  const float* reward = batch.fields[2].as<float>();
  const float* discount = batch.fields[3].as<float>();
  const float* next = batch.fields[4].as<float>();
  // t=0,1,2: full 3-step windows; t=3,4: flushed at the end with 2 and 1 steps.
  const float expected_reward[5] = {1 + 0.5f * 2 + 0.25f * 3, 2 + 0.5f * 3 + 0.25f * 4, 3 + 0.5f * 4 + 0.25f * 5,
                                    4 + 0.5f * 5, 5};
  const float expected_discount[5] = {0.125f, 0.125f, 0.125f, 0.25f, 0.5f};
  const float expected_next[5] = {3, 4, 5, 5, 5};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(obs[2 * i], float(i)) << i;
    EXPECT_EQ(action[i], 10.0f + i) << i;
    EXPECT_FLOAT_EQ(reward[i], expected_reward[i]) << i;
    EXPECT_FLOAT_EQ(discount[i], expected_discount[i]) << i;
    EXPECT_EQ(next[2 * i], expected_next[i]) << i;
    EXPECT_EQ(next[2 * i + 1], -expected_next[i]) << i;
  }
}

// A writer whose link can be cut: while cut, each request is kept and its
// send fails UNAVAILABLE; Resume delivers what was kept, in order (as a
// resumable gRPC writer does).
class CuttableWriter : public replay::Writer {
 public:
  explicit CuttableWriter(replay::Replay* replay) : Writer({.max_items_per_request = 1}), session_(replay) {}
  bool cut = false;
  absl::Status Close() override { return Flush(); }
  absl::Status Resume() override {
    cut = false;
    for (proto::InsertRequest& request : kept_) {
      if (absl::Status s = session_.Prepare(&request); !s.ok()) return s;
      if (absl::Status s = session_.InsertPending(absl::InfiniteDuration()); !s.ok()) return s;
    }
    kept_.clear();
    return absl::OkStatus();
  }

 protected:
  absl::Status Send(proto::InsertRequest* request, int /*items*/, int64_t /*bytes*/) override {
    kept_.emplace_back();
    kept_.back().Swap(request);
    if (cut) return absl::UnavailableError("link cut");
    return Resume();
  }

 private:
  replay::InsertSession session_;
  std::vector<proto::InsertRequest> kept_;
};

// Sends that fail mid-episode (replay unreachable) do not cut it: every
// step is still recorded, the episode's end flushes its pending steps, the
// error is returned, and once the writer resumes replay has the whole
// episode, each transition once.
TEST(TransitionWriterTest, AFailedSendDoesNotCutTheEpisode) {
  auto replay = MakeReplay(/*pixels=*/false);
  auto client = replay::NewLocalClient(replay.get());
  CuttableWriter writer(replay.get());
  const TransitionLayout layout = Layout(/*pixels=*/false, /*n_step=*/3, /*discount=*/0.5f);
  TransitionWriter transitions(&writer, /*num_envs=*/1, layout);
  float s[2] = {0, 0};
  ASSERT_TRUE(transitions.Start(0, s, nullptr).ok());
  for (int t = 0; t < 5; ++t) {
    const float action = 10.0f + t;
    s[0] = float(t + 1);
    s[1] = -float(t + 1);
    writer.cut = t >= 3;  // the link goes after the first transition (complete at t = 2) is in
    const absl::Status status = transitions.Step(0, &action, float(t + 1), 1.0f, /*last=*/t == 4, s, nullptr);
    if (t < 3) {
      ASSERT_TRUE(status.ok()) << status;
    } else {
      EXPECT_TRUE(absl::IsUnavailable(status)) << t << ": " << status;
    }
  }
  EXPECT_EQ(transitions.transitions_inserted(), 5);
  EXPECT_EQ(writer.items_queued(), 5);
  EXPECT_EQ(replay->Info().tables(0).size(), 1);
  // The episode ended whole: the next one starts.
  ASSERT_TRUE(transitions.Start(0, s, nullptr).ok());
  ASSERT_TRUE(writer.Resume().ok());
  ASSERT_EQ(replay->Info().tables(0).size(), 5);
  replay::SampledBatch batch = Drain(*client, 5);
  const float* obs = batch.fields[0].as<float>();
  const float* reward = batch.fields[2].as<float>();
  const float expected_reward[5] = {1 + 0.5f * 2 + 0.25f * 3, 2 + 0.5f * 3 + 0.25f * 4, 3 + 0.5f * 4 + 0.25f * 5,
                                    4 + 0.5f * 5, 5};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(obs[2 * i], float(i)) << i;
    EXPECT_FLOAT_EQ(reward[i], expected_reward[i]) << i;
  }
}

TEST(TransitionWriterTest, EnvsInterleaveWithoutMixing) {
  auto replay = MakeReplay(/*pixels=*/false);
  auto client = replay::NewLocalClient(replay.get());
  auto writer = client->NewWriter();
  const TransitionLayout layout = Layout(/*pixels=*/false, /*n_step=*/1, /*discount=*/0.9f);
  TransitionWriter transitions(writer->get(), /*num_envs=*/2, layout);
  float a[2] = {100, 0}, b[2] = {200, 0};
  ASSERT_TRUE(transitions.Start(0, a, nullptr).ok());
  ASSERT_TRUE(transitions.Start(1, b, nullptr).ok());
  const float action = 0;
  float a1[2] = {101, 0}, b1[2] = {201, 0};
  ASSERT_TRUE(transitions.Step(1, &action, 0.2f, 1.0f, false, b1, nullptr).ok());
  ASSERT_TRUE(transitions.Step(0, &action, 0.1f, 1.0f, false, a1, nullptr).ok());
  ASSERT_TRUE((*writer)->Flush().ok());
  replay::SampledBatch batch = Drain(*client, 2);
  EXPECT_EQ(batch.fields[0].as<float>()[0], 200);
  EXPECT_EQ(batch.fields[4].as<float>()[0], 201);
  EXPECT_EQ(batch.fields[0].as<float>()[2], 100);
  EXPECT_EQ(batch.fields[4].as<float>()[2], 101);
  EXPECT_FLOAT_EQ(batch.fields[3].as<float>()[0], 0.9f);
}

TEST(TransitionWriterTest, PixelStacksAreRebuiltFromFramesStoredOnce) {
  auto replay = MakeReplay(/*pixels=*/true, /*frames=*/3);
  auto client = replay::NewLocalClient(replay.get());
  auto writer = client->NewWriter();
  const TransitionLayout layout = Layout(/*pixels=*/true, /*n_step=*/1, /*discount=*/0.9f);
  TransitionWriter transitions(writer->get(), /*num_envs=*/1, layout);
  // Frame t is filled with the value 10 * (t + 1).
  auto frame = [](int t) { return std::vector<uint8_t>(4 * 4 * 3, uint8_t(10 * (t + 1))); };
  ASSERT_TRUE(transitions.Start(0, nullptr, frame(0).data()).ok());
  const float action = 0;
  for (int t = 1; t <= 3; ++t) {
    ASSERT_TRUE(transitions.Step(0, &action, 0, 1, false, nullptr, frame(t).data()).ok());
  }
  ASSERT_TRUE((*writer)->Flush().ok());
  replay::SampledBatch batch = Drain(*client, 3);
  const replay::SampledField& obs = batch.fields[0];
  ASSERT_EQ(obs.shape, (std::vector<int64_t>{3, 3, 4, 4, 3}));
  const size_t frame_bytes = 4 * 4 * 3;
  auto value = [&](const replay::SampledField& f, int item, int k) { return f.data[(item * 3 + k) * frame_bytes]; };
  // Item 0: obs = [f0, f0, f0], next = [f0, f0, f1]; item 2: obs = [f0, f1, f2], next = [f1, f2, f3].
  EXPECT_EQ(value(obs, 0, 0), 10);
  EXPECT_EQ(value(obs, 0, 2), 10);
  EXPECT_EQ(value(batch.fields[4], 0, 2), 20);
  EXPECT_EQ(value(obs, 2, 0), 10);
  EXPECT_EQ(value(obs, 2, 1), 20);
  EXPECT_EQ(value(obs, 2, 2), 30);
  EXPECT_EQ(value(batch.fields[4], 2, 0), 20);
  EXPECT_EQ(value(batch.fields[4], 2, 2), 40);
}

TEST(TransitionWriterTest, StepBeforeStartIsAnError) {
  auto replay = MakeReplay(/*pixels=*/false);
  auto client = replay::NewLocalClient(replay.get());
  auto writer = client->NewWriter();
  TransitionWriter transitions(writer->get(), /*num_envs=*/1,
                               Layout(/*pixels=*/false, /*n_step=*/2));
  const float action = 0, s[2] = {0, 0};
  EXPECT_EQ(transitions.Step(0, &action, 0, 1, false, s, nullptr).code(), absl::StatusCode::kFailedPrecondition);
}

// A writer that sends nowhere, taking each request as the resumable gRPC
// writer does (swapped out of the writer and kept) and handing the kept ones
// back (Recycle) at every ack, as that writer does when replay acknowledges.
class KeepingWriter : public replay::Writer {
 public:
  KeepingWriter() : Writer({.max_items_per_request = 4}) {}
  absl::Status Close() override { return Flush(); }
  int64_t requests = 0;

 protected:
  absl::Status Send(proto::InsertRequest* request, int /*items*/, int64_t /*bytes*/) override {
    ++requests;
    kept_.emplace_back();
    kept_.back().Swap(request);
    if (kept_.back().ack()) {
      for (proto::InsertRequest& r : kept_) Recycle(&r);
      kept_.clear();
    }
    return absl::OkStatus();
  }

 private:
  std::vector<proto::InsertRequest> kept_;
};

// Once running, a step (its frame appended and compressed, the transitions
// it completes inserted, requests sent and acknowledged) allocates nothing:
// counted over many steps of 2 envs, episodes ending and starting, after
// the buffers grew over a first stretch of the same. (Sends over gRPC
// allocate in gRPC, per request.)
TEST(TransitionWriterTest, StepsAllocateNothingOnceRunning) {
  for (const bool pixels : {false, true}) {
    SCOPED_TRACE(pixels ? "pixels" : "state");
    KeepingWriter writer;
    TransitionWriter transitions(&writer, /*num_envs=*/2, Layout(pixels, /*n_step=*/3));
    // Frames that change a little from step to step (some coded against a
    // key frame, some key frames), states and actions that change.
    std::vector<uint8_t> frame(4 * 4 * 3);
    float state[2] = {0, 0}, action = 0;
    uint32_t noise = 1;
    const auto observe = [&](int t) {
      noise = noise * 1664525u + 1013904223u;
      frame[noise % frame.size()] = static_cast<uint8_t>(noise >> 24);
      state[0] = static_cast<float>(t);
      action = static_cast<float>(noise % 7);
    };
    const auto run = [&](int from, int steps) {
      for (int t = from; t < from + steps; ++t) {
        for (int env = 0; env < 2; ++env) {
          observe(t);
          const uint8_t* f = pixels ? frame.data() : nullptr;
          if (t % 50 == 0) {
            ASSERT_TRUE(transitions.Start(env, state, f).ok());
            continue;
          }
          ASSERT_TRUE(transitions.Step(env, &action, 1.0f, 1.0f, /*last=*/t % 50 == 49, state, f).ok());
        }
        if (t % 16 == 15) {
          ASSERT_TRUE(writer.Flush().ok());  // as the actor's kFlushEvery
        }
      }
    };
    // (Request buffers circulate between the writer and what it keeps until
    // an ack: each reaches its largest size within a few hundred steps.)
    run(0, 1200);
    const int64_t inserted = transitions.transitions_inserted(), requests = writer.requests;
    AllocationCounter counter;
    run(1200, 1000);
    EXPECT_EQ(counter.Stop(), 0);
    // What was counted did insert and send.
    EXPECT_GT(transitions.transitions_inserted() - inserted, 1900);
    EXPECT_GT(writer.requests - requests, 400);
  }
}

}  // namespace
}  // namespace troupe::actors
