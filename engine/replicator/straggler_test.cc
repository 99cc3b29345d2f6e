// DeadlineReducer: steps that do not wait for a slow replica. A replica past
// the deadline joins with zero weight and every replica applies the mean of
// the gradients that were computed; replicas stay identical; a slowed
// replica no longer sets the pace; with no deadline it does, as before.
#include "engine/replicator/straggler.h"

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/replicator/test_model.h"
#include "gtest/gtest.h"

namespace troupe::replicator {
namespace {

using testing::MakeInProcess;

using namespace std::chrono_literals;

// Replica r's gradient is r + 1 everywhere. A first step, all finishing at
// once, sets a deadline of about nothing; in the second, replica 3 is past
// it when its pass asks: the others get the mean of 1, 2 and 3.
TEST(DeadlineReducerTest, ALateReplicaJoinsWithZeroWeightAndEveryReplicaGetsTheFinishersMean) {
  auto replicator = MakeInProcess(4);
  std::vector<std::unique_ptr<testing::TestModel>> models;
  for (int i = 0; i < 4; ++i) models.push_back(std::make_unique<testing::TestModel>());
  std::vector<DeadlineStats> stats(4);
  ASSERT_TRUE(replicator->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    nn::ParameterSet& params = models[ctx.local_index()]->params;
    DeadlineReducer reducer(&ctx, &params, {.factor = 1.0, .warmup_steps = 1});
    const std::vector<float> mine(params.total_floats(), float(ctx.replica_id() + 1));
    for (int step = 0; step < 2; ++step) {
      reducer.Reset();
      params.backend().Upload(mine.data(), params.device_grads(), sizeof(float) * mine.size());
      if (step == 1 && ctx.replica_id() == 3) {
        std::this_thread::sleep_for(50ms);
        EXPECT_TRUE(reducer.StopBackward());
      }
      RETURN_IF_ERROR(reducer.Finish());
      std::vector<float> reduced(params.total_floats());
      params.backend().Download(params.device_grads(), reduced.data(), sizeof(float) * reduced.size());
      EXPECT_EQ(reduced, std::vector<float>(reduced.size(), step == 0 ? 2.5f : 2.0f)) << "step " << step;
    }
    stats[ctx.local_index()] = reducer.stats();
    return absl::OkStatus();
  }).ok());
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(stats[r].steps, 2);
    EXPECT_EQ(stats[r].late, r == 3 ? 1 : 0) << "replica " << r;
    EXPECT_GT(stats[r].deadline_s, 0);
    EXPECT_EQ(stats[r].deadline_s, stats[0].deadline_s) << "one deadline for all";
  }
}

struct Outcome {
  double seconds = 0;
  std::vector<std::vector<float>> params;  // every replica's
  std::vector<DeadlineStats> stats;
};

// K=4 replicas train the test model for `steps` steps, each step's gradients
// averaged by a DeadlineReducer (`deadline` false: a warm-up longer than the
// run, so every step waits for every replica); each backward node takes 1
// ms more, on replica 3 `slow` x that.
Outcome Train(bool deadline, int slow, int steps = 20) {
  auto replicator = MakeInProcess(4);
  std::vector<std::unique_ptr<testing::TestModel>> models;
  for (int i = 0; i < 4; ++i) models.push_back(std::make_unique<testing::TestModel>());
  Outcome out;
  out.stats.resize(4);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(replicator->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    testing::TestModel& model = *models[ctx.local_index()];
    DeadlineReducer reducer(&ctx, &model.params, {.factor = 1.5, .warmup_steps = deadline ? 3 : steps + 1});
    testing::Paced paced(&reducer, (ctx.replica_id() == 3 ? slow : 1) * 1000us);
    nn::Adam adam(&model.params, model.backend.get());
    ReplicatedOptimizer optimizer(&adam, &ctx, &paced);
    RETURN_IF_ERROR(testing::TrainShard(ctx, model, steps, 0, /*batch_norm=*/false, &optimizer, 0, &paced));
    out.stats[ctx.local_index()] = reducer.stats();
    return absl::OkStatus();
  }).ok());
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (const auto& m : models) out.params.push_back(m->params.DownloadValues());
  return out;
}

TEST(DeadlineReducerTest, ASlowedReplicaNoLongerSetsThePaceAndAllReplicasStayIdentical) {
  // Replica 3's backward nodes take 8 ms each, the others' 1 ms (a loaded
  // machine adds its own to every replica's compute).
  const Outcome waiting = Train(/*deadline=*/false, 8);
  const Outcome deadline = Train(/*deadline=*/true, 8);
  std::printf("20 steps, replica 3 of 4 slowed: %.3f s waiting for it, %.3f s with the deadline\n", waiting.seconds,
              deadline.seconds);
  EXPECT_LT(deadline.seconds, 0.75 * waiting.seconds);  // about 0.4 on an idle machine, 1 when nobody stops
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(deadline.params[r], deadline.params[0]) << "replica " << r << " differs";
    EXPECT_EQ(waiting.params[r], waiting.params[0]) << "replica " << r << " differs";
    EXPECT_EQ(waiting.stats[r].late, 0);
  }
  // Replica 3 was late on the steps after the warm-up; the others on few
  // (a core's scheduling can make one late at 1.5x).
  EXPECT_GE(deadline.stats[3].late, 15);
  for (int r = 0; r < 3; ++r) EXPECT_LE(deadline.stats[r].late, 5) << "replica " << r;
  EXPECT_LE(deadline.stats[0].none_finished, 1);
}

// Nobody slowed and no deadline: the same training as GradientReducer's
// bucketed all-reduce, within rounding (one sum then a division, where the
// buckets take the mean).
TEST(DeadlineReducerTest, WithoutADeadlineItTrainsAsTheBucketedReducer) {
  const Outcome waiting = Train(/*deadline=*/false, 1);
  auto replicator = MakeInProcess(4);
  std::vector<std::unique_ptr<testing::TestModel>> models;
  for (int i = 0; i < 4; ++i) models.push_back(std::make_unique<testing::TestModel>());
  ASSERT_TRUE(replicator->RunReplicas([&](ReplicaContext& ctx) {
    return testing::TrainShard(ctx, *models[ctx.local_index()], 20, 64, /*batch_norm=*/false);
  }).ok());
  const std::vector<float> bucketed = models[0]->params.DownloadValues();
  double worst = 0;
  for (size_t i = 0; i < bucketed.size(); ++i) worst = std::max<double>(worst, std::fabs(bucketed[i] - waiting.params[0][i]));
  EXPECT_LT(worst, 2e-5);
}

}  // namespace
}  // namespace troupe::replicator
