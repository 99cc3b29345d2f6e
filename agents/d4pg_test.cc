// D4PG: learning a contextual bandit, K=2 replicas equal to K=1, checkpoints that continue
// exactly, and the pixel path end to end on tiny frames.
#include "agents/d4pg_agent.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "agents/d4pg_networks.h"
#include "agents/d4pg_test_data.h"
#include "common/status_macros.h"
#include "engine/engine_config.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/state_match.h"
#include "engine/nn/strict_cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replay/item.h"
#ifdef TROUPE_HAVE_PJRT
#include "engine/pjrt/pjrt_backend.h"
#endif

namespace troupe::agents {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pointwise;
using ::testing::FloatNear;
using d4pg_test::Bandit;
using d4pg_test::BanditBatch;
using d4pg_test::ClippedConfig;
using d4pg_test::MeshBandit;
using d4pg_test::Floats;
using d4pg_test::TinyConfig;

// K in-process replicas on `device`, one thread each (the agent computes on
// the Replicator's backends).
std::unique_ptr<replicator::Replicator> MakeReplicator(int k, config::EngineConfig engine) {
  engine.set_replicas(k);
  engine.set_threads(k);
  auto r = engine::MakeReplicator(engine);
  TROUPE_CHECK(r.ok());
  return std::move(r).value();
}

std::unique_ptr<replicator::Replicator> MakeReplicator(int k,
                                                       config::EngineConfig::Device device = config::EngineConfig::CPU) {
  config::EngineConfig engine;
  engine.set_device(device);
  return MakeReplicator(k, engine);
}

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "." + std::to_string(::getpid()))).string();
}

// The inference path (what actors run) with the agent's current parameters.
std::unique_ptr<D4pgPolicy> PolicyOf(const D4pgAgent& agent, const config::ExperimentConfig& config) {
  auto policy = D4pgPolicy::Create(config.d4pg(), agent.spec(), agent.action_size());
  TROUPE_CHECK(policy.ok());
  std::vector<float> params;
  agent.PolicyParameters(&params);
  TROUPE_CHECK((*policy)->SetParameters(params).ok());
  return std::move(policy).value();
}

// --- Table and policy ------------------------------------------------------------

TEST(TransitionTableTest, FieldsInSignatureOrderForStateAndPixels) {
  config::ExperimentConfig c = TinyConfig(/*batch=*/8, {16});
  c.mutable_learner()->set_replay_size(5000);
  c.mutable_learner()->set_min_replay_size(100);
  c.mutable_learner()->set_prioritized(true);
  const config::ReplayTableConfig state = TransitionTable({.state_size = 5}, /*action_size=*/2, c);
  EXPECT_EQ(state.name(), "transitions");
  EXPECT_EQ(state.max_size(), 5000);
  EXPECT_EQ(state.selector(), config::ReplayTableConfig::prioritized);
  EXPECT_EQ(state.rate_limiter().min_size_to_sample(), 100);
  ASSERT_EQ(state.fields_size(), 5);
  EXPECT_EQ(state.fields(0).name(), "observation");
  EXPECT_THAT(state.fields(0).shape(), ElementsAre(5));
  EXPECT_EQ(state.fields(1).name(), "action");
  EXPECT_THAT(state.fields(1).shape(), ElementsAre(2));
  EXPECT_EQ(state.fields(2).name(), "reward");
  EXPECT_EQ(state.fields(2).shape_size(), 0);
  EXPECT_EQ(state.fields(3).name(), "discount");
  EXPECT_EQ(state.fields(4).name(), "next_observation");
  EXPECT_TRUE(replay::Signature::FromConfig(state).ok());

  const config::ReplayTableConfig pixels =
      TransitionTable({.frames = 3, .height = 84, .width = 84}, /*action_size=*/1, c);
  EXPECT_EQ(pixels.fields(0).dtype(), config::ReplayFieldConfig::uint8);
  EXPECT_EQ(pixels.fields(0).frames(), 3);
  EXPECT_THAT(pixels.fields(0).shape(), ElementsAre(84, 84, 3));
  EXPECT_EQ(pixels.fields(4).frames(), 3);
  EXPECT_TRUE(replay::Signature::FromConfig(pixels).ok());
}

TEST(D4pgPolicyTest, SetParametersRejectsAWrongSizeNamingBoth) {
  auto policy = D4pgPolicy::Create(TinyConfig(8, {16}).d4pg(), {.state_size = 3}, /*action_size=*/2);
  ASSERT_TRUE(policy.ok()) << policy.status();
  const int64_t n = (*policy)->num_parameters();
  std::vector<float> wrong(n + 1);
  const absl::Status s = (*policy)->SetParameters(wrong);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("got ", n + 1, " floats, expected ", n)));
}

TEST(D4pgPolicyTest, RejectsBadConfigsNamingTheField) {
  config::D4pgConfig d = TinyConfig(8, {16}).d4pg();
  d.set_atoms(1);
  EXPECT_THAT(D4pgPolicy::Create(d, {.state_size = 3}, 1).status().message(), HasSubstr("d4pg.atoms 1"));
  d = TinyConfig(8, {16}).d4pg();
  d.set_v_max(-1.0f);
  EXPECT_THAT(D4pgPolicy::Create(d, {.state_size = 3}, 1).status().message(), HasSubstr("d4pg.v_max"));
  d = TinyConfig(8, {16}).d4pg();
  d.set_actor_pre_tanh_penalty(-1.0f);
  EXPECT_THAT(D4pgPolicy::Create(d, {.state_size = 3}, 1).status().message(),
              HasSubstr("d4pg.actor_pre_tanh_penalty -1: must be >= 0"));
  d = TinyConfig(8, {16}).d4pg();
  d.set_actor_pre_tanh_bound(std::nanf(""));
  EXPECT_THAT(D4pgPolicy::Create(d, {.state_size = 3}, 1).status().message(),
              HasSubstr("d4pg.actor_pre_tanh_bound nan: must be >= 0"));
  EXPECT_THAT(D4pgPolicy::Create(TinyConfig(8, {16}).d4pg(), {.frames = 1, .height = 8, .width = 8}, 1)
                  .status()
                  .message(),
              HasSubstr("too small"));
}

TEST(D4pgAgentTest, RejectsABatchNotDivisibleByTheReplicas) {
  auto replicator = MakeReplicator(2);
  auto agent = D4pgAgent::Create(TinyConfig(/*batch=*/7, {16}), {.state_size = 2}, 1, replicator.get());
  EXPECT_THAT(agent.status().message(), HasSubstr("learner.batch_size 7"));
}

TEST(D4pgAgentTest, ABatchOfTheWrongShapeIsAnErrorNamingTheField) {
  auto replicator = MakeReplicator(1);
  const config::ExperimentConfig c = TinyConfig(/*batch=*/4, {8});
  auto agent = D4pgAgent::Create(c, {.state_size = 2}, /*action_size=*/1, replicator.get());
  ASSERT_TRUE(agent.ok()) << agent.status();
  // A batch made for action_size 3.
  const absl::Status s = (*agent)->Train(1, [&](int, int64_t n, replay::SampledBatch* out) {
    BanditBatch({.state_size = 2}, /*action_size=*/3, c, 0, n, 0, n, out);
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("replica 0: transition batch field 1 (action): got float32[4,3]"));
}

// metrics() may be read from any thread while Train runs: a call's updates
// come in every kMetricsPublishEvery updates (replica 0's epilogues sum
// them without the lock in between), the rest at the call's end.
TEST(D4pgAgentTest, MetricsComeInDuringACallAndWhollyAtItsEnd) {
  const ObservationSpec spec{.state_size = 1};
  const config::ExperimentConfig c = TinyConfig(/*batch=*/8, {8});
  auto replicator = MakeReplicator(1);
  auto agent = D4pgAgent::Create(c, spec, /*action_size=*/1, replicator.get());
  ASSERT_TRUE(agent.ok()) << agent.status();
  constexpr int64_t kUpdates = 2 * D4pgAgent::kMetricsPublishEvery + 5;
  int64_t drawn = 0;
  AgentMetrics during;  // (the input's thread's, read after the call)
  ASSERT_TRUE((*agent)->Train(kUpdates, [&](int, int64_t n, replay::SampledBatch* out) {
    if (drawn == D4pgAgent::kMetricsPublishEvery + 30) during = (*agent)->metrics();
    BanditBatch(spec, 1, c, /*seed=*/drawn++, n, 0, n, out);
    return absl::OkStatus();
  }).ok());
  EXPECT_GE(during.updates, D4pgAgent::kMetricsPublishEvery) << "nothing came in during the call";
  EXPECT_LT(during.updates, D4pgAgent::kMetricsPublishEvery + 30);
  EXPECT_TRUE(std::isfinite(during["critic_loss"]) && during["critic_loss"] > 0);
  const AgentMetrics after = (*agent)->metrics();
  EXPECT_EQ(after.updates, kUpdates) << "the call's last updates did not come in at its end";
  EXPECT_TRUE(std::isfinite(after["critic_loss"]) && after["critic_loss"] > 0);
}

// --- Learning ------------------------------------------------------------------------

TEST(D4pgAgentTest, LearnsAContextualBandit) {
  // One-step problem: the best action equals the observation.
  const ObservationSpec spec{.state_size = 1};
  config::ExperimentConfig c = TinyConfig(/*batch=*/64, {64, 64});
  c.mutable_d4pg()->set_target_tau(0.05f);
  auto replicator = MakeReplicator(1);
  auto agent = D4pgAgent::Create(c, spec, /*action_size=*/1, replicator.get());
  ASSERT_TRUE(agent.ok()) << agent.status();
  double first_loss = 0, last_loss = 0;
  constexpr int kUpdates = 600;
  uint64_t draw = 0;
  for (int u = 0; u < kUpdates; u += 50) {
    ASSERT_TRUE((*agent)->Train(50, [&](int replica, int64_t n, replay::SampledBatch* out) {
      BanditBatch(spec, 1, c, /*seed=*/draw++, n, 0, n, out);
      return absl::OkStatus();
    }).ok());
    const AgentMetrics m = (*agent)->metrics();
    EXPECT_TRUE(std::isfinite(m["critic_loss"]) && std::isfinite(m["actor_loss"]));
    if (u == 0) first_loss = m["critic_loss"];
    last_loss = m["critic_loss"];
  }
  EXPECT_EQ((*agent)->metrics().updates, kUpdates);
  EXPECT_LT(last_loss, first_loss * 0.9) << "critic loss did not fall";

  // The policy (through the inference path) tracks the observation.
  const std::unique_ptr<D4pgPolicy> policy = PolicyOf(**agent, c);
  std::vector<float> obs, actions(17);
  for (int i = 0; i < 17; ++i) obs.push_back(-0.8f + 0.1f * i);
  ASSERT_TRUE(policy->Act(obs.data(), nullptr, 17, actions.data()).ok());
  for (int i = 0; i < 17; ++i) EXPECT_NEAR(actions[i], obs[i], 0.2) << "obs " << obs[i];
}

// Prioritized replay's importance weights scale each item's loss: an update
// on rows (x0, x1, x2, x3) weighted (1, 0, 0, 0) moves the critic (its
// values, targets and moments) as one on four copies of x0 weighted 1/4
// each does, and unlike one on the first batch with the weights it came with.
TEST(D4pgAgentTest, ImportanceWeightsScaleEachItemsLoss) {
  const ObservationSpec spec{.state_size = 2};
  config::ExperimentConfig c = TinyConfig(/*batch=*/4, {16});
  c.mutable_learner()->set_prioritized(true);
  replay::SampledBatch rows;
  BanditBatch(spec, /*action_size=*/1, c, /*seed=*/5, 4, 0, 4, &rows);
  // The critic's part of an agent's state after one update on `batch`.
  const auto critic_after = [&](const replay::SampledBatch& batch) {
    auto replicator = MakeReplicator(1);
    auto agent = D4pgAgent::Create(c, spec, /*action_size=*/1, replicator.get());
    TROUPE_CHECK(agent.ok());
    TROUPE_CHECK((*agent)->Train(1, [&](int, int64_t, replay::SampledBatch* out) {
      *out = batch;
      return absl::OkStatus();
    }).ok());
    std::vector<float> critic;
    for (const nn::CheckpointTensor& t : (*agent)->CheckpointState()) {
      const std::string name = t.name.substr(std::strlen(nn::kParameterEntryPrefix));
      if (name.starts_with("critic") || name.starts_with("target_critic")) {
        critic.insert(critic.end(), t.values.begin(), t.values.end());
      }
    }
    return critic;
  };
  replay::SampledBatch first = rows, copies = rows;
  first.weights = {1.0f, 0.0f, 0.0f, 0.0f};
  for (size_t f = 0; f < rows.fields.size(); ++f) {
    std::vector<uint8_t>& data = copies.fields[f].data;
    const size_t row_bytes = data.size() / 4;
    for (int i = 1; i < 4; ++i) std::copy_n(data.begin(), row_bytes, data.begin() + i * row_bytes);
  }
  copies.weights = {0.25f, 0.25f, 0.25f, 0.25f};
  const std::vector<float> got = critic_after(first), want = critic_after(copies), as_sampled = critic_after(rows);
  ASSERT_EQ(got.size(), want.size());
  ASSERT_GT(got.size(), 0u);
  float moved = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-6f + 1e-5f * std::fabs(want[i])) << "critic float " << i;
    moved = std::max(moved, std::fabs(got[i] - as_sampled[i]));
  }
  EXPECT_GT(moved, 1e-4f) << "the weights the batch came with give another update";
}

// Trains on a bandit whose reward grows with the action everywhere (best at
// +1) with the given pre-tanh penalty; returns the policy's action there.
float ActionAfterPushingToTheBound(float penalty) {
  const ObservationSpec spec{.state_size = 1};
  config::ExperimentConfig c = TinyConfig(/*batch=*/32, {32, 32});
  c.mutable_d4pg()->set_actor_pre_tanh_penalty(penalty);
  auto replicator = MakeReplicator(1);
  auto agent = D4pgAgent::Create(c, spec, /*action_size=*/1, replicator.get());
  TROUPE_CHECK(agent.ok());
  auto signature = replay::Signature::FromConfig(TransitionTable(spec, 1, c));
  TROUPE_CHECK(signature.ok());
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const absl::Status trained = (*agent)->Train(2000, [&](int, int64_t n, replay::SampledBatch* out) {
    replay::ShapeBatch(*signature, n, out);
    for (int64_t i = 0; i < n; ++i) {
      out->keys[i] = i;
      Floats(out, 0)[i] = u(rng);
      Floats(out, 4)[i] = u(rng);
      Floats(out, 1)[i] = u(rng);
      Floats(out, 2)[i] = 0.5f * (Floats(out, 1)[i] + 1.0f);  // reward (a + 1) / 2
      Floats(out, 3)[i] = 0.0f;
    }
    return absl::OkStatus();
  });
  TROUPE_CHECK(trained.ok());
  const std::unique_ptr<D4pgPolicy> policy = PolicyOf(**agent, c);
  const float obs = 0.3f;
  float action = 0;
  TROUPE_CHECK(policy->Act(&obs, nullptr, 1, &action).ok());
  return action;
}

TEST(D4pgAgentTest, ThePreTanhPenaltyKeepsTheActorOutOfDeepSaturation) {
  // Without it the actor runs on past u = 5, where tanh's gradient is below
  // 2e-4 (and at u > 9 tanh is 1.0f exactly, its gradient exactly zero: an
  // actor there can never come back, whatever the critic learns later).
  EXPECT_GT(ActionAfterPushingToTheBound(/*penalty=*/0.0f), std::tanh(5.0f));
  // With it, u stays near the bound (3: tanh 0.995), still at the right end.
  const float bounded = ActionAfterPushingToTheBound(/*penalty=*/1.0f);
  EXPECT_GT(bounded, 0.98f);
  EXPECT_LT(bounded, std::tanh(3.5f));
}

// A pixel stack in which every (frame, colour) plane is one uniform level:
// the newest frame's red plane 127.5 * (x + 1), every other plane a random
// level. The context x is readable only from the right frame and channel, so
// a policy that mixes up the stack order, the colour planes or the encoder's
// parameters cannot learn it.
void PixelBanditStack(const ObservationSpec& spec, float x, std::mt19937_64& rng, uint8_t* out) {
  std::uniform_int_distribution<int> byte(0, 255);
  const int64_t pixels = int64_t{spec.height} * spec.width;
  for (int f = 0; f < spec.frames; ++f) {
    for (int c = 0; c < 3; ++c) {
      const bool context = f == spec.frames - 1 && c == 0;
      const uint8_t level = context ? static_cast<uint8_t>(std::lround(127.5f * (x + 1.0f))) : byte(rng);
      uint8_t* frame = out + f * pixels * 3;
      for (int64_t p = 0; p < pixels; ++p) frame[3 * p + c] = level;
    }
  }
}

// One step from pixels: the best action is the newest frame's red level.
// Trains on `device` and returns the policy's actions on probe stacks whose
// best actions are -0.8, -0.6, ..., 0.8; *checksum gets the agent's state.
// Row i of a pixel bandit batch (TransitionTable's fields): the stack
// showing context x, a random next stack, `action` and its reward
// 1 - (action - x)^2 (clipped to [0, 1]), `discount`.
void PixelBanditRow(const ObservationSpec& spec, float x, float action, float discount, std::mt19937_64& rng,
                    replay::SampledBatch* out, int64_t i) {
  const int64_t stack = int64_t{spec.frames} * spec.height * spec.width * 3;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  PixelBanditStack(spec, x, rng, out->fields[0].data.data() + i * stack);
  PixelBanditStack(spec, u(rng), rng, out->fields[4].data.data() + i * stack);
  Floats(out, 1)[i] = action;
  Floats(out, 2)[i] = std::clamp(1.0f - (action - x) * (action - x), 0.0f, 1.0f);
  Floats(out, 3)[i] = discount;
}

// `updates` D4PG updates from pixels on `engine`'s device (a contextual
// bandit: the best action is the brightness of the last frame's red plane).
struct TrainedAgent {
  std::unique_ptr<replicator::Replicator> replicator;  // outlives the agent, whose replicas it runs
  std::unique_ptr<D4pgAgent> agent;
};
absl::StatusOr<TrainedAgent> TrainPixelBanditOn(const config::EngineConfig& engine, int updates,
                                                config::ExperimentConfig* config) {
  const ObservationSpec spec{.frames = 2, .height = 32, .width = 32};
  config::ExperimentConfig& c = *config;
  c = TinyConfig(/*batch=*/32, {64, 64});
  c.mutable_d4pg()->set_target_tau(0.05f);
  c.mutable_d4pg()->set_encoder_features(16);
  c.mutable_d4pg()->set_conv_channels(8);
  c.mutable_d4pg()->set_augment_pad(2);
  c.mutable_learner()->mutable_engine()->MergeFrom(engine);
  auto replicator = MakeReplicator(1, c.learner().engine());
  auto agent = D4pgAgent::Create(c, spec, /*action_size=*/1, replicator.get());
  if (!agent.ok()) return agent.status();
  auto signature = replay::Signature::FromConfig(TransitionTable(spec, 1, c));
  TROUPE_CHECK(signature.ok());
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  absl::Status trained = (*agent)->Train(updates, [&](int, int64_t n, replay::SampledBatch* out) {
    replay::ShapeBatch(*signature, n, out);
    for (int64_t i = 0; i < n; ++i) {
      const float x = u(rng), action = u(rng);
      out->keys[i] = i;
      PixelBanditRow(spec, x, action, /*discount=*/0.0f, rng, out, i);
    }
    return absl::OkStatus();
  });
  if (!trained.ok()) return trained;
  return TrainedAgent{std::move(replicator), *std::move(agent)};
}

std::vector<float> TrainPixelBandit(config::EngineConfig::Device device, int updates, uint64_t* checksum) {
  config::EngineConfig engine;
  engine.set_device(device);
  config::ExperimentConfig c;
  auto trained = TrainPixelBanditOn(engine, updates, &c);
  EXPECT_TRUE(trained.ok()) << trained.status();
  if (!trained.ok()) return {};
  const D4pgAgent& agent = *trained->agent;
  *checksum = agent.StateChecksum();

  // The inference path, on fresh stacks, with the learner's parameters.
  const ObservationSpec spec{.frames = 2, .height = 32, .width = 32};
  const int64_t stack = int64_t{spec.frames} * spec.height * spec.width * 3;
  std::mt19937_64 rng(12);
  const std::unique_ptr<D4pgPolicy> policy = PolicyOf(agent, c);
  constexpr int kProbes = 9;
  std::vector<uint8_t> pixels(kProbes * stack);
  std::vector<float> actions(kProbes);
  for (int i = 0; i < kProbes; ++i) PixelBanditStack(spec, -0.8f + 0.2f * i, rng, pixels.data() + i * stack);
  EXPECT_TRUE(policy->Act(nullptr, pixels.data(), kProbes, actions.data()).ok());
  return actions;
}

TEST(D4pgAgentTest, LearnsAContextualBanditFromPixels) {
  uint64_t checksum = 0;
  const std::vector<float> actions = TrainPixelBandit(config::EngineConfig::CPU, 800, &checksum);
  ASSERT_EQ(actions.size(), 9u);
  for (int i = 0; i < 9; ++i) EXPECT_NEAR(actions[i], -0.8f + 0.2f * i, 0.25) << "probe " << i;
}

// The strict CPU device (every kernel behind mprotect, ~12x slower) ends
// 200 updates in the CPU's state bit for bit and acts as it does; that the
// CPU's 800 learn the bandit is the test above. (800 strict updates took
// 150-300 s on 2 loaded cores, near ctest's limit.)
TEST(D4pgAgentTest, PixelUpdatesOnTheStrictDeviceEndInTheCpusStateBitForBit) {
  uint64_t cpu_checksum = 0, strict_checksum = 1, untrained_checksum = 2;
  const std::vector<float> strict = TrainPixelBandit(config::EngineConfig::CPU_STRICT, 200, &strict_checksum);
  ASSERT_EQ(strict.size(), 9u);
  EXPECT_EQ(TrainPixelBandit(config::EngineConfig::CPU, 200, &cpu_checksum), strict);
  EXPECT_EQ(cpu_checksum, strict_checksum);
  // The updates changed the state (the comparison is not of two untrained agents).
  TrainPixelBandit(config::EngineConfig::CPU, 0, &untrained_checksum);
  EXPECT_NE(untrained_checksum, cpu_checksum);
}

// D4PG pixel updates on the PJRT backend (the XLA CPU plugin here; a TPU or
// GPU plugin runs the same StableHLO programs), one compiled program per
// update: from the same batches, the whole state after three updates
// (critic, actor, both targets, Adam's moments, counters) is the CPU's
// within float32 rounding (2e-4 relative; 4.5e-5 seen), and every part of
// it moved by at least ten times that (nn::SameState). The moments carry
// the gradients' size.
TEST(D4pgAgentTest, PixelUpdatesOnPjrtMatchTheCpu) {
  const char* plugin = std::getenv("TROUPE_PJRT_PLUGIN");
  if (plugin == nullptr || !std::filesystem::exists(plugin)) GTEST_SKIP() << "no PJRT plugin at TROUPE_PJRT_PLUGIN";
  config::EngineConfig cpu, pjrt;
  pjrt.set_device(config::EngineConfig::PJRT);
  pjrt.set_pjrt_plugin(plugin);
  config::ExperimentConfig c;
  auto initial = TrainPixelBanditOn(cpu, 0, &c);
  auto on_cpu = TrainPixelBanditOn(cpu, 3, &c);
  auto on_pjrt = TrainPixelBanditOn(pjrt, 3, &c);
  ASSERT_TRUE(initial.ok() && on_cpu.ok()) << on_cpu.status();
  ASSERT_TRUE(on_pjrt.ok()) << on_pjrt.status();
  TROUPE_EXPECT_SAME_STATE(initial->agent->CheckpointState(), on_cpu->agent->CheckpointState(),
                           on_pjrt->agent->CheckpointState(), .tolerance = 2e-4);
}

// The kernel-at-a-time path on PJRT (engine.pjrt_steps KERNELS, and what
// COMPILED_ELSE_KERNELS falls back to): D4PG updates from state with
// prioritized weights, the whole state after three updates the CPU's within
// 2e-5 relative (3.9e-6 seen), every part moved by ten times that. (From state: each
// kernel is compiled on its own, and a pixel update's hundred-odd kernels
// take minutes to compile on 2 cores.)
TEST(D4pgAgentTest, UpdatesKernelAtATimeOnPjrtMatchTheCpu) {
  const char* plugin = std::getenv("TROUPE_PJRT_PLUGIN");
  if (plugin == nullptr || !std::filesystem::exists(plugin)) GTEST_SKIP() << "no PJRT plugin at TROUPE_PJRT_PLUGIN";
  const ObservationSpec spec{.state_size = 3};
  config::ExperimentConfig c = TinyConfig(/*batch=*/16, {32, 32});
  c.mutable_learner()->set_prioritized(true);
  c.mutable_d4pg()->set_target_tau(0.1f);  // the targets move by more than the tolerance
  config::ExperimentConfig on_pjrt = c;
  on_pjrt.mutable_learner()->mutable_engine()->set_device(config::EngineConfig::PJRT);
  on_pjrt.mutable_learner()->mutable_engine()->set_pjrt_plugin(plugin);
  on_pjrt.mutable_learner()->mutable_engine()->set_pjrt_steps(config::EngineConfig::KERNELS);
  std::vector<std::vector<nn::CheckpointTensor>> states;
  for (const config::ExperimentConfig& config : {c, on_pjrt}) {
    auto replicator = MakeReplicator(1, config.learner().engine());
    auto agent = D4pgAgent::Create(config, spec, /*action_size=*/2, replicator.get());
    ASSERT_TRUE(agent.ok()) << agent.status();
    if (states.empty()) states.push_back((*agent)->CheckpointState());  // the start
    for (uint64_t step = 0; step < 3; ++step) ASSERT_TRUE((*agent)->Train(1, Bandit(spec, 2, config, step)).ok());
    states.push_back((*agent)->CheckpointState());
  }
  TROUPE_EXPECT_SAME_STATE(states[0], states[1], states[2], .tolerance = 2e-5);
}

// The full training state, read back through a checkpoint file.
std::vector<float> Snapshot(const D4pgAgent& agent) {
  std::vector<float> p;
  agent.PolicyParameters(&p);
  return p;
}

#ifdef TROUPE_HAVE_PJRT
// The compiled-update tests' pixel agent: 2 frames of 32x32, batch 16,
// prioritized, a small encoder, augmentation on.
constexpr ObservationSpec kSmallPixels{.frames = 2, .height = 32, .width = 32};
config::ExperimentConfig SmallPixelConfig() {
  config::ExperimentConfig c = TinyConfig(/*batch=*/16, {32, 32});
  c.mutable_learner()->set_prioritized(true);
  c.mutable_d4pg()->set_encoder_features(16);
  c.mutable_d4pg()->set_conv_channels(8);
  c.mutable_d4pg()->set_augment_pad(2);
  return c;
}

// The same pixel bandit batches (prioritized, with importance weights) for
// update `update`, whichever agent asks: two agents see the same data.
D4pgAgent::SampleFn BanditBatches(const ObservationSpec& spec, const config::ExperimentConfig& c, int64_t update) {
  return [spec, c, update](int, int64_t n, replay::SampledBatch* out) {
    auto signature = replay::Signature::FromConfig(TransitionTable(spec, 1, c));
    TROUPE_CHECK(signature.ok());
    replay::ShapeBatch(*signature, n, out);
    std::mt19937_64 rng(1000 + update);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    out->weights.resize(n);
    for (int64_t i = 0; i < n; ++i) {
      const float x = u(rng), action = u(rng);
      out->keys[i] = 100 * update + i;
      out->weights[i] = 0.5f + 0.5f * std::fabs(u(rng));
      PixelBanditRow(spec, x, action, /*discount=*/0.9f, rng, out, i);
    }
    return absl::OkStatus();
  };
}

// A compiled D4PG pixel update (device PJRT, one program per step; the XLA
// CPU plugin here) against the CPU backend: prioritized replay with
// importance weights, augmentation on.
//  - Step by step: 20 times the PJRT agent takes the CPU agent's state (a
//    checkpoint), both take one update on the same batch, and the whole
//    state (networks, targets, Adam's moments, counters) agrees within 1e-5
//    relative (float32 rounding of XLA's fused kernels against Eigen's;
//    1e-7 to 1.4e-6 seen),
//    each part of it having moved in that update by ten times that (tau
//    0.2, so the targets move too); the priorities within 1e-4 relative,
//    the metrics within 1e-4.
//  - Exactly one execution per update, and no compile after the first.
//  - Free running for 20 updates from the same start: the whole state
//    within 2e-4 (3.2e-5 seen).
//  - A checkpoint of the compiled agent loads in a CPU agent, whose policy
//    then acts exactly as one made from the compiled agent's parameters.
TEST(D4pgAgentTest, CompiledPixelUpdatesOnPjrtMatchTheCpuStepByStep) {
  const char* plugin = std::getenv("TROUPE_PJRT_PLUGIN");
  if (plugin == nullptr || !std::filesystem::exists(plugin)) GTEST_SKIP() << "no PJRT plugin at TROUPE_PJRT_PLUGIN";
  const ObservationSpec spec = kSmallPixels;
  config::ExperimentConfig c = SmallPixelConfig();
  c.mutable_d4pg()->set_target_tau(0.2f);
  config::ExperimentConfig on_pjrt = c;
  on_pjrt.mutable_learner()->mutable_engine()->set_device(config::EngineConfig::PJRT);
  on_pjrt.mutable_learner()->mutable_engine()->set_pjrt_plugin(plugin);
  auto cpu_replicator = MakeReplicator(1, c.learner().engine());
  auto pjrt_replicator = MakeReplicator(1, on_pjrt.learner().engine());
  auto cpu = D4pgAgent::Create(c, spec, 1, cpu_replicator.get());
  auto compiled = D4pgAgent::Create(on_pjrt, spec, 1, pjrt_replicator.get());
  ASSERT_TRUE(cpu.ok() && compiled.ok()) << cpu.status() << compiled.status();
  auto* backend = dynamic_cast<pjrt::PjrtBackend*>(pjrt_replicator->backend(0).get());
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->compiles_steps());
  const std::string state = TempPath("compiled_d4pg_state");
  std::vector<uint64_t> cpu_keys, pjrt_keys;
  std::vector<double> cpu_priorities, pjrt_priorities;
  int64_t step_compiles_after_warmup = -1;
  for (int64_t update = 0; update < 20; ++update) {
    SCOPED_TRACE(::testing::Message() << "update " << update);
    ASSERT_TRUE((*cpu)->Save(state).ok());
    ASSERT_TRUE((*compiled)->Load(state).ok());
    const std::vector<nn::CheckpointTensor> before = (*cpu)->CheckpointState();
    const int64_t launches = backend->stats().launches;
    ASSERT_TRUE((*cpu)->Train(1, BanditBatches(spec, c, update)).ok());
    ASSERT_TRUE((*compiled)->Train(1, BanditBatches(spec, c, update)).ok());
    EXPECT_EQ(backend->stats().launches - launches, 1) << "executions in one compiled update";
    // Compiled, or loaded from the on-disk cache an earlier run left.
    if (update == 0) step_compiles_after_warmup = backend->stats().step_compiles + backend->stats().step_cache_loads;
    TROUPE_EXPECT_SAME_STATE(before, (*cpu)->CheckpointState(), (*compiled)->CheckpointState(), .tolerance = 1e-5);
    (*cpu)->LastPriorities(&cpu_keys, &cpu_priorities);
    (*compiled)->LastPriorities(&pjrt_keys, &pjrt_priorities);
    EXPECT_EQ(cpu_keys, pjrt_keys);
    ASSERT_EQ(cpu_priorities.size(), 16u);
    ASSERT_EQ(pjrt_priorities.size(), 16u);
    for (size_t i = 0; i < cpu_priorities.size(); ++i) {
      EXPECT_NEAR(pjrt_priorities[i], cpu_priorities[i], 1e-4 * (1 + std::fabs(cpu_priorities[i]))) << "item " << i;
    }
    const AgentMetrics want = (*cpu)->metrics(), got = (*compiled)->metrics();
    EXPECT_NEAR(got["critic_loss"], want["critic_loss"], 1e-4);
    EXPECT_NEAR(got["actor_loss"], want["actor_loss"], 1e-4);
    EXPECT_NEAR(got["q_mean"], want["q_mean"], 1e-4);
    EXPECT_EQ(got.updates, want.updates);
  }
  EXPECT_EQ(backend->stats().step_compiles + backend->stats().step_cache_loads, step_compiles_after_warmup)
      << "a step compiled again";
  EXPECT_EQ(step_compiles_after_warmup, 1);

  // Free running from one start.
  ASSERT_TRUE((*cpu)->Save(state).ok());
  ASSERT_TRUE((*compiled)->Load(state).ok());
  const std::vector<nn::CheckpointTensor> start = (*cpu)->CheckpointState();
  for (int64_t update = 20; update < 40; ++update) {
    ASSERT_TRUE((*cpu)->Train(1, BanditBatches(spec, c, update)).ok());
    ASSERT_TRUE((*compiled)->Train(1, BanditBatches(spec, c, update)).ok());
  }
  TROUPE_EXPECT_SAME_STATE(start, (*cpu)->CheckpointState(), (*compiled)->CheckpointState(), .tolerance = 2e-4);

  // The compiled agent's checkpoint, in a CPU agent and its policy.
  ASSERT_TRUE((*compiled)->Save(state).ok());
  auto loaded_replicator = MakeReplicator(1, c.learner().engine());
  auto loaded = D4pgAgent::Create(c, spec, 1, loaded_replicator.get());
  ASSERT_TRUE(loaded.ok());
  ASSERT_TRUE((*loaded)->Load(state).ok());
  EXPECT_EQ(Snapshot(**loaded), Snapshot(**compiled));
  EXPECT_EQ((*loaded)->updates(), (*compiled)->updates());
  const int64_t stack = int64_t{spec.frames} * spec.height * spec.width * 3;
  std::vector<uint8_t> pixels(5 * stack);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 5; ++i) PixelBanditStack(spec, -0.8f + 0.4f * i, rng, pixels.data() + i * stack);
  std::vector<float> from_checkpoint(5), from_compiled(5);
  ASSERT_TRUE(PolicyOf(**loaded, c)->Act(nullptr, pixels.data(), 5, from_checkpoint.data()).ok());
  ASSERT_TRUE(PolicyOf(**compiled, c)->Act(nullptr, pixels.data(), 5, from_compiled.data()).ok());
  EXPECT_EQ(from_checkpoint, from_compiled);
  std::filesystem::remove(state);
}

// A compiled D4PG pixel update traced once and replayed (nn::Backend::RunStep)
// against the same update recorded every time: 30 updates of prioritized
// pixel batches with augmentation from one start, and the replaying agent's
// whole state (networks, targets, Adam's moments, counters) is the
// recording one's bit for bit, as are its priorities and metrics. The
// recording agent runs the guard after every replay (engine.pjrt_check_replay
// 1): each of its recordings was the program the other replayed.
TEST(D4pgAgentTest, ReplayedPixelUpdatesOnPjrtEqualRecordedOnesBitForBit) {
  const char* plugin = std::getenv("TROUPE_PJRT_PLUGIN");
  if (plugin == nullptr || !std::filesystem::exists(plugin)) GTEST_SKIP() << "no PJRT plugin at TROUPE_PJRT_PLUGIN";
  const ObservationSpec spec = kSmallPixels;
  config::ExperimentConfig c = SmallPixelConfig();
  c.mutable_learner()->mutable_engine()->set_device(config::EngineConfig::PJRT);
  c.mutable_learner()->mutable_engine()->set_pjrt_plugin(plugin);
  config::ExperimentConfig checked = c;
  checked.mutable_learner()->mutable_engine()->set_pjrt_check_replay(1);
  auto replaying_replicator = MakeReplicator(1, c.learner().engine());
  auto recording_replicator = MakeReplicator(1, checked.learner().engine());
  auto replaying = D4pgAgent::Create(c, spec, 1, replaying_replicator.get());
  auto recording = D4pgAgent::Create(checked, spec, 1, recording_replicator.get());
  ASSERT_TRUE(replaying.ok() && recording.ok()) << replaying.status() << recording.status();
  const std::vector<nn::CheckpointTensor> start = (*replaying)->CheckpointState();
  std::vector<uint64_t> keys[2];
  std::vector<double> priorities[2];
  for (int64_t update = 0; update < 30; ++update) {
    ASSERT_TRUE((*replaying)->Train(1, BanditBatches(spec, c, update)).ok());
    ASSERT_TRUE((*recording)->Train(1, BanditBatches(spec, c, update)).ok());
    (*replaying)->LastPriorities(&keys[0], &priorities[0]);
    (*recording)->LastPriorities(&keys[1], &priorities[1]);
    ASSERT_EQ(priorities[0], priorities[1]) << "update " << update;
    ASSERT_EQ(keys[0], keys[1]);
    const AgentMetrics a = (*replaying)->metrics(), b = (*recording)->metrics();
    ASSERT_EQ(a["critic_loss"], b["critic_loss"]) << "update " << update;
    ASSERT_EQ(a["actor_loss"], b["actor_loss"]) << "update " << update;
  }
  const std::vector<nn::CheckpointTensor> replayed = (*replaying)->CheckpointState(),
                                          recorded = (*recording)->CheckpointState();
  ASSERT_EQ(replayed.size(), recorded.size());
  for (size_t i = 0; i < replayed.size(); ++i) {
    EXPECT_EQ(replayed[i].name, recorded[i].name);
    // As bytes: the counters are int64s whose bits are denormal floats, equal
    // to 0 as floats where the thread flushes denormals (XLA's may).
    const size_t bytes = sizeof(float) * replayed[i].values.size();
    EXPECT_EQ(std::memcmp(replayed[i].values.data(), recorded[i].values.data(), bytes), 0) << replayed[i].name;
    EXPECT_NE(std::memcmp(replayed[i].values.data(), start[i].values.data(), bytes), 0)
        << replayed[i].name << " did not move";
  }
  const auto& a = dynamic_cast<pjrt::PjrtBackend&>(*replaying_replicator->backend(0)).stats();
  const auto& b = dynamic_cast<pjrt::PjrtBackend&>(*recording_replicator->backend(0)).stats();
  EXPECT_EQ(a.step_replays, 28) << "two recordings, then replays";
  EXPECT_EQ(a.steps, 30);
  EXPECT_EQ(b.step_replays, 0);
  EXPECT_EQ(b.replay_checks, 28) << "every update after the first two recorded and checked";
}

// K=2 replicas on two devices of the CPU plugin run each update as ONE
// program compiled for two replicas (gradients averaged by its all_reduce,
// TF-Replicator style), executed once per update, and end where one replica
// on the whole batch ends (within 1e-5 relative: XLA sums the halves in
// another order).
// Two replicas in one program on the CPU plugin's devices (engine.replicas
// 2, device PJRT); Unavailable, saying why, when the plugin is missing or
// has one device.
absl::StatusOr<config::EngineConfig> TwoPjrtReplicas() {
  const char* plugin = std::getenv("TROUPE_PJRT_PLUGIN");
  if (plugin == nullptr || !std::filesystem::exists(plugin)) {
    return absl::UnavailableError("no PJRT plugin at TROUPE_PJRT_PLUGIN");
  }
  config::EngineConfig engine;
  engine.set_device(config::EngineConfig::PJRT);
  engine.set_pjrt_plugin(plugin);
  engine.set_replicas(2);
  if (const absl::Status enough = engine::CheckDeviceAvailable(engine, "learner"); !enough.ok()) {
    return absl::UnavailableError(absl::StrCat("the plugin has one device: ", enough.message()));
  }
  return engine;
}

// K=2 replicas in one program with two updates per execution
// (learner.updates_per_execution 2) end where one replica on the whole batch
// ends with two per execution, within 1e-5 relative: four executions of two
// updates, the third and fourth replayed by both replicas in step.
TEST(D4pgAgentTest, TwoReplicasWithTwoUpdatesPerExecutionInOnePjrtProgramEqualOneReplica) {
  absl::StatusOr<config::EngineConfig> engine = TwoPjrtReplicas();
  if (!engine.ok()) GTEST_SKIP() << engine.status().message();
  const ObservationSpec spec{.state_size = 3};
  config::ExperimentConfig c = TinyConfig(/*batch=*/16, {32, 32});
  c.mutable_d4pg()->set_target_tau(0.1f);  // the targets move by more than the tolerance
  c.mutable_learner()->set_updates_per_execution(2);
  std::vector<std::vector<nn::CheckpointTensor>> states;
  for (int k : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << k << " replica(s)");
    auto replicator = MakeReplicator(k, *engine);
    auto agent = D4pgAgent::Create(c, spec, /*action_size=*/2, replicator.get());
    ASSERT_TRUE(agent.ok()) << agent.status();
    if (k == 1) states.push_back((*agent)->CheckpointState());  // the start
    for (uint64_t call = 0; call < 4; ++call) ASSERT_TRUE((*agent)->Train(2, Bandit(spec, 2, c, call)).ok());
    EXPECT_EQ((*agent)->updates(), 8);
    for (int r = 0; r < k; ++r) {
      const pjrt::PjrtStats& stats = dynamic_cast<pjrt::PjrtBackend&>(*replicator->backend(r)).stats();
      EXPECT_EQ(stats.steps, 4) << "replica " << r;
      EXPECT_EQ(stats.step_replays, 2) << "replica " << r;
    }
    states.push_back((*agent)->CheckpointState());
  }
  TROUPE_EXPECT_SAME_STATE(states[0], states[1], states[2], .tolerance = 1e-5);
}

TEST(D4pgAgentTest, TwoReplicasInOneCompiledPjrtProgramEqualOneReplicaOnTheWholeBatch) {
  absl::StatusOr<config::EngineConfig> engine = TwoPjrtReplicas();
  if (!engine.ok()) GTEST_SKIP() << engine.status().message();
  const ObservationSpec spec{.state_size = 3};
  config::ExperimentConfig c = TinyConfig(/*batch=*/16, {32, 32});
  c.mutable_d4pg()->set_target_tau(0.1f);  // the targets move by more than the tolerance
  std::vector<std::vector<nn::CheckpointTensor>> states;
  for (int k : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << k << " replica(s)");
    auto replicator = MakeReplicator(k, *engine);
    auto agent = D4pgAgent::Create(c, spec, /*action_size=*/2, replicator.get());
    ASSERT_TRUE(agent.ok()) << agent.status();
    if (k == 1) states.push_back((*agent)->CheckpointState());  // the start
    for (uint64_t step = 0; step < 3; ++step) {
      std::vector<int64_t> launches;
      for (int r = 0; r < k; ++r) {
        launches.push_back(dynamic_cast<pjrt::PjrtBackend&>(*replicator->backend(r)).stats().launches);
      }
      ASSERT_TRUE((*agent)->Train(1, Bandit(spec, 2, c, step)).ok());
      for (int r = 0; r < k; ++r) {
        const auto& backend = dynamic_cast<pjrt::PjrtBackend&>(*replicator->backend(r));
        EXPECT_EQ(backend.stats().launches - launches[r], 1) << "replica " << r << ": executions in one update";
        EXPECT_EQ(backend.group_size(), k == 1 ? 0 : 2);
        if (k == 2) {
          EXPECT_THAT(backend.last_program(), ::testing::HasSubstr("\"stablehlo.all_reduce\""));
          EXPECT_THAT(backend.last_program(), ::testing::HasSubstr("mhlo.num_replicas = 2"));
        }
      }
      if (k == 2) {
        // One program for both, compiled once (by whichever replica came last).
        int64_t compiles = 0;
        for (int r = 0; r < k; ++r) {
          const pjrt::PjrtStats& stats = dynamic_cast<pjrt::PjrtBackend&>(*replicator->backend(r)).stats();
          compiles += stats.step_compiles + stats.step_cache_loads;
        }
        EXPECT_EQ(compiles, 1);
      }
    }
    states.push_back((*agent)->CheckpointState());
  }
  // The whole state: the moments would show a missing 1/K in the all-reduce.
  TROUPE_EXPECT_SAME_STATE(states[0], states[1], states[2], .tolerance = 1e-5);
}
// An execution's epilogue (its readouts: priorities, metrics) overlapped
// with the next execution (the default: the backend's late reads) against
// the epilogue after each execution: Train calls of 5, 1 and 6 updates
// (executions of 2 on the CPU), prioritized pixel batches, and after every
// call the priorities, their keys, the metrics and at the end the whole
// state equal bit for bit, on the CPU and on the PJRT plugin (replayed
// steps). On PJRT the overlapped agent's reads were late (the host waited
// for them when landing them, not at each execution's end).
TEST(D4pgAgentTest, AnEpilogueOverlappedWithTheNextExecutionOnCpuAndPjrtChangesNoPriorityMetricOrState) {
  const ObservationSpec spec = kSmallPixels;
  for (const bool on_pjrt : {false, true}) {
    SCOPED_TRACE(on_pjrt ? "PJRT" : "CPU");
    config::ExperimentConfig c = SmallPixelConfig();
    if (on_pjrt) {
      const char* plugin = std::getenv("TROUPE_PJRT_PLUGIN");
      if (plugin == nullptr || !std::filesystem::exists(plugin)) GTEST_SKIP() << "no PJRT plugin at TROUPE_PJRT_PLUGIN";
      c.mutable_learner()->mutable_engine()->set_device(config::EngineConfig::PJRT);
      c.mutable_learner()->mutable_engine()->set_pjrt_plugin(plugin);
    } else {
      c.mutable_learner()->set_updates_per_execution(2);
    }
    std::unique_ptr<replicator::Replicator> replicators[2];
    std::unique_ptr<D4pgAgent> agents[2];
    D4pgAgent::SampleFn samples[2];
    for (int a = 0; a < 2; ++a) {
      replicators[a] = MakeReplicator(1, c.learner().engine());
      auto agent = D4pgAgent::Create(c, spec, 1, replicators[a].get());
      ASSERT_TRUE(agent.ok()) << agent.status();
      agents[a] = std::move(*agent);
      agents[a]->set_overlap_epilogue(a == 0);
      auto counter = std::make_shared<int64_t>(0);
      samples[a] = [&spec, c, counter](int id, int64_t n, replay::SampledBatch* out) {
        return BanditBatches(spec, c, (*counter)++)(id, n, out);
      };
    }
    const std::vector<nn::CheckpointTensor> start = agents[0]->CheckpointState();
    for (const int updates : {5, 1, 6}) {
      std::vector<uint64_t> keys[2];
      std::vector<double> priorities[2];
      AgentMetrics metrics[2];
      for (int a = 0; a < 2; ++a) {
        ASSERT_TRUE(agents[a]->Train(updates, samples[a]).ok());
        agents[a]->LastPriorities(&keys[a], &priorities[a]);
        metrics[a] = agents[a]->metrics();
      }
      ASSERT_FALSE(keys[0].empty());
      EXPECT_EQ(keys[0], keys[1]) << "after Train(" << updates << ")";
      EXPECT_EQ(priorities[0], priorities[1]) << "after Train(" << updates << ")";
      EXPECT_EQ(metrics[0].updates, metrics[1].updates);
      for (const char* name : {"critic_loss", "actor_loss", "q_mean"}) {
        EXPECT_EQ(metrics[0][name], metrics[1][name]) << name << " after Train(" << updates << ")";
      }
    }
    // Bit for bit, and every part of the state moved.
    TROUPE_EXPECT_SAME_STATE(start, agents[1]->CheckpointState(), agents[0]->CheckpointState(), .tolerance = 0,
                             .moved_at_least = 1e-7);
    if (on_pjrt) {
      const auto& late = dynamic_cast<pjrt::PjrtBackend&>(*replicators[0]->backend(0)).stats();
      const auto& each = dynamic_cast<pjrt::PjrtBackend&>(*replicators[1]->backend(0)).stats();
      EXPECT_GT(late.step_replays, 0);
      EXPECT_GT(late.late_read_wait_seconds, 0) << "the overlapped agent's reads landed late";
      EXPECT_EQ(each.late_read_wait_seconds, 0) << "the other's at each execution's end";
    }
  }
}

// learner.updates_per_execution 4: the learner prepares four updates'
// inputs, then one step runs them in order. On the CPU the whole state
// after Train(12) and Train(2) (executions of 4, 4, 4, then 2) is that of
// fourteen single updates bit for bit, and the priorities of the last
// execution's two updates come back together. On the PJRT plugin each
// execution is one program (one for 4 updates, replayed at its third
// execution, another for 2), and the state is the single updates' within
// 2e-4 relative (XLA fuses across the four updates), every part having
// moved.
TEST(D4pgAgentTest, FourUpdatesPerExecutionOnCpuAndPjrtEqualFourSingleUpdates) {
  const ObservationSpec spec = kSmallPixels;
  config::ExperimentConfig c = SmallPixelConfig();
  c.mutable_d4pg()->set_target_tau(0.2f);
  // From the checkpoint at `from` (none: a new agent), Train(12), then
  // Train(2), on per-update batches.
  const auto train = [&](const config::ExperimentConfig& config, const std::string& from,
                         std::vector<nn::CheckpointTensor>* state, std::vector<uint64_t>* keys,
                         std::vector<double>* priorities, pjrt::PjrtStats* stats) {
    auto replicator = MakeReplicator(1, config.learner().engine());
    auto agent = D4pgAgent::Create(config, spec, 1, replicator.get());
    ASSERT_TRUE(agent.ok()) << agent.status();
    if (!from.empty()) {
      ASSERT_TRUE((*agent)->Load(from).ok());
    }
    const int64_t first = (*agent)->updates();
    auto counter = std::make_shared<int64_t>(0);
    const D4pgAgent::SampleFn sample = [&, counter](int id, int64_t n, replay::SampledBatch* out) {
      return BanditBatches(spec, c, (*counter)++)(id, n, out);
    };
    for (int call = 0; call < 2; ++call) ASSERT_TRUE((*agent)->Train(call == 0 ? 12 : 2, sample).ok());
    EXPECT_EQ((*agent)->updates(), first + 14);
    *state = (*agent)->CheckpointState();
    (*agent)->LastPriorities(keys, priorities);
    if (auto* b = dynamic_cast<pjrt::PjrtBackend*>(replicator->backend(0).get()); b != nullptr) *stats = b->stats();
  };
  config::ExperimentConfig four = c;
  four.mutable_learner()->set_updates_per_execution(4);
  std::vector<nn::CheckpointTensor> single_state, four_state;
  std::vector<uint64_t> single_keys, four_keys;
  std::vector<double> single_priorities, four_priorities;
  pjrt::PjrtStats unused, stats;
  train(c, "", &single_state, &single_keys, &single_priorities, &unused);
  train(four, "", &four_state, &four_keys, &four_priorities, &unused);
  ASSERT_EQ(single_state.size(), four_state.size());
  for (size_t i = 0; i < single_state.size(); ++i) EXPECT_EQ(four_state[i].values, single_state[i].values) << four_state[i].name;
  // The second call's one execution of two updates: both batches' priorities.
  ASSERT_EQ(four_keys.size(), 32u);
  EXPECT_EQ(std::vector<uint64_t>(four_keys.end() - 16, four_keys.end()), single_keys);
  EXPECT_EQ(std::vector<double>(four_priorities.end() - 16, four_priorities.end()), single_priorities);

  const char* plugin = std::getenv("TROUPE_PJRT_PLUGIN");
  if (plugin == nullptr || !std::filesystem::exists(plugin)) GTEST_SKIP() << "no PJRT plugin at TROUPE_PJRT_PLUGIN";
  config::ExperimentConfig one = c;
  for (config::ExperimentConfig* config : {&one, &four}) {
    config->mutable_learner()->mutable_engine()->set_device(config::EngineConfig::PJRT);
    config->mutable_learner()->mutable_engine()->set_pjrt_plugin(plugin);
  }
  std::vector<nn::CheckpointTensor> compiled_four;
  train(four, "", &compiled_four, &four_keys, &four_priorities, &stats);
  EXPECT_EQ(stats.steps, 4) << "executions of 4, 4 and 4 updates, then 2";
  EXPECT_EQ(stats.step_replays, 1) << "the third execution of 4";
  EXPECT_EQ(stats.step_compiles + stats.step_cache_loads, 2) << "a program of 4 updates and one of 2";
  ASSERT_EQ(four_keys.size(), 32u);
  // One execution of four updates against four single updates on the same
  // plugin, from one trained state (compared over more updates, or from the
  // start, the two compilations drift apart: Adam's early updates move a
  // weight by about the learning rate whatever its gradient's size, so
  // rounding decides the smallest gradients' sign, and a run amplifies it).
  const std::string state = TempPath("four_per_execution_state");
  std::vector<nn::CheckpointTensor> start, singles, executed;
  {
    auto replicator = MakeReplicator(1, c.learner().engine());
    auto agent = D4pgAgent::Create(c, spec, 1, replicator.get());
    ASSERT_TRUE(agent.ok());
    for (int64_t update = 0; update < 20; ++update) {
      ASSERT_TRUE((*agent)->Train(1, BanditBatches(spec, c, 1000 + update)).ok());
    }
    ASSERT_TRUE((*agent)->Save(state).ok());
    start = (*agent)->CheckpointState();
  }
  std::vector<nn::CheckpointTensor> on_cpu;
  for (const config::ExperimentConfig* config : {&c, &one, &four}) {
    auto replicator = MakeReplicator(1, config->learner().engine());
    auto agent = D4pgAgent::Create(*config, spec, 1, replicator.get());
    ASSERT_TRUE(agent.ok());
    ASSERT_TRUE((*agent)->Load(state).ok());
    auto counter = std::make_shared<int64_t>(0);
    ASSERT_TRUE((*agent)->Train(4, [&, counter](int id, int64_t n, replay::SampledBatch* out) {
      return BanditBatches(spec, c, (*counter)++)(id, n, out);
    }).ok());
    (config == &c ? on_cpu : config == &one ? singles : executed) = (*agent)->CheckpointState();
  }
  TROUPE_EXPECT_SAME_STATE(start, singles, executed, .tolerance = 1e-4);
  TROUPE_EXPECT_SAME_STATE(start, on_cpu, singles, .tolerance = 1e-4);
  std::filesystem::remove(state);
}

#endif  // TROUPE_HAVE_PJRT

// --- The critic split over replicas (tensor parallelism) --------------------------------

// The critic's logits, its weights' gradients and its action's gradient
// for a fixed batch and loss (sum of logits x fixed coefficients), trainable
// weights; `trainable` false: the weights as constants (the actor's loss),
// only the logits and the action's gradient. `group` for a split critic.
struct CriticPass {
  std::vector<float> logits, action_grad;
  std::vector<std::vector<float>> grads;  // per parameter of the set
};
CriticPass RunCritic(nn::Backend& backend, nn::ParameterSet& set, const internal::Mlp& critic, bool trainable,
                     nn::CrossReplicaSum* group) {
  constexpr int64_t kBatch = 6, kFeatures = 5, kAction = 2, kAtoms = 21;
  std::mt19937_64 rng(17);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> features(kBatch * kFeatures), action(kBatch * kAction), coefficients(kBatch * kAtoms);
  for (auto* v : {&features, &action, &coefficients}) {
    for (float& x : *v) x = d(rng);
  }
  nn::DeviceBuffer action_device(backend, action.size()), coefficients_device(backend, coefficients.size());
  action_device.Upload(action);
  coefficients_device.Upload(coefficients);
  nn::Tape tape(&backend);
  set.ZeroGrad();
  const nn::Var action_var = tape.Leaf(action_device.data(), {kBatch, kAction});
  const nn::Var logits = internal::ApplyCritic(critic, tape, internal::Weights{&set, trainable},
                                               tape.Input(features.data(), {kBatch, kFeatures}), action_var, group);
  tape.Backward(nn::Sum(nn::Mul(logits, tape.Constant(coefficients_device.data(), {kBatch, kAtoms}))));
  auto read = [&](const nn::TensorView& view) {
    std::vector<float> host(view.shape.size());
    backend.Download(view.data, host.data(), sizeof(float) * host.size());
    return host;
  };
  CriticPass pass{read(tape.data(logits)), read(tape.grad(action_var)), {}};
  for (int i = 0; i < set.size() && trainable; ++i) pass.grads.push_back(read(set.grad(i)));
  return pass;
}

// The largest difference of two vectors relative to their scale (as
// nn::SameState's), infinite when their sizes differ.
double Relative(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  return nn::internal::RelativeDifference(got, want);
}

// The critic split over 2 and 4 replicas of a model-parallel group (its
// first two layers Megatron-LM's pair, the rest whole on every part), each
// part given its slices of one whole critic's weights (Mlp::SliceOf): every
// part computes the whole critic's logits and action gradient, trainable or
// with constant weights, within 1e-5; the parts' weight gradients put back
// into the whole layout (layer 1's bias from part 0) are the whole critic's;
// a part holds 1/K of the pair's weights.
TEST(D4pgAgentTest, ACriticSplitOverReplicasComputesTheWholeCritic) {
  const std::vector<int64_t> hidden = {16, 8};
  nn::CpuBackend cpu(1);
  nn::ParameterSet whole_set;
  const internal::Mlp whole = internal::DeclareCritic(whole_set, 5, hidden, 2, 21);
  whole_set.Allocate(cpu, /*seed=*/3);
  const std::vector<float> whole_values = whole_set.DownloadValues();
  const CriticPass want = RunCritic(cpu, whole_set, whole, /*trainable=*/true, nullptr);
  const CriticPass want_constant = RunCritic(cpu, whole_set, whole, /*trainable=*/false, nullptr);
  for (const int k : {2, 4}) {
    SCOPED_TRACE(absl::StrCat(k, " parts"));
    config::EngineConfig engine;
    engine.set_model_parallel(k);
    auto replicator = MakeReplicator(k, engine);
    std::vector<CriticPass> got(k), got_constant(k);
    std::vector<int64_t> pair_floats(k);
    std::vector<std::vector<std::vector<float>>> slices(k);  // part r's gradients, in the whole layout
    ASSERT_TRUE(replicator->RunReplicas([&](replicator::ReplicaContext& ctx) -> absl::Status {
      const int r = ctx.model_axis().replica_id();
      nn::Backend& backend = *ctx.backend();
      nn::ParameterSet set;
      internal::Mlp critic = internal::DeclareCritic(set, 5, hidden, 2, 21, k, r);
      set.Allocate(backend, /*seed=*/0);
      const nn::DeviceBuffer bias_mask = critic.MakeBiasMask(backend, set);
      critic.bias_mask = bias_mask.data();
      // This part's slices of the whole critic's weights.
      std::vector<float> values(set.total_floats());
      for (size_t layer = 0; layer < critic.layers.size(); ++layer) {
        for (const bool weight : {true, false}) {
          const int i = weight ? critic.layers[layer].w : critic.layers[layer].b;
          const int j = weight ? whole.layers[layer].w : whole.layers[layer].b;
          const nn::ParameterInfo& from = whole_set.info(j);
          internal::CopyPartFromWhole({whole_values.data() + from.offset, size_t(from.shape.size())}, from.shape,
                                      critic.SliceOf(layer, weight, set),
                                      {values.data() + set.info(i).offset, size_t(set.info(i).shape.size())});
        }
      }
      RETURN_IF_ERROR(set.UploadValues(values));
      got[r] = RunCritic(backend, set, critic, /*trainable=*/true, &ctx.model_axis());
      got_constant[r] = RunCritic(backend, set, critic, /*trainable=*/false, &ctx.model_axis());
      pair_floats[r] = set.info(critic.layers[0].w).shape.size() + set.info(critic.layers[1].w).shape.size();
      for (size_t layer = 0; layer < critic.layers.size(); ++layer) {
        for (const bool weight : {true, false}) {
          const int i = weight ? critic.layers[layer].w : critic.layers[layer].b;
          const nn::Shape& shape = whole_set.info(weight ? whole.layers[layer].w : whole.layers[layer].b).shape;
          std::vector<float> in_whole(shape.size(), 0.0f);
          internal::CopyPartToWhole(got[r].grads[i], shape, critic.SliceOf(layer, weight, set), in_whole);
          slices[r].push_back(std::move(in_whole));
        }
      }
      return ctx.status();
    }).ok());
    for (int r = 0; r < k; ++r) {
      SCOPED_TRACE(absl::StrCat("part ", r));
      EXPECT_LE(Relative(got[r].logits, want.logits), 1e-5);
      EXPECT_LE(Relative(got[r].action_grad, want.action_grad), 1e-5);
      EXPECT_LE(Relative(got_constant[r].logits, want_constant.logits), 1e-5);
      EXPECT_LE(Relative(got_constant[r].action_grad, want_constant.action_grad), 1e-5);
      EXPECT_EQ(pair_floats[r] * k, (7 * 16 + 16 * 8)) << "1/K of the pair's weights";
    }
    // The whole gradients from the parts: the pair's blocks from each part,
    // the rest (and layer 1's bias) from part 0, which every part agrees on.
    size_t n = 0;
    for (size_t layer = 0; layer < whole.layers.size(); ++layer) {
      for (const bool weight : {true, false}) {
        const std::vector<float>& want_grad = want.grads[weight ? whole.layers[layer].w : whole.layers[layer].b];
        std::vector<float> assembled(want_grad.size(), 0.0f);
        const bool split = layer == 0 || (layer == 1 && weight);
        for (int r = 0; r < (split ? k : 1); ++r) {
          for (size_t i = 0; i < assembled.size(); ++i) assembled[i] += slices[r][n][i];
        }
        EXPECT_LE(Relative(assembled, want_grad), 1e-5) << "layer " << layer << (weight ? " weight" : " bias");
        if (!split) {
          for (int r = 1; r < k && !(layer == 1 && !weight); ++r) {
            EXPECT_LE(Relative(slices[r][n], want_grad), 1e-5) << "part " << r << ", layer " << layer;
          }
        }
        ++n;
      }
    }
  }
}

// A D4PG agent whose critic is split over M replicas of a (K/M) x M mesh
// (learner.engine.model_parallel M), on the global batch `seed` split over
// its K/M model copies (a copy's parts see its rows: only part 0 samples).
struct MeshAgent {
  std::unique_ptr<replicator::Replicator> replicator;
  std::unique_ptr<D4pgAgent> agent;
};
MeshAgent MakeMeshAgent(config::ExperimentConfig c, const ObservationSpec& spec, int k, int m) {
  c.mutable_learner()->mutable_engine()->set_model_parallel(m);
  MeshAgent a;
  a.replicator = MakeReplicator(k, c.learner().engine());
  auto agent = D4pgAgent::Create(c, spec, 2, a.replicator.get());
  TROUPE_CHECK(agent.ok());
  a.agent = std::move(agent).value();
  return a;
}
// The critic split over 1x2, 2x2 and 1x4 meshes (each copy's parts sharing
// its rows, the pair's gradients their own and the rest averaged over the
// copies, clipped by the whole critic's norm) trains as one replica on the
// whole batch: 20 prioritized updates with clipping end within 1e-4 of it,
// whole state (the critic put together from its parts for the checkpoint:
// values, target, moments), the last update's priorities too, one per
// sampled row; a part holds 1/M of the critic's pair.
TEST(D4pgAgentTest, ACriticSplitOverAMeshTrainsAsOneReplicaOnTheWholeBatch) {
  const ObservationSpec spec{.state_size = 3};
  config::ExperimentConfig c = ClippedConfig();
  c.mutable_learner()->set_prioritized(true);
  auto priorities_by_key = [](const D4pgAgent& agent) {
    std::vector<uint64_t> keys;
    std::vector<double> priorities;
    agent.LastPriorities(&keys, &priorities);
    std::map<uint64_t, double> by_key;
    for (size_t i = 0; i < keys.size(); ++i) by_key[keys[i]] = priorities[i];
    EXPECT_EQ(by_key.size(), keys.size()) << "each sampled row once";
    return by_key;
  };
  auto one = MakeReplicator(1);
  auto whole = D4pgAgent::Create(c, spec, 2, one.get());
  ASSERT_TRUE(whole.ok()) << whole.status();
  const std::vector<nn::CheckpointTensor> start = (*whole)->CheckpointState();
  for (uint64_t step = 0; step < 20; ++step) ASSERT_TRUE((*whole)->Train(1, Bandit(spec, 2, c, step)).ok());
  const std::map<uint64_t, double> want = priorities_by_key(**whole);
  ASSERT_EQ(want.size(), 16u);
  for (const auto& [k, m] : {std::pair{2, 2}, std::pair{4, 2}, std::pair{4, 4}}) {
    SCOPED_TRACE(absl::StrCat(k / m, " x ", m, " mesh"));
    MeshAgent mesh = MakeMeshAgent(c, spec, k, m);
    EXPECT_EQ((*whole)->CheckpointState().size(), mesh.agent->CheckpointState().size());
    for (uint64_t step = 0; step < 20; ++step) ASSERT_TRUE(mesh.agent->Train(1, MeshBandit(spec, c, m, step)).ok());
    TROUPE_EXPECT_SAME_STATE(start, (*whole)->CheckpointState(), mesh.agent->CheckpointState(), .tolerance = 1e-4);
    const std::map<uint64_t, double> got = priorities_by_key(*mesh.agent);
    ASSERT_EQ(got.size(), want.size());
    for (const auto& [key, priority] : want) {
      ASSERT_TRUE(got.contains(key)) << "key " << key;
      EXPECT_NEAR(got.at(key), priority, 1e-4 * std::fabs(priority)) << "key " << key;
    }
    // A replica trains its part of the critic: 1/M of the pair's weights.
    nn::ParameterSet whole_set, part_set;
    internal::DeclareCritic(whole_set, 3, {32, 32}, 2, 21);
    const internal::Mlp part = internal::DeclareCritic(part_set, 3, {32, 32}, 2, 21, m, 0);
    EXPECT_EQ(mesh.agent->gradient_floats() - (*whole)->gradient_floats(),
              part_set.total_floats() - whole_set.total_floats());
    EXPECT_EQ((part_set.info(part.layers[0].w).shape.size() + part_set.info(part.layers[1].w).shape.size()) * m,
              5 * 32 + 32 * 32);
  }
}

// The same split on replicas that run each update as one compiled PJRT
// program (the CPU plugin's devices): the parts' sums along the model axis
// (the inputs shared, the pair's forward and backward, the clip's norm) are
// all_reduce ops over that axis's replica groups, the copies' gradient
// average over the other's. 1x2 and 2x2 meshes end 10 prioritized, clipped
// updates within 1e-4 of one CPU replica on the whole batch, whole state
// and priorities.
TEST(D4pgAgentTest, ACriticSplitOverPjrtReplicasTrainsAsOneReplicaOnTheWholeBatch) {
  absl::StatusOr<config::EngineConfig> engine = TwoPjrtReplicas();
  if (!engine.ok()) GTEST_SKIP() << engine.status().message();
  const ObservationSpec spec{.state_size = 3};
  config::ExperimentConfig c = ClippedConfig();
  c.mutable_learner()->set_prioritized(true);
  auto one = MakeReplicator(1);
  auto whole = D4pgAgent::Create(c, spec, 2, one.get());
  ASSERT_TRUE(whole.ok()) << whole.status();
  const std::vector<nn::CheckpointTensor> start = (*whole)->CheckpointState();
  for (uint64_t step = 0; step < 10; ++step) ASSERT_TRUE((*whole)->Train(1, Bandit(spec, 2, c, step)).ok());
  std::vector<uint64_t> want_keys;
  std::vector<double> want_priorities;
  (*whole)->LastPriorities(&want_keys, &want_priorities);
  std::map<uint64_t, double> want;
  for (size_t i = 0; i < want_keys.size(); ++i) want[want_keys[i]] = want_priorities[i];
  for (const auto& [k, m] : {std::pair{2, 2}, std::pair{4, 2}}) {
    SCOPED_TRACE(absl::StrCat(k / m, " x ", m, " mesh"));
    config::EngineConfig mesh_engine = *engine;
    mesh_engine.set_replicas(k);
    mesh_engine.set_model_parallel(m);
    if (const absl::Status enough = engine::CheckDeviceAvailable(mesh_engine, "learner"); !enough.ok()) {
      ASSERT_TRUE(absl::IsFailedPrecondition(enough)) << enough;
      GTEST_SKIP() << "the " << k << "-replica mesh needs a PJRT plugin with " << k << " devices: " << enough;
    }
    config::ExperimentConfig split = c;
    *split.mutable_learner()->mutable_engine() = mesh_engine;
    split.mutable_learner()->mutable_engine()->set_threads(1);
    split.mutable_learner()->mutable_engine()->set_seed(c.learner().engine().seed());
    auto replicator = MakeReplicator(k, mesh_engine);
    auto agent = D4pgAgent::Create(split, spec, 2, replicator.get());
    ASSERT_TRUE(agent.ok()) << agent.status();
    for (uint64_t step = 0; step < 10; ++step) ASSERT_TRUE((*agent)->Train(1, MeshBandit(spec, c, m, step)).ok());
#ifdef TROUPE_HAVE_PJRT
    // Each update one compiled program for the K replicas, none run again kernel at a time.
    for (int r = 0; r < k; ++r) {
      const auto& backend = dynamic_cast<pjrt::PjrtBackend&>(*replicator->backend(r));
      EXPECT_EQ(backend.group_size(), k);
      EXPECT_EQ(backend.stats().steps, 10) << "replica " << r;
      EXPECT_EQ(backend.stats().step_fallbacks, 0) << "replica " << r;
    }
#endif
    TROUPE_EXPECT_SAME_STATE(start, (*whole)->CheckpointState(), (*agent)->CheckpointState(), .tolerance = 1e-4);
    std::vector<uint64_t> keys;
    std::vector<double> priorities;
    (*agent)->LastPriorities(&keys, &priorities);
    ASSERT_EQ(keys.size(), want.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_TRUE(want.contains(keys[i])) << "key " << keys[i];
      EXPECT_NEAR(priorities[i], want[keys[i]], 1e-4 * std::fabs(want[keys[i]])) << "key " << keys[i];
    }
  }
}

// From pixels: the encoder is whole on every part (its gradient the same
// on each, the features' summed over the model axis), a copy's pixels are
// part 0's shared as bytes, and its random shifts are the copy's. A 1x2
// mesh ends 5 clipped updates within 1e-4 of one replica, and a 2x2 mesh
// within 1e-4 of two unsplit replicas (the same copies' shifts), whole state.
TEST(D4pgAgentTest, ACriticSplitOverAMeshTrainsFromPixelsAsItsCopiesUnsplit) {
  const ObservationSpec pixels{.frames = 2, .height = 32, .width = 32};
  config::ExperimentConfig c = TinyConfig(/*batch=*/8, {32, 32});
  c.mutable_d4pg()->set_encoder_features(16);
  c.mutable_d4pg()->set_conv_channels(8);
  c.mutable_d4pg()->set_augment_pad(2);
  c.mutable_d4pg()->set_target_tau(0.2f);
  c.mutable_d4pg()->set_max_gradient_norm(0.5f);
  for (const auto& [k, m] : {std::pair{2, 2}, std::pair{4, 2}}) {
    SCOPED_TRACE(absl::StrCat(k / m, " x ", m, " mesh"));
    auto copies = MakeReplicator(k / m);
    auto unsplit = D4pgAgent::Create(c, pixels, 2, copies.get());
    ASSERT_TRUE(unsplit.ok()) << unsplit.status();
    const std::vector<nn::CheckpointTensor> start = (*unsplit)->CheckpointState();
    MeshAgent mesh = MakeMeshAgent(c, pixels, k, m);
    for (uint64_t step = 0; step < 5; ++step) {
      ASSERT_TRUE((*unsplit)->Train(1, Bandit(pixels, 2, c, step)).ok());
      ASSERT_TRUE(mesh.agent->Train(1, MeshBandit(pixels, c, m, step)).ok());
    }
    TROUPE_EXPECT_SAME_STATE(start, (*unsplit)->CheckpointState(), mesh.agent->CheckpointState(), .tolerance = 1e-4);
  }
}

// A split critic's checkpoint holds the whole critic: saved by a 2x2 mesh
// after 10 updates it resumes on one replica and on 1x2 and 1x4 meshes, and
// one saved by one replica resumes on a 2x2 mesh; 10 + 10 updates end
// within 1e-4 of 20 uninterrupted ones.
TEST(D4pgAgentTest, ASplitCriticsCheckpointResumesOnAnyMeshAndOnOneReplica) {
  const ObservationSpec spec{.state_size = 3};
  config::ExperimentConfig c = TinyConfig(/*batch=*/16, {32, 32});
  c.mutable_d4pg()->set_target_tau(0.1f);
  const std::string path = TempPath("d4pg_split_critic_checkpoint");
  auto one = MakeReplicator(1);
  auto whole = D4pgAgent::Create(c, spec, 2, one.get());
  ASSERT_TRUE(whole.ok());
  const std::vector<nn::CheckpointTensor> start = (*whole)->CheckpointState();
  for (uint64_t step = 0; step < 20; ++step) ASSERT_TRUE((*whole)->Train(1, Bandit(spec, 2, c, step)).ok());
  for (const auto& [saved_k, saved_m, resumes] :
       {std::tuple{4, 2, std::vector<std::pair<int, int>>{{1, 1}, {2, 2}, {4, 4}}},
        std::tuple{1, 1, std::vector<std::pair<int, int>>{{4, 2}}}}) {
    MeshAgent saver = MakeMeshAgent(c, spec, saved_k, saved_m);
    for (uint64_t step = 0; step < 10; ++step) {
      ASSERT_TRUE(saver.agent->Train(1, MeshBandit(spec, c, saved_m, step)).ok());
    }
    ASSERT_TRUE(saver.agent->Save(path).ok());
    for (const auto& [k, m] : resumes) {
      SCOPED_TRACE(absl::StrCat("saved by a ", saved_k / saved_m, " x ", saved_m, " mesh, resumed on ", k / m, " x ", m));
      MeshAgent resumed = MakeMeshAgent(c, spec, k, m);
      const absl::Status loaded = resumed.agent->Load(path);
      ASSERT_TRUE(loaded.ok()) << loaded;
      for (uint64_t step = 10; step < 20; ++step) {
        ASSERT_TRUE(resumed.agent->Train(1, MeshBandit(spec, c, m, step)).ok());
      }
      TROUPE_EXPECT_SAME_STATE(start, (*whole)->CheckpointState(), resumed.agent->CheckpointState(), .tolerance = 1e-4);
    }
  }
  std::filesystem::remove(path);
}

// What a split critic needs, refused before anything starts naming the
// field: two hidden layers or more with the first divisible by M, replicas
// in this process or one per MPI rank.
TEST(D4pgAgentTest, ACriticSplitItCannotMakeIsRefusedNamingTheField) {
  config::ExperimentConfig c = TinyConfig(/*batch=*/16, {30, 32});
  c.mutable_learner()->mutable_engine()->set_model_parallel(4);
  const ObservationSpec state{.state_size = 3};
  EXPECT_THAT(CheckD4pgCriticSplits(c, state).message(),
              HasSubstr("learner.engine.model_parallel 4: d4pg.hidden[0] 30 does not split into 4 parts"));
  c.mutable_d4pg()->clear_hidden();
  c.mutable_d4pg()->add_hidden(32);
  EXPECT_THAT(CheckD4pgCriticSplits(c, state).message(), HasSubstr("needs two hidden layers or more"));
  c.mutable_d4pg()->add_hidden(32);
  EXPECT_TRUE(CheckD4pgCriticSplits(c, state).ok());
  EXPECT_TRUE(CheckD4pgCriticSplits(c, {.frames = 2, .height = 32, .width = 32}).ok());
  c.mutable_learner()->mutable_engine()->set_collectives(config::EngineConfig::MPI);
  EXPECT_TRUE(CheckD4pgCriticSplits(c, state).ok());
  c.mutable_learner()->mutable_engine()->set_collectives(config::EngineConfig::NCCL_MPI);
  EXPECT_THAT(CheckD4pgCriticSplits(c, state).message(),
              HasSubstr("collectives NCCL_MPI: D4PG's split critic runs with its replicas in this process"));
  c.mutable_learner()->mutable_engine()->set_collectives(config::EngineConfig::IN_PROCESS);
  c.mutable_learner()->mutable_engine()->set_device(config::EngineConfig::PJRT);
  EXPECT_TRUE(CheckD4pgCriticSplits(c, state).ok());
}

// --- Replicas and checkpoints -----------------------------------------------------------

// K=2 in-process replicas, each on half of the batch with gradients
// averaged, against K=1 on the whole batch: the whole state (networks,
// targets, Adam's moments, which would show a missing 1/K, and counters)
// within 1e-5 relative, every part of it moved; the losses alike.
TEST(D4pgAgentTest, TwoReplicasOnHalfBatchesEqualOneReplicaOnTheWholeBatch) {
  const ObservationSpec spec{.state_size = 3};
  config::ExperimentConfig c = TinyConfig(/*batch=*/16, {32, 32});
  c.mutable_d4pg()->set_target_tau(0.1f);  // the targets move by more than the tolerance
  std::vector<std::vector<nn::CheckpointTensor>> states;
  std::vector<AgentMetrics> metrics;
  for (int k : {1, 2}) {
    auto replicator = MakeReplicator(k);
    auto agent = D4pgAgent::Create(c, spec, /*action_size=*/2, replicator.get());
    ASSERT_TRUE(agent.ok()) << agent.status();
    if (k == 1) states.push_back((*agent)->CheckpointState());  // the start
    for (uint64_t step = 0; step < 2; ++step) {
      ASSERT_TRUE((*agent)->Train(1, Bandit(spec, 2, c, step)).ok());
    }
    states.push_back((*agent)->CheckpointState());
    metrics.push_back((*agent)->metrics());
  }
  TROUPE_EXPECT_SAME_STATE(states[0], states[1], states[2], .tolerance = 1e-5);
  EXPECT_NEAR(metrics[0]["critic_loss"], metrics[1]["critic_loss"], 1e-5 * std::fabs(metrics[0]["critic_loss"]));
  EXPECT_NEAR(metrics[0]["actor_loss"], metrics[1]["actor_loss"], 1e-5 * std::fabs(metrics[0]["actor_loss"]) + 1e-7);
}

// engine.shard_state OPTIMIZER: K=2 and K=4 replicas, each keeping Adam's
// moments for its quarter or half of the networks (reduce-scatter, clip by
// the global norm, all-gather), against K=1 with plain Adam on the whole
// batch over 20 updates: the whole state (networks, targets, the moments
// gathered for the checkpoint, counters) within 1e-4 relative, every part
// moved. The gradients clip (max_gradient_norm 0.5), so the parts' norms
// must add up as the whole's.
TEST(D4pgAgentTest, ReplicasWithShardedOptimizerStateEqualOneReplicaWithAdam) {
  const ObservationSpec spec{.state_size = 3};
  config::ExperimentConfig c = ClippedConfig();
  auto train = [&](int k, bool sharded, std::vector<nn::CheckpointTensor>* start = nullptr) {
    config::ExperimentConfig run = c;
    if (sharded) run.mutable_learner()->mutable_engine()->set_shard_state(config::EngineConfig::OPTIMIZER);
    auto replicator = MakeReplicator(k);
    auto agent = D4pgAgent::Create(run, spec, /*action_size=*/2, replicator.get());
    EXPECT_TRUE(agent.ok()) << agent.status();
    if (start != nullptr) *start = (*agent)->CheckpointState();
    for (uint64_t step = 0; step < 20; ++step) EXPECT_TRUE((*agent)->Train(1, Bandit(spec, 2, c, step)).ok());
    return std::pair{(*agent)->CheckpointState(), (*agent)->optimizer_state_bytes()};
  };
  std::vector<nn::CheckpointTensor> start;
  const auto [whole, whole_bytes] = train(1, false, &start);
  for (int k : {2, 4}) {
    SCOPED_TRACE(absl::StrCat("K=", k));
    const auto [sharded, bytes] = train(k, true);
    TROUPE_EXPECT_SAME_STATE(start, whole, sharded, .tolerance = 1e-4);
    // Each replica keeps 1/K of the moments (and the padding to K parts).
    EXPECT_LE(double(bytes) / whole_bytes, 1.0 / k + 0.01);
    EXPECT_GE(double(bytes) / whole_bytes, 1.0 / k);
  }
}

// engine.shard_state PARAMETERS (ZeRO stage 3): K=2 and K=4 replicas each
// keeping 1/K of the networks' and targets' values, of their gradients and
// of Adam's moments, gathering a network whole for the part of the update
// that reads it: 20 updates with clipping end where one replica with Adam on
// the whole batch ends (whole state within 1e-4, every part moved), the
// actors' policy (assembled from the parts) within 1e-4 too, and what a
// replica keeps between updates is at most 0.35x of one unsplit replica's
// (1/K and the padding to K parts: 0.25x at K=4). From pixels (the encoder
// in the critic's parts, random shifts per replica), K=2 split equals K=2
// unsplit on the same shards.
TEST(D4pgAgentTest, ReplicasWithSplitParametersEqualOneReplicaWithTheWholeModel) {
  const ObservationSpec spec{.state_size = 3};
  config::ExperimentConfig c = ClippedConfig();
  struct Trained {
    std::vector<nn::CheckpointTensor> state;
    std::vector<float> policy;
    int64_t kept_bytes = 0;
  };
  auto train = [](const config::ExperimentConfig& c, const ObservationSpec& spec, int action_size, int k,
                  config::EngineConfig::ShardState shard, int steps, std::vector<nn::CheckpointTensor>* start) {
    config::ExperimentConfig run = c;
    run.mutable_learner()->mutable_engine()->set_shard_state(shard);
    auto replicator = MakeReplicator(k);
    auto agent = D4pgAgent::Create(run, spec, action_size, replicator.get());
    EXPECT_TRUE(agent.ok()) << agent.status();
    if (start != nullptr) *start = (*agent)->CheckpointState();
    for (int step = 0; step < steps; ++step) {
      EXPECT_TRUE((*agent)->Train(1, Bandit(spec, action_size, c, step)).ok());
    }
    Trained t{(*agent)->CheckpointState(), {}, (*agent)->parameter_state_bytes() + (*agent)->optimizer_state_bytes()};
    (*agent)->PolicyParameters(&t.policy);
    return t;
  };
  std::vector<nn::CheckpointTensor> start;
  const Trained whole = train(c, spec, 2, 1, config::EngineConfig::NONE, 20, &start);
  for (int k : {2, 4}) {
    SCOPED_TRACE(absl::StrCat("K=", k));
    const Trained split = train(c, spec, 2, k, config::EngineConfig::PARAMETERS, 20, nullptr);
    TROUPE_EXPECT_SAME_STATE(start, whole.state, split.state, .tolerance = 1e-4);
    ASSERT_EQ(split.policy.size(), whole.policy.size());
    for (size_t i = 0; i < whole.policy.size(); ++i) {
      ASSERT_NEAR(split.policy[i], whole.policy[i], 1e-4 * std::fabs(whole.policy[i]) + 1e-6) << "policy " << i;
    }
    const double kept = double(split.kept_bytes) / whole.kept_bytes;
    std::printf("K=%d: a replica keeps %.3fx of one unsplit replica's state between updates\n", k, kept);
    EXPECT_LE(kept, 1.0 / k + 0.05);
    if (k == 4) {
      EXPECT_LE(kept, 0.35);
    }
  }

  const ObservationSpec pixels{.frames = 2, .height = 32, .width = 32};
  config::ExperimentConfig p = TinyConfig(/*batch=*/8, {32});
  p.mutable_d4pg()->set_encoder_features(16);
  p.mutable_d4pg()->set_conv_channels(8);
  p.mutable_d4pg()->set_augment_pad(2);
  p.mutable_d4pg()->set_target_tau(0.2f);
  std::vector<nn::CheckpointTensor> pixel_start;
  const Trained unsplit = train(p, pixels, 1, 2, config::EngineConfig::NONE, 5, &pixel_start);
  const Trained split = train(p, pixels, 1, 2, config::EngineConfig::PARAMETERS, 5, nullptr);
  TROUPE_EXPECT_SAME_STATE(pixel_start, unsplit.state, split.state, .tolerance = 1e-4);
}

// engine.shard_state OPTIMIZER on two replicas in one compiled PJRT program
// (the CPU plugin's devices): the reduce-scatter, the clip's norm and the
// all-gather are collectives of the update's one program, and 20 updates
// with clipping end where one replica with Adam on the whole batch ends,
// whole state within 1e-4 (every part moved by more).
TEST(D4pgAgentTest, TwoPjrtReplicasWithShardedOptimizerStateEqualOneReplicaWithAdam) {
  absl::StatusOr<config::EngineConfig> engine = TwoPjrtReplicas();
  if (!engine.ok()) GTEST_SKIP() << engine.status().message();
  const ObservationSpec spec{.state_size = 3};
  config::ExperimentConfig c = ClippedConfig();
  std::vector<std::vector<nn::CheckpointTensor>> states;
  for (int k : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << k << " replica(s)");
    config::ExperimentConfig run = c;
    if (k == 2) run.mutable_learner()->mutable_engine()->set_shard_state(config::EngineConfig::OPTIMIZER);
    auto replicator = MakeReplicator(k, *engine);
    auto agent = D4pgAgent::Create(run, spec, /*action_size=*/2, replicator.get());
    ASSERT_TRUE(agent.ok()) << agent.status();
    if (k == 1) states.push_back((*agent)->CheckpointState());  // the start
    for (uint64_t step = 0; step < 20; ++step) {
      std::vector<int64_t> launches;
      for (int r = 0; r < k; ++r) {
        launches.push_back(dynamic_cast<pjrt::PjrtBackend&>(*replicator->backend(r)).stats().launches);
      }
      ASSERT_TRUE((*agent)->Train(1, Bandit(spec, 2, c, step)).ok());
      for (int r = 0; r < k && k == 2; ++r) {
        const auto& backend = dynamic_cast<pjrt::PjrtBackend&>(*replicator->backend(r));
        EXPECT_EQ(backend.stats().launches - launches[r], 1) << "replica " << r << ": executions in one update";
        EXPECT_THAT(backend.last_program(), ::testing::HasSubstr("\"stablehlo.reduce_scatter\""));
        EXPECT_THAT(backend.last_program(), ::testing::HasSubstr("\"stablehlo.all_gather\""));
      }
    }
    if (k == 2) {
      // Each replica keeps half of Adam's moments.
      EXPECT_LE((*agent)->optimizer_state_bytes() * 2, D4pgReplicaStateBytes(c, spec, 2, 1).moments + 1024);
    }
    states.push_back((*agent)->CheckpointState());
  }
  TROUPE_EXPECT_SAME_STATE(states[0], states[1], states[2], .tolerance = 1e-4);
}

// engine.straggler DEADLINE: with a deadline no replica misses (100x the
// finishers' time) K=2 trains as K=1 on the whole batch, whole state within
// 1e-4, no late pass counted; at 1x (the mean of both, which the slower of
// two passes exceeds) passes are left, counted per replica, and training
// goes on with finite losses.
TEST(D4pgAgentTest, AStepDeadlineTrainsAsWaitingUntilMissedAndCountsLatePassesPerReplica) {
  const ObservationSpec spec{.state_size = 3};
  config::ExperimentConfig c = TinyConfig(/*batch=*/16, {32, 32});
  c.mutable_d4pg()->set_target_tau(0.1f);
  auto train = [&](int k, float deadline, AgentMetrics* metrics, std::vector<nn::CheckpointTensor>* start = nullptr) {
    config::ExperimentConfig run = c;
    if (deadline > 0) {
      run.mutable_learner()->mutable_engine()->set_straggler(config::EngineConfig::DEADLINE);
      run.mutable_learner()->mutable_engine()->set_straggler_deadline(deadline);
    }
    auto replicator = MakeReplicator(k);
    auto agent = D4pgAgent::Create(run, spec, /*action_size=*/2, replicator.get());
    EXPECT_TRUE(agent.ok()) << agent.status();
    if (start != nullptr) *start = (*agent)->CheckpointState();
    for (uint64_t step = 0; step < 20; ++step) EXPECT_TRUE((*agent)->Train(1, Bandit(spec, 2, c, step)).ok());
    *metrics = (*agent)->metrics();
    return (*agent)->CheckpointState();
  };
  std::vector<nn::CheckpointTensor> start;
  AgentMetrics whole_metrics, never_metrics, tight_metrics;
  const auto whole = train(1, 0, &whole_metrics, &start);
  const auto never = train(2, 100, &never_metrics);
  TROUPE_EXPECT_SAME_STATE(start, whole, never, .tolerance = 1e-4);
  EXPECT_EQ(never_metrics["late_backward.replica0"] + never_metrics["late_backward.replica1"], 0);
  EXPECT_EQ(whole_metrics.values.size(), 3u) << "no late counts without a deadline";
  train(2, 1.0f, &tight_metrics);
  ASSERT_EQ(tight_metrics.values.size(), 5u);
  EXPECT_EQ(tight_metrics.values[3].first, "late_backward.replica0");
  EXPECT_EQ(tight_metrics.values[4].first, "late_backward.replica1");
  EXPECT_GT(tight_metrics["late_backward.replica0"] + tight_metrics["late_backward.replica1"], 0);
  EXPECT_TRUE(std::isfinite(tight_metrics["critic_loss"]));
}

// A run of 4 replicas on devices of a budget between what a replica needs
// with `refused` sharding and with `split` (networks 1024 wide; the sizes
// are the agent's own, D4pgReplicaStateBytes; the budget is each replica's
// backend's too, nn::Backend's memory budget): Create with `refused` is
// InvalidArgument naming the budget, the sizes and `advice`; with `split`
// 5 updates end where one replica without a budget ends (within 1e-4),
// every allocation (state, activations, batches) kept to the budget: each
// device's peak under it and above what the replica keeps; its checkpoint,
// saved and loaded on devices of the same budget (what is split assembled
// and split on the host), is the state it saved.
struct BudgetRun {
  config::ExperimentConfig refused, split;
  D4pgReplicaState split_bytes;
  int64_t budget_mib = 0;
  std::unique_ptr<replicator::Replicator> four, one;
  std::unique_ptr<D4pgAgent> agent, reference;
};
void TrainUnderABudgetThatRefuses(config::EngineConfig::ShardState refused, config::EngineConfig::ShardState split,
                                  const std::string& advice, BudgetRun* run) {
  const ObservationSpec spec{.state_size = 3};
  run->refused = TinyConfig(/*batch=*/16, {1024, 1024});
  run->refused.mutable_learner()->mutable_engine()->set_shard_state(refused);
  run->split = run->refused;
  run->split.mutable_learner()->mutable_engine()->set_shard_state(split);
  const D4pgReplicaState refused_bytes = D4pgReplicaStateBytes(run->refused, spec, 2, 4);
  run->split_bytes = D4pgReplicaStateBytes(run->split, spec, 2, 4);
  const int64_t budget_mib = run->budget_mib = (refused_bytes.total() + run->split_bytes.total()) / 2 >> 20;
  ASSERT_LT(run->split_bytes.total(), budget_mib << 20);
  ASSERT_GT(refused_bytes.total(), budget_mib << 20);
  std::printf("a replica of 4: %.1f MiB with shard_state %s, %.1f MiB with %s (%.1f kept, %.1f gathered at most); "
              "budget %lld MiB\n",
              refused_bytes.total() / double(1 << 20), config::EngineConfig::ShardState_Name(refused).c_str(),
              run->split_bytes.total() / double(1 << 20), config::EngineConfig::ShardState_Name(split).c_str(),
              run->split_bytes.kept() / double(1 << 20), run->split_bytes.gathered / double(1 << 20),
              static_cast<long long>(budget_mib));
  run->refused.mutable_learner()->mutable_engine()->set_device_memory_mib(budget_mib);
  run->split.mutable_learner()->mutable_engine()->set_device_memory_mib(budget_mib);

  run->four = MakeReplicator(4, run->split.learner().engine());
  auto refusal = D4pgAgent::Create(run->refused, spec, 2, run->four.get());
  ASSERT_EQ(refusal.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refusal.status().message()),
              ::testing::HasSubstr(absl::StrCat("learner.engine.device_memory_mib ", budget_mib,
                                                ": a replica's training state needs ")));
  EXPECT_THAT(std::string(refusal.status().message()), ::testing::HasSubstr(advice));

  auto agent = D4pgAgent::Create(run->split, spec, 2, run->four.get());
  ASSERT_TRUE(agent.ok()) << agent.status();
  run->agent = std::move(*agent);
  EXPECT_EQ(run->agent->optimizer_state_bytes(), run->split_bytes.moments);
  config::ExperimentConfig unbudgeted = TinyConfig(/*batch=*/16, {1024, 1024});
  run->one = MakeReplicator(1);
  auto reference = D4pgAgent::Create(unbudgeted, spec, 2, run->one.get());
  ASSERT_TRUE(reference.ok());
  run->reference = std::move(*reference);
  EXPECT_EQ(run->reference->optimizer_state_bytes(), D4pgReplicaStateBytes(unbudgeted, spec, 2, 1).moments);
  const std::vector<nn::CheckpointTensor> start = run->reference->CheckpointState();
  for (uint64_t step = 0; step < 5; ++step) {
    ASSERT_TRUE(run->agent->Train(1, Bandit(spec, 2, run->split, step)).ok());
    ASSERT_TRUE(run->reference->Train(1, Bandit(spec, 2, unbudgeted, step)).ok());
  }
  TROUPE_EXPECT_SAME_STATE(start, run->reference->CheckpointState(), run->agent->CheckpointState(), .tolerance = 1e-4);
  for (int r = 0; r < 4; ++r) {
    const nn::Backend& device = *run->four->backend(r);
    EXPECT_EQ(device.memory_budget(), static_cast<size_t>(budget_mib) << 20);
    EXPECT_LE(device.peak_memory(), device.memory_budget()) << "replica " << r;
    EXPECT_GT(device.peak_memory(), static_cast<size_t>(run->split_bytes.kept())) << "replica " << r;
    std::printf("replica %d: peak %.1f MiB of its %lld MiB; %.1f MiB between updates (one unsplit replica: %.1f)\n",
                r, device.peak_memory() / double(1 << 20), static_cast<long long>(budget_mib),
                device.memory_in_use() / double(1 << 20), run->one->backend(0)->memory_in_use() / double(1 << 20));
  }
  const std::string path = TempPath("d4pg_budget_checkpoint");
  ASSERT_TRUE(run->agent->Save(path).ok());
  auto again_replicator = MakeReplicator(4, run->split.learner().engine());
  auto again = D4pgAgent::Create(run->split, spec, 2, again_replicator.get());
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE((*again)->Load(path).ok());
  const std::vector<nn::CheckpointTensor> saved = run->agent->CheckpointState();
  TROUPE_EXPECT_SAME_STATE(saved, saved, (*again)->CheckpointState(), .tolerance = 0);
  std::filesystem::remove(path);
}

// learner.engine.device_memory_mib between what a replica keeps with Adam's
// moments whole and split over 4: the unsplit run is refused, the split one
// trains under it (TrainUnderABudgetThatRefuses). The whole state on those
// devices, the agent's own check skipped, stops the process at the
// allocation past the budget, naming the sizes.
TEST(D4pgAgentTest, ADeviceBudgetRefusesTheWholeStateAndTheSplitOneTrainsUnderIt) {
  BudgetRun run;
  ASSERT_NO_FATAL_FAILURE(TrainUnderABudgetThatRefuses(config::EngineConfig::NONE, config::EngineConfig::OPTIMIZER,
                                                       "shard_state OPTIMIZER", &run));
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  config::ExperimentConfig unchecked = run.refused;
  unchecked.mutable_learner()->mutable_engine()->set_device_memory_mib(0);
  EXPECT_DEATH(
      {
        auto budgeted = MakeReplicator(4, run.split.learner().engine());
        auto agent = D4pgAgent::Create(unchecked, {.state_size = 3}, 2, budgeted.get());
        TROUPE_CHECK(agent.ok());
        (void)(*agent)->Train(1, Bandit({.state_size = 3}, 2, unchecked, 0));
      },
      absl::StrCat("cpu backend: out of its memory budget: .* MiB asked with .* MiB in use, over the budget of ",
                   run.budget_mib, ".00 MiB"));
}

// A device too small for Adam's moments split over 4 (refused, naming
// PARAMETERS) trains with the parameters split too
// (TrainUnderABudgetThatRefuses); what the agent says a replica keeps is
// its parts, and between updates each device holds at most 0.35x of what
// the unbudgeted replica's does.
TEST(D4pgAgentTest, ADeviceTooSmallForSplitMomentsTrainsWithSplitParameters) {
  BudgetRun run;
  ASSERT_NO_FATAL_FAILURE(TrainUnderABudgetThatRefuses(config::EngineConfig::OPTIMIZER,
                                                       config::EngineConfig::PARAMETERS, "shard_state PARAMETERS",
                                                       &run));
  EXPECT_EQ(run.agent->parameter_state_bytes(),
            run.split_bytes.networks + run.split_bytes.gradients + run.split_bytes.targets);
  const size_t reference_in_use = run.one->backend(0)->memory_in_use();
  for (int r = 0; r < 4; ++r) {
    EXPECT_LE(double(run.four->backend(r)->memory_in_use()), 0.35 * reference_in_use) << "replica " << r;
  }
}

// A checkpoint saved with sharded state resumes at another replica count,
// sharded either way or not: saved by K=4 with Adam's moments split (the
// moments gathered from every replica) or with the parameters split too
// (every network assembled from the parts), and by K=1 unsplit; resumed at
// K=4 and K=2 with either split and at K=1 unsplit. 10 + 10 updates end
// where 20 uninterrupted ones do.
TEST(D4pgAgentTest, AShardedCheckpointResumesAtAnotherReplicaCountAndUnsharded) {
  const ObservationSpec spec{.state_size = 3};
  config::ExperimentConfig c = TinyConfig(/*batch=*/16, {32, 32});
  c.mutable_d4pg()->set_target_tau(0.1f);
  const std::string path = TempPath("d4pg_sharded_checkpoint");
  using Shard = config::EngineConfig::ShardState;
  auto make = [&](int k, Shard shard, std::unique_ptr<replicator::Replicator>* replicator) {
    config::ExperimentConfig run = c;
    run.mutable_learner()->mutable_engine()->set_shard_state(shard);
    *replicator = MakeReplicator(k);
    auto agent = D4pgAgent::Create(run, spec, 2, replicator->get());
    TROUPE_CHECK(agent.ok());
    return std::move(agent).value();
  };
  std::unique_ptr<replicator::Replicator> r1;
  std::unique_ptr<D4pgAgent> whole = make(1, config::EngineConfig::NONE, &r1);
  const std::vector<nn::CheckpointTensor> start = whole->CheckpointState();
  for (uint64_t step = 0; step < 20; ++step) ASSERT_TRUE(whole->Train(1, Bandit(spec, 2, c, step)).ok());
  for (const auto& [saved_k, saved_shard] :
       {std::pair{4, config::EngineConfig::OPTIMIZER}, std::pair{4, config::EngineConfig::PARAMETERS},
        std::pair{1, config::EngineConfig::NONE}}) {
    std::unique_ptr<replicator::Replicator> saver_replicator, resumed_replicator;
    std::unique_ptr<D4pgAgent> saver = make(saved_k, saved_shard, &saver_replicator);
    for (uint64_t step = 0; step < 10; ++step) ASSERT_TRUE(saver->Train(1, Bandit(spec, 2, c, step)).ok());
    ASSERT_TRUE(saver->Save(path).ok());
    for (const auto& [k, shard] : {std::pair{4, config::EngineConfig::PARAMETERS},
                                   std::pair{2, config::EngineConfig::PARAMETERS},
                                   std::pair{2, config::EngineConfig::OPTIMIZER}, std::pair{1, config::EngineConfig::NONE}}) {
      SCOPED_TRACE(absl::StrCat("saved at K=", saved_k, " ", config::EngineConfig::ShardState_Name(saved_shard),
                                ", resumed at K=", k, " ", config::EngineConfig::ShardState_Name(shard)));
      std::unique_ptr<D4pgAgent> resumed = make(k, shard, &resumed_replicator);
      const absl::Status loaded = resumed->Load(path);
      ASSERT_TRUE(loaded.ok()) << loaded;
      for (uint64_t step = 10; step < 20; ++step) ASSERT_TRUE(resumed->Train(1, Bandit(spec, 2, c, step)).ok());
      TROUPE_EXPECT_SAME_STATE(start, whole->CheckpointState(), resumed->CheckpointState(), .tolerance = 1e-4);
    }
  }
  std::filesystem::remove(path);
}

// Trains `before` updates, saves, trains `after` more; a fresh agent loading
// the file and training the same `after` updates must end identical.
void ExpectSaveLoadContinuesIdentically(const config::ExperimentConfig& c, const ObservationSpec& spec) {
  const std::string path = TempPath("d4pg_checkpoint");
  auto replicator = MakeReplicator(1);
  auto a = D4pgAgent::Create(c, spec, /*action_size=*/1, replicator.get());
  ASSERT_TRUE(a.ok()) << a.status();
  for (uint64_t s = 0; s < 2; ++s) ASSERT_TRUE((*a)->Train(1, Bandit(spec, 1, c, s)).ok());
  ASSERT_TRUE((*a)->Save(path).ok());
  for (uint64_t s = 2; s < 4; ++s) ASSERT_TRUE((*a)->Train(1, Bandit(spec, 1, c, s)).ok());

  auto b = D4pgAgent::Create(c, spec, 1, replicator.get());
  ASSERT_TRUE(b.ok());
  const absl::Status loaded = (*b)->Load(path);
  ASSERT_TRUE(loaded.ok()) << loaded;
  EXPECT_EQ((*b)->updates(), 2);
  for (uint64_t s = 2; s < 4; ++s) ASSERT_TRUE((*b)->Train(1, Bandit(spec, 1, c, s)).ok());
  EXPECT_EQ((*b)->updates(), 4);
  EXPECT_EQ(Snapshot(**a), Snapshot(**b)) << "training after Load diverged";
  // And the whole state (targets, Adam moments) matches: same checkpoint bytes.
  ASSERT_TRUE((*a)->Save(path + ".a").ok());
  ASSERT_TRUE((*b)->Save(path + ".b").ok());
  auto read = [](const std::string& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  EXPECT_TRUE(read(path + ".a") == read(path + ".b"));
  for (const std::string& p : {path, path + ".a", path + ".b"}) std::filesystem::remove(p);
}

TEST(D4pgAgentTest, SaveThenLoadContinuesIdenticallyFromState) {
  ExpectSaveLoadContinuesIdentically(TinyConfig(/*batch=*/8, {16, 16}), {.state_size = 2});
}

config::ExperimentConfig PixelConfig() {
  config::ExperimentConfig c = TinyConfig(/*batch=*/4, {16});
  c.mutable_d4pg()->set_encoder_features(8);
  c.mutable_d4pg()->set_conv_channels(4);
  c.mutable_d4pg()->set_augment_pad(2);
  return c;
}

TEST(D4pgAgentTest, SaveThenLoadContinuesIdenticallyFromPixelsWithAugmentation) {
  ExpectSaveLoadContinuesIdentically(PixelConfig(), {.frames = 2, .height = 16, .width = 16});
}

TEST(D4pgAgentTest, LoadingACheckpointOfOtherNetworksNamesTheParameter) {
  const std::string path = TempPath("d4pg_mismatch");
  auto replicator = MakeReplicator(1);
  auto a = D4pgAgent::Create(TinyConfig(8, {16}), {.state_size = 2}, 1, replicator.get());
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE((*a)->Save(path).ok());
  auto b = D4pgAgent::Create(TinyConfig(8, {12}), {.state_size = 2}, 1, replicator.get());
  ASSERT_TRUE(b.ok());
  const absl::Status s = (*b)->Load(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("critic.0.w"));
  std::filesystem::remove(path);
}

TEST(D4pgAgentTest, PixelSmokeTrainsWithFiniteLossesAndActs) {
  const ObservationSpec spec{.frames = 3, .height = 16, .width = 16};
  const config::ExperimentConfig c = PixelConfig();
  auto replicator = MakeReplicator(1);
  auto agent = D4pgAgent::Create(c, spec, /*action_size=*/2, replicator.get());
  ASSERT_TRUE(agent.ok()) << agent.status();
  const absl::Status s = (*agent)->Train(2, Bandit(spec, 2, c, /*seed=*/5));
  ASSERT_TRUE(s.ok()) << s;
  const AgentMetrics m = (*agent)->metrics();
  EXPECT_EQ(m.updates, 2);
  EXPECT_TRUE(std::isfinite(m["critic_loss"]) && std::isfinite(m["actor_loss"]) && std::isfinite(m["q_mean"]));
  EXPECT_GT(m["critic_loss"], 0);

  // The policy acts on replay-layout pixels with the learner's parameters.
  auto policy = D4pgPolicy::Create(c.d4pg(), spec, 2);
  ASSERT_TRUE(policy.ok());
  std::vector<float> params;
  (*agent)->PolicyParameters(&params);
  EXPECT_EQ(static_cast<int64_t>(params.size()), (*policy)->num_parameters());
  ASSERT_TRUE((*policy)->SetParameters(params).ok());
  std::vector<uint8_t> pixels(5 * 3 * 16 * 16 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7);
  std::vector<float> actions(5 * 2);
  ASSERT_TRUE((*policy)->Act(nullptr, pixels.data(), 5, actions.data()).ok());
  for (float a : actions) EXPECT_TRUE(a >= -1.0f && a <= 1.0f);
  EXPECT_THAT((*policy)->Act(nullptr, nullptr, 5, actions.data()).message(), HasSubstr("observes pixels"));
}

TEST(D4pgAgentTest, PrioritizedReportsOneLossPerSampledItem) {
  config::ExperimentConfig c = TinyConfig(/*batch=*/8, {8});
  c.mutable_learner()->set_prioritized(true);
  auto replicator = MakeReplicator(2);
  auto agent = D4pgAgent::Create(c, {.state_size = 2}, 1, replicator.get());
  ASSERT_TRUE(agent.ok());
  ASSERT_TRUE((*agent)->Train(1, Bandit({.state_size = 2}, 1, c, 0)).ok());
  std::vector<uint64_t> keys;
  std::vector<double> priorities;
  (*agent)->LastPriorities(&keys, &priorities);
  EXPECT_THAT(keys, ElementsAre(0, 1, 2, 3, 4, 5, 6, 7));
  ASSERT_EQ(priorities.size(), 8u);
  for (double p : priorities) EXPECT_GT(p, 0);
}

// The strict CPU device (memory the host cannot touch between kernels): D4PG
// updates from state and from pixels (with augmentation and prioritized
// weights) run on it and equal the CPU's bit for bit, checkpoints included.
TEST(D4pgAgentTest, UpdatesOnTheStrictDeviceEqualTheCpuBitForBit) {
  for (const auto& [base, spec] : {std::pair{TinyConfig(8, {16, 16}), ObservationSpec{.state_size = 2}},
                                   std::pair{PixelConfig(), ObservationSpec{.frames = 2, .height = 16, .width = 16}}}) {
    config::ExperimentConfig cpu_config = base;
    cpu_config.mutable_learner()->set_prioritized(true);
    config::ExperimentConfig strict_config = cpu_config;
    strict_config.mutable_learner()->mutable_engine()->set_device(config::EngineConfig::CPU_STRICT);
    auto cpu_replicator = MakeReplicator(1);
    auto strict_replicator = MakeReplicator(1, config::EngineConfig::CPU_STRICT);
    auto cpu = D4pgAgent::Create(cpu_config, spec, /*action_size=*/1, cpu_replicator.get());
    auto strict = D4pgAgent::Create(strict_config, spec, 1, strict_replicator.get());
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    ASSERT_TRUE(strict.ok()) << strict.status();
    const std::vector<nn::CheckpointTensor> start = (*cpu)->CheckpointState();
    for (uint64_t s = 0; s < 3; ++s) {
      ASSERT_TRUE((*cpu)->Train(1, Bandit(spec, 1, cpu_config, s)).ok());
      ASSERT_TRUE((*strict)->Train(1, Bandit(spec, 1, strict_config, s)).ok());
    }
    SCOPED_TRACE(spec.pixels() ? "pixels" : "state");
    // Bit for bit, and every part of the state moved.
    TROUPE_EXPECT_SAME_STATE(start, (*cpu)->CheckpointState(), (*strict)->CheckpointState(), .tolerance = 0,
                             .moved_at_least = 1e-7);
    std::vector<uint64_t> cpu_keys, strict_keys;
    std::vector<double> cpu_priorities, strict_priorities;
    (*cpu)->LastPriorities(&cpu_keys, &cpu_priorities);
    (*strict)->LastPriorities(&strict_keys, &strict_priorities);
    EXPECT_EQ(cpu_priorities, strict_priorities);
    EXPECT_EQ((*cpu)->metrics()["critic_loss"], (*strict)->metrics()["critic_loss"]);
  }
}

// --- The policy apart from the agent --------------------------------------------

TEST(ObservationSpecOfTest, PixelsWhenTheEnvRendersThemElseTheStateVector) {
  envs::EnvSpec pixels;
  pixels.state_size = 5;
  pixels.height = 84;
  pixels.width = 64;
  pixels.channels = 9;  // 3 stacked RGB frames
  const ObservationSpec p = ObservationSpecOf(pixels);
  EXPECT_TRUE(p.pixels());
  EXPECT_EQ(p.frames, 3);
  EXPECT_EQ(p.height, 84);
  EXPECT_EQ(p.width, 64);
  EXPECT_EQ(p.state_size, 0);
  envs::EnvSpec state;
  state.state_size = 5;
  const ObservationSpec s = ObservationSpecOf(state);
  EXPECT_FALSE(s.pixels());
  EXPECT_EQ(s.state_size, 5);
}

// The viewer's path: the policy reads its own parameters out of the agent's
// checkpoint, with no agent or Replicator built.
TEST(D4pgPolicyTest, LoadAgentCheckpointTakesTheAgentsPolicyParametersAndUpdates) {
  for (const auto& [config, spec] : {std::pair{TinyConfig(8, {16, 16}), ObservationSpec{.state_size = 2}},
                                     std::pair{PixelConfig(), ObservationSpec{.frames = 2, .height = 16, .width = 16}}}) {
    const std::string path = TempPath("d4pg_policy_load");
    auto replicator = MakeReplicator(1);
    auto agent = D4pgAgent::Create(config, spec, /*action_size=*/1, replicator.get());
    ASSERT_TRUE(agent.ok()) << agent.status();
    for (uint64_t s = 0; s < 3; ++s) ASSERT_TRUE((*agent)->Train(1, Bandit(spec, 1, config, s)).ok());
    ASSERT_TRUE((*agent)->Save(path).ok());
    std::vector<float> expected;
    (*agent)->PolicyParameters(&expected);

    auto policy = D4pgPolicy::Create(config.d4pg(), spec, 1);
    ASSERT_TRUE(policy.ok()) << policy.status();
    auto updates = (*policy)->LoadAgentCheckpoint(path);
    ASSERT_TRUE(updates.ok()) << updates.status();
    EXPECT_EQ(*updates, 3);
    EXPECT_EQ((*policy)->DownloadParameters(), expected)
        << "the policy's parameters differ from the agent's PolicyParameters";
    std::filesystem::remove(path);
  }
}

// The policy on the strict CPU device (a device of its own) acts as on the CPU.
TEST(D4pgPolicyTest, ActsOnTheStrictDeviceAsOnTheCpu) {
  const ObservationSpec spec{.frames = 2, .height = 16, .width = 16};
  const config::ExperimentConfig c = PixelConfig();
  auto cpu = D4pgPolicy::Create(c.d4pg(), spec, 2);
  auto strict = D4pgPolicy::Create(c.d4pg(), spec, 2, std::make_unique<nn::StrictCpuBackend>(1));
  ASSERT_TRUE(cpu.ok() && strict.ok());
  std::vector<float> params((*cpu)->num_parameters());
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  for (float& p : params) p = normal(rng);
  ASSERT_TRUE((*cpu)->SetParameters(params).ok());
  ASSERT_TRUE((*strict)->SetParameters(params).ok());
  EXPECT_EQ((*strict)->DownloadParameters(), params);
  std::vector<uint8_t> pixels(4 * 2 * 16 * 16 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<uint8_t>(i * 7 % 256);
  std::vector<float> a(4 * 2), b(4 * 2);
  ASSERT_TRUE((*cpu)->Act(nullptr, pixels.data(), 4, a.data()).ok());
  ASSERT_TRUE((*strict)->Act(nullptr, pixels.data(), 4, b.data()).ok());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, std::vector<float>(8, 0.0f));
}

TEST(D4pgPolicyTest, AnAgentCheckpointOfOtherNetworksIsRefusedAndChangesNothing) {
  const std::string path = TempPath("d4pg_policy_mismatch");
  auto replicator = MakeReplicator(1);
  auto agent = D4pgAgent::Create(TinyConfig(8, {16}), {.state_size = 2}, 1, replicator.get());
  ASSERT_TRUE(agent.ok());
  ASSERT_TRUE((*agent)->Save(path).ok());
  auto policy = D4pgPolicy::Create(TinyConfig(8, {12}).d4pg(), {.state_size = 2}, 1);
  ASSERT_TRUE(policy.ok());
  const std::vector<float> before = (*policy)->DownloadParameters();
  auto updates = (*policy)->LoadAgentCheckpoint(path);
  EXPECT_EQ(updates.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(updates.status().message(), HasSubstr("param/actor/actor.0.w"));
  EXPECT_EQ((*policy)->DownloadParameters(), before);
  EXPECT_EQ((*policy)->LoadAgentCheckpoint(path + ".missing").status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace troupe::agents
