#include "actors/trajectory_writer.h"

#include "absl/strings/match.h"
#include "actors/item_writer.h"
#include "agents/trajectory.h"
#include "gtest/gtest.h"
#include "replay/client.h"
#include "replay/replay.h"

namespace troupe::actors {
namespace {

// 2-float states, 1 action, trajectories of 3 steps, embedded in a queue.
constexpr int kSteps = 3;
const agents::ObservationSpec kSpec{.state_size = 2};

// A queue of trajectories of `steps` steps of observations `spec`, 1
// action, embedded.
std::unique_ptr<replay::Replay> MakeQueue(const agents::ObservationSpec& spec = kSpec, int steps = kSteps) {
  config::ReplayConfig config;
  auto* table = config.add_tables();
  table->set_name(agents::kTrajectoryTable);
  table->set_selector(config::ReplayTableConfig::fifo);
  table->set_max_size(100);
  agents::AddTrajectoryFields(spec, /*action_size=*/1, steps, table);
  auto r = replay::Replay::Create(config);
  EXPECT_TRUE(r.ok()) << r.status();
  return std::move(r).value();
}

// What an actor writes is what the learner reads, bit for bit: two
// trajectories of one env across an episode that ends at a time limit
// after 4 steps (its reward gains the discounted bootstrap, its discount is
// 0, and the next observation is the new episode's first), versions the
// oldest step's.
TEST(TrajectoryWriterTest, TrajectoriesRunAcrossEpisodeEndsWithTheValueBootstrap) {
  auto queue = MakeQueue();
  auto client = replay::NewLocalClient(queue.get());
  auto writer = client->NewWriter();
  ASSERT_TRUE(writer.ok());
  auto signature = agents::TrajectorySignature(kSpec, 1, kSteps);
  ASSERT_TRUE(signature.ok());
  TrajectoryWriter trajectories(writer->get(), /*num_envs=*/1, *signature, /*discount=*/0.5f);
  // Episode 1: states (t, -t) for t = 0..4; episode 2 starts at (100, -100).
  float s[2] = {0, 0};
  ASSERT_TRUE(trajectories.Start(0, s, nullptr).ok());
  for (int t = 0; t < 6; ++t) {
    const bool second = t >= 4;
    const float action = 10.0f + t;
    if (t == 4) {
      s[0] = 100, s[1] = -100;
      ASSERT_TRUE(trajectories.Start(0, s, nullptr).ok());
    }
    s[0] = second ? 100.0f + (t - 3) : float(t + 1);
    s[1] = -s[0];
    const ActorStep step{.action = &action,
                         .reward = float(t + 1),
                         .discount = 1.0f,
                         .last = t == 3,
                         .state = s,
                         .log_prob = -0.25f * t,
                         .policy_version = 7 + t / 2,
                         .bootstrap_value = t == 3 ? 40.0f : 0.0f};
    ASSERT_TRUE(trajectories.Step(0, step).ok());
  }
  ASSERT_TRUE((*writer)->Flush().ok());
  ASSERT_EQ(trajectories.items_inserted(), 2);
  auto sampler = client->NewSampler({.table = agents::kTrajectoryTable, .batch_size = 2});
  ASSERT_TRUE(sampler.ok());
  replay::SampledBatch batch;
  ASSERT_TRUE((*sampler)->Next(&batch).ok());
  const float* obs = batch.fields[agents::kTrajectoryObservation].as<float>();
  const float* action = batch.fields[agents::kTrajectoryAction].as<float>();
  const float* reward = batch.fields[agents::kTrajectoryReward].as<float>();
  const float* discount = batch.fields[agents::kTrajectoryDiscount].as<float>();
  const float* log_prob = batch.fields[agents::kTrajectoryLogProb].as<float>();
  const int64_t* version = batch.fields[agents::kTrajectoryVersion].as<int64_t>();
  // Observations: x_0..x_3 of each; the second begins where the first ended
  // (x_3 = (3, -3)), then the new episode's (100), (101), (102).
  const float want_obs[2][kSteps + 1] = {{0, 1, 2, 3}, {3, 100, 101, 102}};
  const float want_reward[2][kSteps] = {{1, 2, 3}, {4 + 0.5f * 40, 5, 6}};
  const float want_discount[2][kSteps] = {{0.5f, 0.5f, 0.5f}, {0, 0.5f, 0.5f}};
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t <= kSteps; ++t) {
      EXPECT_EQ(obs[(b * (kSteps + 1) + t) * 2], want_obs[b][t]) << b << "," << t;
      EXPECT_EQ(obs[(b * (kSteps + 1) + t) * 2 + 1], -want_obs[b][t]) << b << "," << t;
    }
    for (int t = 0; t < kSteps; ++t) {
      const int step = b * kSteps + t;
      EXPECT_EQ(action[step], 10.0f + step);
      EXPECT_EQ(reward[step], want_reward[b][t]) << b << "," << t;
      EXPECT_EQ(discount[step], want_discount[b][t]) << b << "," << t;
      EXPECT_EQ(log_prob[step], -0.25f * step);
    }
  }
  EXPECT_EQ(version[0], 7);  // steps 0..2: versions 7, 7, 8
  EXPECT_EQ(version[1], 8);  // steps 3..5: 8, 9, 9
}

TEST(TrajectoryWriterTest, ATrueTerminalGetsNoBootstrap) {
  auto queue = MakeQueue();
  auto client = replay::NewLocalClient(queue.get());
  auto writer = client->NewWriter();
  ASSERT_TRUE(writer.ok());
  auto signature = agents::TrajectorySignature(kSpec, 1, kSteps);
  TrajectoryWriter trajectories(writer->get(), 1, *signature, 0.5f);
  float s[2] = {1, 1};
  const float action = 0;
  ASSERT_TRUE(trajectories.Start(0, s, nullptr).ok());
  for (int t = 0; t < kSteps; ++t) {
    ActorStep step{.action = &action, .reward = 1, .discount = t == 0 ? 0.0f : 1.0f, .last = t == 0, .state = s,
                   .bootstrap_value = 1000};
    ASSERT_TRUE(trajectories.Step(0, step).ok());
    if (t == 0) {
      ASSERT_TRUE(trajectories.Start(0, s, nullptr).ok());
    }
  }
  // Stepping an env before its episode's Start is refused.
  ActorStep step{.action = &action, .state = s};
  ASSERT_TRUE(trajectories.Step(0, {.action = &action, .last = true, .state = s}).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(trajectories.Step(0, step)));
  ASSERT_TRUE((*writer)->Flush().ok());
  auto sampler = client->NewSampler({.table = agents::kTrajectoryTable, .batch_size = 1});
  replay::SampledBatch batch;
  ASSERT_TRUE((*sampler)->Next(&batch).ok());
  EXPECT_EQ(batch.fields[agents::kTrajectoryReward].as<float>()[0], 1.0f);
  EXPECT_EQ(batch.fields[agents::kTrajectoryDiscount].as<float>()[0], 0.0f);
}

// Pixels: each observation is its stack of k frames, the episode's first
// frame repeated at its start, every frame appended once; across an
// episode's end the next observation is the new episode's first stack.
TEST(TrajectoryWriterTest, PixelTrajectoriesReferenceEachFrameOnce) {
  const agents::ObservationSpec pixels{.frames = 2, .height = 4, .width = 4};
  auto queue = MakeQueue(pixels);
  auto client = replay::NewLocalClient(queue.get());
  auto writer = client->NewWriter();
  ASSERT_TRUE(writer.ok());
  auto signature = agents::TrajectorySignature(pixels, 1, kSteps);
  ASSERT_TRUE(signature.ok()) << signature.status();
  TrajectoryWriter trajectories(writer->get(), 1, *signature, 0.5f);
  // Frame n is all n. Episode 1: frames 0 (start) .. 3, it ends after step
  // 3; episode 2: frame 10 (start), 11, 12.
  auto frame = [](int n) { return std::vector<uint8_t>(4 * 4 * 3, uint8_t(n)); };
  const float action = 0;
  ASSERT_TRUE(trajectories.Start(0, nullptr, frame(0).data()).ok());
  for (int t = 0; t < 6; ++t) {
    if (t == 3) {
      ASSERT_TRUE(trajectories.Start(0, nullptr, frame(10).data()).ok());
    }
    const std::vector<uint8_t> next = frame(t < 3 ? t + 1 : 8 + t);
    ASSERT_TRUE(trajectories.Step(0, {.action = &action, .last = t == 2, .frame = next.data()}).ok());
  }
  ASSERT_TRUE((*writer)->Flush().ok());
  ASSERT_EQ(trajectories.items_inserted(), 2);
  auto sampler = client->NewSampler({.table = agents::kTrajectoryTable, .batch_size = 2});
  ASSERT_TRUE(sampler.ok());
  replay::SampledBatch batch;
  ASSERT_TRUE((*sampler)->Next(&batch).ok());
  const replay::SampledField& observation = batch.fields[agents::kTrajectoryObservation];
  ASSERT_EQ(observation.shape, (std::vector<int64_t>{2, (kSteps + 1) * 2, 4, 4, 3}));
  // Each observation's stack (oldest first), by its frames' value.
  const int want[2][kSteps + 1][2] = {{{0, 0}, {0, 1}, {1, 2}, {2, 3}},        // x_3: episode 1's last
                                      {{10, 10}, {10, 11}, {11, 12}, {12, 13}}};  // x_0: episode 2's first
  for (int b = 0; b < 2; ++b) {
    for (int t = 0; t <= kSteps; ++t) {
      for (int k = 0; k < 2; ++k) {
        const uint8_t* pixel = observation.data.data() + (((b * (kSteps + 1) + t) * 2 + k) * 4 * 4 * 3);
        EXPECT_EQ(int(pixel[0]), want[b][t][k]) << "trajectory " << b << " observation " << t << " frame " << k;
        EXPECT_EQ(int(pixel[4 * 4 * 3 - 1]), want[b][t][k]);
      }
    }
  }
  // 8 frames appended (0-3, 10-13), each stored once however many stacks hold it.
  EXPECT_EQ(queue->Info().frames(), 8);
}


// An actor's envs step together, each appending a frame a step, so one
// trajectory's frames span num_envs x (T + k) appended frames: more than
// the writer's default window of 64 at 4 envs, T = 16 and k = 3. The
// window the actor asks for (ItemFrameWindow) holds every env's
// trajectories; the default refuses the first insert.
TEST(TrajectoryWriterTest, TheActorsFrameWindowHoldsTheTrajectoriesOfEnvsSteppedTogether) {
  constexpr int kEnvs = 4, kUnroll = 16;
  const agents::ObservationSpec pixels{.frames = 3, .height = 4, .width = 4};
  config::ExperimentConfig config;
  config.set_agent(config::ExperimentConfig::APPO);
  config.mutable_appo()->set_unroll_length(kUnroll);
  const int window = ItemFrameWindow(config, pixels, kEnvs);
  EXPECT_EQ(window, kEnvs * (kUnroll + 1 + 3));
  EXPECT_EQ(ItemFrameWindow(config, kSpec, kEnvs), 64) << "state: the default";
  for (const int frame_window : {window, 64}) {
    auto queue = MakeQueue(pixels, kUnroll);
    auto client = replay::NewLocalClient(queue.get());
    auto writer = client->NewWriter({.frame_window = frame_window});
    ASSERT_TRUE(writer.ok());
    auto signature = agents::TrajectorySignature(pixels, 1, kUnroll);
    ASSERT_TRUE(signature.ok()) << signature.status();
    TrajectoryWriter trajectories(writer->get(), kEnvs, *signature, 0.99f);
    std::vector<uint8_t> frame(4 * 4 * 3);
    const float action = 0;
    absl::Status status;
    for (int e = 0; e < kEnvs; ++e) ASSERT_TRUE(trajectories.Start(e, nullptr, frame.data()).ok());
    for (int t = 0; t < 3 * kUnroll && status.ok(); ++t) {
      for (int e = 0; e < kEnvs && status.ok(); ++e) {
        frame[0] = uint8_t(t * kEnvs + e);
        status = trajectories.Step(e, {.action = &action, .reward = 1, .frame = frame.data()});
      }
    }
    if (frame_window == window) {
      ASSERT_TRUE(status.ok()) << status;
      ASSERT_TRUE((*writer)->Flush().ok());
      EXPECT_EQ(trajectories.items_inserted(), 3 * kEnvs);
    } else {
      EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
      EXPECT_TRUE(absl::StrContains(status.message(), "is not among the last 64 appended frames")) << status;
    }
  }
}

}  // namespace
}  // namespace troupe::actors
