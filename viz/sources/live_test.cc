// The live source against a real EpisodeStream server on loopback: the
// evaluator's publisher on one side, LiveEpisodes replaying on the other.
#include "viz/sources/live.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <grpcpp/server_builder.h>

#include "actors/episode_stream.h"
#include "actors/evaluator.h"
#include "agents/policies.h"
#include "common/config.h"

namespace troupe::viz {
namespace {
using ::testing::HasSubstr;

// A server for `publisher` on a free loopback port.
struct Server {
  explicit Server(actors::EpisodePublisher* publisher) : service(publisher) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~Server() { server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200)); }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }

  actors::EpisodeStreamService service;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

bool WaitForFollowers(const actors::EpisodePublisher& publisher, int n) {
  for (int i = 0; i < 500 && publisher.followers() < n; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return publisher.followers() >= n;
}

TEST(LiveEpisodesTest, ReplaysThePublishedStatesInOrder) {
  actors::EpisodePublisher publisher("cartpole.swingup", /*action_repeat=*/2);
  Server server(&publisher);
  ASSERT_NE(server.server, nullptr);
  auto live = LiveEpisodes::Create(server.address());
  ASSERT_TRUE(live.ok()) << live.status();
  EXPECT_EQ((*live)->task(), "cartpole.swingup");
  EXPECT_THAT((*live)->Describe(), HasSubstr("cartpole.swingup from the evaluator at " + server.address()));
  ASSERT_TRUE(WaitForFollowers(publisher, 1));

  // An episode of a real cartpole, pushing right: 5 steps, the last one last.
  envs::EnvOptions options;
  options.task = "cartpole.swingup";
  options.pixels = false;
  options.action_repeat = 2;
  auto env = envs::MakeEnv(options);
  ASSERT_TRUE(env.ok()) << env.status();
  std::vector<float> state((*env)->spec().state_size);
  ASSERT_TRUE((*env)->Reset({state.data(), nullptr}).ok());
  std::vector<std::vector<double>> published;
  const mjModel* m = (*env)->model();
  publisher.BeginEpisode();
  publisher.Publish(m, (*env)->data(), 0, false, {}, 0, /*parameter_version=*/42);
  published.emplace_back((*env)->data()->qpos, (*env)->data()->qpos + m->nq);
  const float push = 1.0f;
  for (int step = 1; step <= 5; ++step) {
    auto timestep = (*env)->Step({&push, 1}, {state.data(), nullptr});
    ASSERT_TRUE(timestep.ok());
    publisher.Publish(m, (*env)->data(), step, step == 5, {&push, 1}, 0.5, 42);
    published.emplace_back((*env)->data()->qpos, (*env)->data()->qpos + m->nq);
  }

  // The viewer's physics thread: a reset takes the episode's first state,
  // then each step the next one, ending with kLast.
  for (int i = 0; i < 50 && (*live)->received() < 7; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ((*live)->received(), 7);  // the greeting and six states
  auto first = (*live)->ApplyReset();
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->step_type, envs::StepType::kFirst);
  EXPECT_DOUBLE_EQ((*live)->data()->qpos[0], published[0][0]);
  EXPECT_EQ((*live)->Version(), "version 42 (updates)");
  for (int step = 1; step <= 5; ++step) {
    ASSERT_TRUE((*live)->PrepareStep().ok());
    auto applied = (*live)->ApplyStep();
    ASSERT_TRUE(applied.ok());
    ASSERT_FALSE(applied->idle) << "step " << step;
    EXPECT_EQ(applied->step_type, step == 5 ? envs::StepType::kLast : envs::StepType::kMid);
    EXPECT_DOUBLE_EQ(applied->reward, 0.5);
    ASSERT_EQ(applied->action.size(), 1u);
    EXPECT_FLOAT_EQ(applied->action[0], 1.0f);
    for (int j = 0; j < m->nq; ++j) EXPECT_DOUBLE_EQ((*live)->data()->qpos[j], published[step][j]);
  }
  // The cart moved right, and the replayed state says so.
  EXPECT_GT((*live)->data()->qpos[0], published[0][0]);
  // Nothing more: an idle step that changes nothing.
  ASSERT_TRUE((*live)->PrepareStep().ok());
  auto idle = (*live)->ApplyStep();
  ASSERT_TRUE(idle.ok());
  EXPECT_TRUE(idle->idle);
}

TEST(LiveEpisodesTest, TheEvaluatorPublishesItsFirstEpisodeToFollowers) {
  config::ExperimentConfig config;
  ASSERT_TRUE(ParseTextConfig("mode: RL env { task: \"cartpole.swingup\" observation: STATE action_repeat: 4 }"
                              " d4pg { hidden: [16] }",
                              "config", &config)
                  .ok());
  auto policy = agents::CreatePolicy(config, {.state_size = 5}, /*action_size=*/1);
  ASSERT_TRUE(policy.ok()) << policy.status();
  actors::EpisodePublisher publisher("cartpole.swingup", 4);
  Server server(&publisher);
  auto live = LiveEpisodes::Create(server.address());
  ASSERT_TRUE(live.ok()) << live.status();
  ASSERT_TRUE(WaitForFollowers(publisher, 1));

  auto mean = actors::Evaluate(config, **policy, /*episodes=*/2, /*seed=*/1, &publisher, /*parameter_version=*/7);
  ASSERT_TRUE(mean.ok()) << mean.status();
  // cartpole.swingup: 1000 control steps = 250 agent steps at repeat 4, plus the reset state.
  for (int i = 0; i < 250 && (*live)->received() < 1 + 251; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ((*live)->received(), 1 + 251);
  ASSERT_TRUE((*live)->ApplyReset().ok());
  int steps = 0;
  bool last = false;
  while (!last) {
    ASSERT_TRUE((*live)->PrepareStep().ok());
    auto step = (*live)->ApplyStep();
    ASSERT_TRUE(step.ok());
    ASSERT_FALSE(step->idle) << "after " << steps << " steps";
    ++steps;
    last = step->step_type == envs::StepType::kLast;
  }
  EXPECT_EQ(steps, 250);
  EXPECT_EQ((*live)->Version(), "version 7 (updates)");
}

TEST(LiveEpisodesTest, NothingListeningIsUnavailableNamingTheAddress) {
  auto live = LiveEpisodes::Create("127.0.0.1:1", absl::Milliseconds(500));
  ASSERT_EQ(live.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(live.status().message(), HasSubstr("127.0.0.1:1"));
  EXPECT_THAT(live.status().message(), HasSubstr("troupe run"));
}

TEST(LiveEpisodesTest, AClosedPublisherEndsTheStreamAndTheSourceSaysReconnecting) {
  actors::EpisodePublisher publisher("cartpole.swingup", 2);
  Server server(&publisher);
  auto live = LiveEpisodes::Create(server.address());
  ASSERT_TRUE(live.ok()) << live.status();
  ASSERT_TRUE(WaitForFollowers(publisher, 1));
  publisher.Close();
  for (int i = 0; i < 100 && publisher.followers() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(publisher.followers(), 0);
  for (int i = 0; i < 100 && (*live)->Describe().find("reconnecting") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_THAT((*live)->Describe(), HasSubstr("reconnecting"));
}

}  // namespace
}  // namespace troupe::viz
