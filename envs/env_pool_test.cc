#include "envs/env_pool.h"

#include <cmath>
#include <random>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::envs {
namespace {

using ::testing::HasSubstr;

EnvPoolOptions PoolOptions(const std::string& task, bool pixels, int num_envs, int threads, int batch_size = 0) {
  EnvPoolOptions o;
  o.env.task = task;
  o.env.pixels = pixels;
  o.env.seed = 100;
  o.num_envs = num_envs;
  o.num_threads = threads;
  o.batch_size = batch_size;
  return o;
}

std::unique_ptr<EnvPool> MakePool(const EnvPoolOptions& options) {
  auto pool = EnvPool::Create(options);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return std::move(pool).value();
}

// The pool's env i behaves exactly like a lone env with the pool's seed for i.
TEST(EnvPoolTest, SyncStepMatchesLoneEnvsWithTheSameSeeds) {
  const auto options = PoolOptions("cartpole.swingup", /*pixels=*/true, /*num_envs=*/4, /*threads=*/2);
  auto pool = MakePool(options);
  ASSERT_EQ(pool->num_threads(), 2);
  std::vector<std::unique_ptr<Environment>> lone;
  for (int i = 0; i < 4; ++i) {
    EnvOptions env_options = options.env;
    env_options.seed = EnvPool::SeedFor(options.env.seed, i);
    lone.push_back(std::move(MakeEnv(env_options)).value());
  }
  const EnvSpec& spec = pool->spec();
  std::vector<float> state(spec.state_size);
  std::vector<uint8_t> pixels(spec.pixel_bytes());
  auto batch = pool->Reset();
  ASSERT_TRUE(batch.ok()) << batch.status();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(lone[i]->Reset({state.data(), pixels.data()}).ok());
    EXPECT_EQ(batch->env_id[i], i);
    EXPECT_EQ(batch->step_type[i], uint8_t(StepType::kFirst));
    EXPECT_TRUE(std::equal(state.begin(), state.end(), batch->state.begin() + i * spec.state_size));
  }
  std::vector<float> actions = {-1.0f, -0.3f, 0.3f, 1.0f};
  for (int step = 0; step < 10; ++step) {
    batch = pool->Step(actions);
    ASSERT_TRUE(batch.ok()) << batch.status();
    for (int i = 0; i < 4; ++i) {
      auto t = lone[i]->Step(std::span<const float>(&actions[i], 1), {state.data(), pixels.data()});
      ASSERT_TRUE(t.ok());
      EXPECT_EQ(batch->reward[i], t->reward) << "env " << i;
      EXPECT_TRUE(std::equal(state.begin(), state.end(), batch->state.begin() + i * spec.state_size)) << "env " << i;
      EXPECT_TRUE(std::equal(pixels.begin(), pixels.end(), batch->pixels.begin() + i * spec.pixel_bytes()))
          << "env " << i;
      EXPECT_EQ(batch->episode_step[i], step + 1);
    }
  }
}

// Many cheap envs on more threads than cores, with short episodes: every
// batch of the pool equals the same envs stepped in turn, whichever thread
// took (or stole) each env, across episode ends and resets.
TEST(EnvPoolTest, SyncBatchesOnManyThreadsEqualTheEnvsSteppedInTurn) {
  constexpr int kEnvs = 37, kThreads = 4;
  EnvPoolOptions options = PoolOptions("reacher.easy", /*pixels=*/false, kEnvs, kThreads);
  options.env.action_repeat = 25;  // 40 agent steps an episode
  auto pool = MakePool(options);
  ASSERT_EQ(pool->num_threads(), kThreads);
  std::vector<std::unique_ptr<Environment>> lone;
  for (int i = 0; i < kEnvs; ++i) {
    EnvOptions env_options = options.env;
    env_options.seed = EnvPool::SeedFor(options.env.seed, i);
    lone.push_back(std::move(MakeEnv(env_options)).value());
  }
  const EnvSpec& spec = pool->spec();
  std::vector<float> state(spec.state_size);
  std::vector<uint8_t> needs_reset(kEnvs, 1);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> actions(size_t(kEnvs) * spec.action_size);
  for (int step = 0; step < 150; ++step) {
    for (float& a : actions) a = uniform(rng);
    auto batch = pool->Step(actions);
    ASSERT_TRUE(batch.ok()) << batch.status();
    for (int i = 0; i < kEnvs; ++i) {
      auto t = needs_reset[i] ? lone[i]->Reset({state.data(), nullptr})
                              : lone[i]->Step(std::span<const float>(&actions[size_t(i) * spec.action_size],
                                                                     spec.action_size),
                                              {state.data(), nullptr});
      ASSERT_TRUE(t.ok());
      needs_reset[i] = t->step_type == StepType::kLast;
      ASSERT_EQ(batch->env_id[i], i);
      ASSERT_EQ(batch->step_type[i], uint8_t(t->step_type)) << "step " << step << " env " << i;
      ASSERT_EQ(batch->reward[i], t->reward) << "step " << step << " env " << i;
      ASSERT_TRUE(std::equal(state.begin(), state.end(), batch->state.begin() + size_t(i) * spec.state_size))
          << "step " << step << " env " << i;
    }
  }
}

TEST(EnvPoolTest, BadSyncStepsAreRejectedBeforeAnyEnvSteps) {
  auto pool = MakePool(PoolOptions("cartpole.swingup", /*pixels=*/false, /*num_envs=*/3, /*threads=*/2));
  ASSERT_TRUE(pool->Reset().ok());
  std::vector<float> actions = {0.0f, 0.5f, std::nanf("")};
  auto batch = pool->Step(actions);
  ASSERT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(batch.status().message(), HasSubstr("env 2 action[0] is nan"));
  std::vector<float> short_actions = {0.0f, 0.0f};
  batch = pool->Step(short_actions);
  ASSERT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(batch.status().message(), HasSubstr("2 action values for 3 envs; expected 3"));
  // No env stepped: the next good step is every env's first.
  actions[2] = 0.0f;
  batch = pool->Step(actions);
  ASSERT_TRUE(batch.ok()) << batch.status();
  for (int i = 0; i < 3; ++i) EXPECT_EQ(batch->episode_step[i], 1) << "env " << i;
  // The async calls are refused in sync mode.
  std::vector<int32_t> ids = {0};
  EXPECT_EQ(pool->SendReset(ids).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->Recv().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(EnvPoolTest, AsyncRecvReturnsTheFirstEnvsDoneAndEveryEnvKeepsItsOwnEpisode) {
  auto pool = MakePool(PoolOptions("pendulum.swingup", /*pixels=*/false, /*num_envs=*/6, /*threads=*/2,
                                   /*batch_size=*/2));
  std::vector<int32_t> all = {0, 1, 2, 3, 4, 5};
  ASSERT_TRUE(pool->SendReset(all).ok());
  std::vector<int> steps_seen(6, -1);  // last episode_step seen per env
  std::vector<float> actions(2, 0.1f);
  for (int round = 0; round < 300; ++round) {
    auto batch = pool->Recv();
    ASSERT_TRUE(batch.ok()) << batch.status();
    ASSERT_EQ(batch->size, 2);
    ASSERT_NE(batch->env_id[0], batch->env_id[1]);
    std::vector<int32_t> ids(batch->env_id.begin(), batch->env_id.end());
    for (int i = 0; i < 2; ++i) {
      const int id = ids[i];
      // Each env's steps arrive in order, one at a time.
      EXPECT_EQ(batch->episode_step[i], steps_seen[id] + 1) << "env " << id;
      steps_seen[id] = batch->episode_step[i];
    }
    ASSERT_TRUE(pool->Send(actions, ids).ok());
  }
  // Everyone got to run: 300 rounds x 2 results spread over 6 envs.
  int total = 0;
  for (int s : steps_seen) total += s + 1;
  EXPECT_GE(total, 300 * 2 - 6);
  for (int s : steps_seen) EXPECT_GT(s, 10) << ::testing::PrintToString(steps_seen);
}

TEST(EnvPoolTest, AnEndedEpisodeIsResetByTheNextAction) {
  EnvPoolOptions options = PoolOptions("cartpole.balance", /*pixels=*/false, /*num_envs=*/2, /*threads=*/2);
  options.env.action_repeat = 100;  // 10 agent steps per episode
  auto pool = MakePool(options);
  ASSERT_TRUE(pool->Reset().ok());
  std::vector<float> actions = {0.0f, 0.0f};
  for (int step = 1; step <= 10; ++step) {
    auto batch = pool->Step(actions);
    ASSERT_TRUE(batch.ok());
    EXPECT_EQ(batch->step_type[0], uint8_t(step == 10 ? StepType::kLast : StepType::kMid));
  }
  auto batch = pool->Step(actions);
  ASSERT_TRUE(batch.ok());
  EXPECT_EQ(batch->step_type[0], uint8_t(StepType::kFirst));
  EXPECT_EQ(batch->step_type[1], uint8_t(StepType::kFirst));
  EXPECT_EQ(batch->episode_step[0], 0);
}

TEST(EnvPoolTest, BadSendsAreRejectedAndQueueNothing) {
  auto pool = MakePool(PoolOptions("cartpole.swingup", /*pixels=*/false, /*num_envs=*/3, /*threads=*/1,
                                   /*batch_size=*/1));
  std::vector<int32_t> ids = {0, 1};
  std::vector<float> nan_action = {0.0f, std::nanf("")};
  auto status = pool->Send(nan_action, ids);
  ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("env 1 action[0] is nan"));
  std::vector<float> short_actions = {0.0f};
  EXPECT_EQ(pool->Send(short_actions, ids).code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> out_of_range = {7};
  EXPECT_THAT(pool->SendReset(out_of_range).message(), HasSubstr("env id 7 is outside [0, 3)"));
  std::vector<int32_t> repeated = {1, 2, 1};
  EXPECT_THAT(pool->SendReset(repeated).message(), HasSubstr("env id 1 sent twice"));
  // Nothing was queued: there is nothing to receive.
  EXPECT_EQ(pool->Recv().status().code(), absl::StatusCode::kFailedPrecondition);
  // An env in flight cannot be sent again.
  std::vector<int32_t> zero = {0};
  ASSERT_TRUE(pool->SendReset(zero).ok());
  EXPECT_THAT(pool->SendReset(zero).message(), HasSubstr("already in flight"));
  EXPECT_TRUE(pool->Recv().ok());
  // The rejected sends left no env marked in flight.
  std::vector<int32_t> one_two = {1, 2};
  EXPECT_TRUE(pool->SendReset(one_two).ok());
}

TEST(EnvPoolTest, SyncCallsAreRefusedInAsyncMode) {
  auto pool = MakePool(PoolOptions("cartpole.swingup", /*pixels=*/false, /*num_envs=*/2, /*threads=*/1,
                                   /*batch_size=*/1));
  EXPECT_EQ(pool->Reset().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(EnvPoolTest, InvalidOptionsNameTheField) {
  auto pool = EnvPool::Create(PoolOptions("cartpole.swingup", /*pixels=*/false, /*num_envs=*/2, /*threads=*/1,
                                          /*batch_size=*/5));
  ASSERT_EQ(pool.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(pool.status().message(), HasSubstr("pool.batch_size"));
}

TEST(EnvPoolTest, DestroyingAPoolWithWorkInFlightJoinsCleanly) {
  auto pool = MakePool(PoolOptions("walker.walk", /*pixels=*/true, /*num_envs=*/4, /*threads=*/2, /*batch_size=*/1));
  std::vector<int32_t> all = {0, 1, 2, 3};
  ASSERT_TRUE(pool->SendReset(all).ok());
  pool.reset();  // must not hang or crash
  SUCCEED();
}

}  // namespace
}  // namespace troupe::envs
