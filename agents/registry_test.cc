// The agent registry (agents/policies.h, agents/agents.h): what the parts
// that act and the learner get for a config's agent, and D4PG's exploration
// as its Policy gives it to actors.
#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "agents/agents.h"
#include "agents/d4pg_policy.h"
#include "agents/transition.h"
#include "common/config.h"
#include "engine/engine_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::agents {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

config::ExperimentConfig Parse(const std::string& text) {
  config::ExperimentConfig config;
  const absl::Status parsed = ParseTextConfig(text, "test.textproto", &config);
  EXPECT_TRUE(parsed.ok()) << parsed;
  return config;
}

constexpr char kStateRun[] = R"(mode: RL
env { task: "cartpole.swingup" observation: STATE }
d4pg { hidden: [16, 16] atoms: 11 n_step: 4 discount: 0.97 }
actors { count: 3 noise_min: 0.1 noise_max: 0.3 noise_initial: 0.9 noise_decay_frames: 1000 }
learner { batch_size: 8 }
)";
const ObservationSpec kState{.state_size = 5};

TEST(AgentRegistryTest, AConfigFromBeforeTheAgentFieldTrainsD4pg) {
  const config::ExperimentConfig config = Parse(kStateRun);
  EXPECT_FALSE(config.has_agent());
  EXPECT_EQ(config.agent(), config::ExperimentConfig::D4PG);
  EXPECT_EQ(AgentName(config), "D4PG");
  EXPECT_EQ(AgentName(Parse(std::string(kStateRun) + "agent: D4PG\n")), "D4PG");
}

TEST(AgentRegistryTest, AnAgentThatDoesNotExistIsRefusedNamingTheLine) {
  config::ExperimentConfig config;
  const absl::Status parsed = ParseTextConfig("mode: RL\nagent: NO_SUCH_AGENT\n", "run.textproto", &config);
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.message(), HasSubstr("run.textproto:2"));
  EXPECT_THAT(parsed.message(), HasSubstr("NO_SUCH_AGENT"));
}

TEST(AgentRegistryTest, ValidationNamesTheAgentsField) {
  config::ExperimentConfig config = Parse(kStateRun);
  config.mutable_d4pg()->set_atoms(1);
  const absl::Status status = ValidateAgent(config, kState, 1);
  EXPECT_TRUE(absl::IsInvalidArgument(status));
  EXPECT_THAT(status.message(), HasSubstr("d4pg.atoms 1"));
  // CreatePolicy and CreateAgent refuse it the same way, before building anything.
  EXPECT_EQ(CreatePolicy(config, kState, 1).status(), status);
  auto replicator = engine::MakeReplicator(config.learner().engine());
  ASSERT_TRUE(replicator.ok()) << replicator.status();
  EXPECT_EQ(CreateAgent(config, kState, 1, replicator->get()).status(), status);
  EXPECT_EQ(CheckAgentStepFits(config, kState, 1), status);
}

TEST(AgentRegistryTest, TheActorsItemAndTheLearnersTableAreTheAgentsTransitions) {
  const config::ExperimentConfig config = Parse(kStateRun);
  const ReplayItem item = ActorReplayItem(config);
  EXPECT_EQ(item.n_step, 4);
  EXPECT_FLOAT_EQ(item.discount, 0.97f);
  const config::ReplayTableConfig table = AgentReplayTable(config, kState, 1);
  EXPECT_EQ(table.name(), kTransitionTable);
  EXPECT_GT(table.fields_size(), 0);
}

TEST(AgentRegistryTest, ThePolicyAndTheAgentShareOneParameterLayout) {
  const config::ExperimentConfig config = Parse(kStateRun);
  auto replicator = engine::MakeReplicator(config.learner().engine());
  ASSERT_TRUE(replicator.ok()) << replicator.status();
  auto agent = CreateAgent(config, kState, 1, replicator->get());
  ASSERT_TRUE(agent.ok()) << agent.status();
  auto policy = CreatePolicy(config, kState, 1);
  ASSERT_TRUE(policy.ok()) << policy.status();
  std::vector<float> parameters;
  (*agent)->PolicyParameters(&parameters);
  EXPECT_EQ((*policy)->num_parameters(), (*agent)->num_policy_parameters());
  ASSERT_TRUE((*policy)->SetParameters(parameters).ok());
  EXPECT_EQ((*policy)->DownloadParameters(), parameters);
  EXPECT_EQ((*policy)->spec().state_size, 5);
  EXPECT_EQ((*policy)->action_size(), 1);
  // A wrong size says both.
  parameters.pop_back();
  EXPECT_THAT((*policy)->SetParameters(parameters).message(),
              HasSubstr("got " + std::to_string(parameters.size()) + " floats, expected"));
}

config::ActorsConfig Spread(int count) {
  config::ActorsConfig actors;
  actors.set_count(count);
  actors.set_noise_min(0.1f);
  actors.set_noise_max(0.3f);
  return actors;
}

TEST(D4pgNoiseScaleTest, ActorsSpreadFromNoiseMinToNoiseMax) {
  const config::ActorsConfig actors = Spread(3);
  EXPECT_FLOAT_EQ(D4pgNoiseScale(actors, 0, 0), 0.1f);
  EXPECT_FLOAT_EQ(D4pgNoiseScale(actors, 1, 0), 0.2f);
  EXPECT_FLOAT_EQ(D4pgNoiseScale(actors, 2, 123456), 0.3f);
}

TEST(D4pgNoiseScaleTest, DecaysLinearlyFromNoiseInitialToTheActorsOwnScale) {
  config::ActorsConfig actors = Spread(2);
  actors.set_noise_initial(1.0f);
  actors.set_noise_decay_frames(1000);
  EXPECT_FLOAT_EQ(D4pgNoiseScale(actors, 0, 0), 1.0f);
  EXPECT_FLOAT_EQ(D4pgNoiseScale(actors, 0, 500), 0.55f);
  EXPECT_FLOAT_EQ(D4pgNoiseScale(actors, 1, 500), 0.65f);
  EXPECT_FLOAT_EQ(D4pgNoiseScale(actors, 0, 1000), 0.1f);
  EXPECT_FLOAT_EQ(D4pgNoiseScale(actors, 1, 5000), 0.3f);
}

// D4PG's exploration, as actors get it through Policy::Explore: the
// deterministic action plus N(0, scale^2), clamped, with each actor's scale
// spread from noise_min to noise_max after a decaying start.
TEST(AgentRegistryTest, D4pgExploresWithEachActorsOwnNoiseAroundItsDeterministicAction) {
  const config::ExperimentConfig config = Parse(kStateRun);
  constexpr int kBatch = 64;
  std::vector<float> state(kBatch * 5);
  for (size_t i = 0; i < state.size(); ++i) state[i] = std::sin(0.37f * i);
  auto deterministic = CreatePolicy(config, kState, 1);
  ASSERT_TRUE(deterministic.ok());
  std::vector<float> act(kBatch);
  ASSERT_TRUE((*deterministic)->Act(state.data(), nullptr, kBatch, act.data()).ok());

  for (const auto& [at, scale] : {std::pair{ExplorationPoint{.actor = 0, .frames = 5000}, 0.1f},
                                  std::pair{ExplorationPoint{.actor = 2, .frames = 5000}, 0.3f},
                                  std::pair{ExplorationPoint{.actor = 1, .frames = 0}, 0.9f},
                                  std::pair{ExplorationPoint{.actor = 1, .frames = 500}, 0.55f}}) {
    auto policy = CreatePolicy(config, kState, 1);
    ASSERT_TRUE(policy.ok());
    std::mt19937_64 rng(11), reference_rng(11);
    std::vector<float> explored(kBatch);
    ASSERT_TRUE((*policy)->Explore(state.data(), nullptr, kBatch, at, rng, explored.data(), nullptr).ok());
    std::normal_distribution<float> gaussian(0.0f, 1.0f);
    for (int i = 0; i < kBatch; ++i) {
      const float want = std::clamp(act[i] + scale * gaussian(reference_rng), -1.0f, 1.0f);
      ASSERT_NEAR(explored[i], want, 1e-6f) << "actor " << at.actor << " at " << at.frames << " frames, row " << i;
    }
    EXPECT_EQ((*policy)->DescribeExploration(at), absl::StrFormat("noise %.2f", scale));
  }
}

TEST(AgentRegistryTest, ArchitectureDifferencesNameTheAgentsFieldsWithBothValues) {
  const config::ExperimentConfig run = Parse(kStateRun);
  config::ExperimentConfig trained = run;
  EXPECT_TRUE(ArchitectureDifferences(trained, run).empty());
  trained.mutable_d4pg()->clear_hidden();
  trained.mutable_d4pg()->add_hidden(64);
  trained.mutable_d4pg()->set_atoms(51);
  EXPECT_THAT(ArchitectureDifferences(trained, run),
              ElementsAre("d4pg.hidden: checkpoint [64], run [16, 16]", "d4pg.atoms: checkpoint 51, run 11"));
  EXPECT_EQ(DescribeArchitecture(run), "d4pg.hidden [16, 16]");
}

// RANDOM, the agent written against the interfaces only: its policy draws
// uniform actions, its learner samples every replica's shard of each batch
// and learns nothing, and its checkpoint holds its update count.
TEST(AgentRegistryTest, TheRandomAgentSamplesEachShardAndCheckpointsItsUpdates) {
  config::ExperimentConfig config = Parse(std::string(kStateRun) + "agent: RANDOM\n");
  config.mutable_learner()->mutable_engine()->set_replicas(2);
  EXPECT_EQ(AgentName(config), "RANDOM");
  auto replicator = engine::MakeReplicator(config.learner().engine());
  ASSERT_TRUE(replicator.ok()) << replicator.status();
  auto agent = CreateAgent(config, kState, 1, replicator->get());
  ASSERT_TRUE(agent.ok()) << agent.status();
  EXPECT_TRUE(absl::IsFailedPrecondition((*agent)->Train(1)));
  std::vector<std::pair<int, int64_t>> calls;
  (*agent)->StartInput([&](int replica, int64_t n, replay::SampledBatch*) {
    calls.emplace_back(replica, n);
    return absl::OkStatus();
  });
  ASSERT_TRUE((*agent)->Train(3).ok());
  EXPECT_THAT(calls, ElementsAre(std::pair{0, 4}, std::pair{1, 4}, std::pair{0, 4}, std::pair{1, 4}, std::pair{0, 4},
                                 std::pair{1, 4}));
  EXPECT_EQ((*agent)->updates(), 3);
  EXPECT_EQ((*agent)->metrics().updates, 3);
  EXPECT_TRUE((*agent)->metrics().values.empty());
  // A sampler's error stops Train, naming the replica.
  (*agent)->StartInput([](int replica, int64_t, replay::SampledBatch*) {
    return replica == 1 ? absl::UnavailableError("replay went away") : absl::OkStatus();
  });
  EXPECT_EQ((*agent)->Train(1).message(), "replica 1: replay went away");

  const std::string dir = ::testing::TempDir();
  ASSERT_TRUE((*agent)->Save(dir + "/random.ckpt").ok());
  auto restored = CreateAgent(config, kState, 1, replicator->get());
  ASSERT_TRUE(restored.ok());
  EXPECT_NE((*restored)->StateChecksum(), (*agent)->StateChecksum());
  ASSERT_TRUE((*restored)->Load(dir + "/random.ckpt").ok());
  EXPECT_EQ((*restored)->updates(), 3);
  EXPECT_EQ((*restored)->StateChecksum(), (*agent)->StateChecksum());

  auto policy = CreatePolicy(config, kState, 1);
  ASSERT_TRUE(policy.ok());
  EXPECT_EQ((*policy)->LoadAgentCheckpoint(dir + "/random.ckpt").value_or(-1), 3);
  EXPECT_TRUE((*policy)->SetParameters({}).ok());
  const float one = 1;
  EXPECT_THAT((*policy)->SetParameters({&one, 1}).message(), HasSubstr("got 1 floats, expected 0"));
  std::vector<float> state(64 * 5, 0.0f), actions(64);
  ASSERT_TRUE((*policy)->Act(state.data(), nullptr, 64, actions.data()).ok());
  EXPECT_LE(*std::max_element(actions.begin(), actions.end()), 1.0f);
  EXPECT_GE(*std::min_element(actions.begin(), actions.end()), -1.0f);
  EXPECT_GT(*std::max_element(actions.begin(), actions.end()) - *std::min_element(actions.begin(), actions.end()), 1.0f);
  EXPECT_TRUE(absl::IsInvalidArgument((*policy)->Act(nullptr, nullptr, 64, actions.data())));
  EXPECT_EQ((*policy)->DescribeExploration({}), "uniform random");

  // Each agent's checkpoint is refused by the other's policy, naming what is missing.
  const config::ExperimentConfig d4pg = Parse(kStateRun);
  auto d4pg_policy = CreatePolicy(d4pg, kState, 1);
  ASSERT_TRUE(d4pg_policy.ok());
  EXPECT_TRUE(absl::IsInvalidArgument((*d4pg_policy)->LoadAgentCheckpoint(dir + "/random.ckpt").status()));
  auto d4pg_agent = CreateAgent(d4pg, kState, 1, replicator->get());
  ASSERT_TRUE(d4pg_agent.ok());
  ASSERT_TRUE((*d4pg_agent)->Save(dir + "/d4pg.ckpt").ok());
  const absl::Status refused = (*policy)->LoadAgentCheckpoint(dir + "/d4pg.ckpt").status();
  EXPECT_TRUE(absl::IsInvalidArgument(refused));
  EXPECT_THAT(refused.message(), HasSubstr("no entry 'param/random.updates'"));
  EXPECT_THAT(ArchitectureDifferences(d4pg, config), ElementsAre("agent: checkpoint D4PG, run RANDOM"));
}

}  // namespace
}  // namespace troupe::agents
