#include "envs/schedulers/sync_processes.h"

#include <signal.h>

#include <map>
#include <memory>
#include <vector>

#include "envs/env.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::envs {
namespace {

// Six cartpole envs: the caller's [0, 2), and two worker processes of two
// envs each, [2, 4) and [4, 6).
class SyncProcessSchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.task = "cartpole.swingup";
    options_.pixels = true;
    auto env = MakeEnv(options_);
    ASSERT_TRUE(env.ok()) << env.status();
    spec_ = (*env)->spec();
    for (int first : {2, 4}) {
      auto worker = EnvWorker::Start(options_, spec_, (*env)->model(), first, /*count=*/2);
      ASSERT_TRUE(worker.ok()) << worker.status();
      workers_.push_back(*std::move(worker));
    }
  }

  // A scheduler that records what it was asked to do.
  std::unique_ptr<SyncProcessScheduler> Scheduler() {
    SyncProcessScheduler::Options o;
    for (const auto& worker : workers_) o.workers.push_back(worker.get());
    o.own_envs = 2;
    o.run_own = [this](int32_t begin, int32_t end) { own_.push_back({begin, end}); };
    o.collect = [this](const EnvWorker& worker, int32_t id) {
      collected_[id].push_back(worker.result(id).timestep.step_type);
    };
    o.on_error = [this](const absl::Status& status) { errors_.push_back(status); };
    return std::make_unique<SyncProcessScheduler>(std::move(o));
  }

  EnvOptions options_;
  EnvSpec spec_;
  std::vector<std::unique_ptr<EnvWorker>> workers_;
  std::vector<std::pair<int32_t, int32_t>> own_;
  std::map<int32_t, std::vector<StepType>> collected_;
  std::vector<absl::Status> errors_;
};

TEST_F(SyncProcessSchedulerTest, EachProcessRunsItsShareWhileTheCallerRunsItsOwn) {
  auto scheduler = Scheduler();
  scheduler->RunBatch(/*reset=*/true, nullptr);
  const std::vector<float> actions(6 * spec_.action_size, 0.0f);
  scheduler->RunBatch(/*reset=*/false, actions.data());
  EXPECT_THAT(own_, ::testing::ElementsAre(std::pair<int32_t, int32_t>{0, 2}, std::pair<int32_t, int32_t>{0, 2}));
  ASSERT_EQ(collected_.size(), 4u);
  for (int32_t id = 2; id < 6; ++id) {
    EXPECT_THAT(collected_[id], ::testing::ElementsAre(StepType::kFirst, StepType::kMid)) << "env " << id;
  }
  EXPECT_TRUE(errors_.empty());
}

// A dead worker is an error of the batch, not a hang, and its envs' rows
// are still collected (stale), as the pool's contract says.
TEST_F(SyncProcessSchedulerTest, ADeadWorkerIsAnErrorAndItsEnvsAreStillCollected) {
  auto scheduler = Scheduler();
  scheduler->RunBatch(/*reset=*/true, nullptr);
  ASSERT_EQ(kill(workers_[1]->pid(), SIGKILL), 0);
  scheduler->RunBatch(/*reset=*/true, nullptr);
  ASSERT_FALSE(errors_.empty());
  EXPECT_EQ(errors_[0].code(), absl::StatusCode::kUnavailable) << errors_[0];
  for (int32_t id = 2; id < 6; ++id) EXPECT_EQ(collected_[id].size(), 2u) << "env " << id;
  EXPECT_EQ(own_.size(), 2u);
}

}  // namespace
}  // namespace troupe::envs
