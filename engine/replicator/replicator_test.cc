// The in-process Replicator: K=2 replicas on half batches train exactly as
// one replica on the whole batch; failures and mismatches are errors naming
// the replica, never hangs.
#include "engine/replicator/replicator.h"

#include <array>
#include <chrono>
#include <thread>

#include "common/status_macros.h"
#include "engine/nn/strict_cpu_backend.h"
#include "engine/replicator/in_process.h"
#include "engine/replicator/test_model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::replicator {
namespace {

using testing::MakeInProcess;

using ::testing::HasSubstr;
using namespace std::chrono_literals;

// K replicas train the test model, each on its own backend (`strict`: the
// strict CPU device, whose gradients the Replicator stages through the host;
// `shared_device`: CPU backends on one address space reducing each other's
// buffers with their kernels, as K replicas on one GPU do); returns replica
// 0's parameters and running statistics.
std::vector<float> TrainWith(int k, int64_t bucket_floats, bool batch_norm = true, bool strict = false,
                             bool shared_device = false) {
  auto replicator = MakeInProcess(k, 30000ms, shared_device);
  std::vector<std::unique_ptr<testing::TestModel>> models;
  for (int i = 0; i < k; ++i) {
    std::shared_ptr<nn::Backend> device;
    if (strict) {
      device = std::make_shared<nn::StrictCpuBackend>(/*num_threads=*/1);
    } else {
      device = std::make_shared<nn::CpuBackend>(/*num_threads=*/1);
    }
    models.push_back(std::make_unique<testing::TestModel>(device));
  }
  absl::Status s = replicator->RunReplicas([&](ReplicaContext& ctx) {
    return testing::TrainShard(ctx, *models[ctx.local_index()], /*steps=*/5, bucket_floats, batch_norm);
  });
  EXPECT_TRUE(s.ok()) << s;
  // Every replica holds the same parameters.
  for (int i = 1; i < k; ++i) EXPECT_EQ(models[0]->params.DownloadValues(), models[i]->params.DownloadValues());
  std::vector<float> out = models[0]->params.DownloadValues();
  for (const nn::DeviceBuffer* stats : {&models[0]->running_mean, &models[0]->running_var}) {
    const std::vector<float> values = stats->Download();
    out.insert(out.end(), values.begin(), values.end());
  }
  return out;
}

TEST(ReplicatorTest, TwoReplicasOnHalfBatchesEqualOneReplicaOnTheWholeBatch) {
  const std::vector<float> one = TrainWith(/*k=*/1, /*bucket_floats=*/1 << 20);
  const std::vector<float> two = TrainWith(/*k=*/2, /*bucket_floats=*/64);  // several buckets
  ASSERT_EQ(one.size(), two.size());
  double worst = 0;
  for (size_t i = 0; i < one.size(); ++i) worst = std::max<double>(worst, std::fabs(one[i] - two[i]));
  size_t at = 0;
  for (size_t i = 0; i < one.size(); ++i) if (std::fabs(one[i] - two[i]) == worst) at = i;
  EXPECT_LT(worst, 2e-5) << "largest parameter difference after 5 Adam steps, at float " << at << " of " << one.size();
  // And the training moved the parameters (the comparison is not vacuous).
  testing::TestModel fresh;
  EXPECT_GT(std::fabs(one[0] - fresh.params.DownloadValues()[0]), 1e-3);
}

// One ReplicatedOptimizer step of replica ctx.replica_id() on `m` whose
// gradient is replica_id + 1 everywhere; returns the gradient as reduced
// (the mean over K replicas: (K + 1) / 2 everywhere).
std::vector<float> StepWithReplicaIndexGradients(ReplicaContext& ctx, testing::TestModel& m) {
  nn::Sgd sgd(&m.params, m.backend.get());
  ReplicatedOptimizer optimizer(&sgd, &ctx);
  std::vector<float> grads(m.params.total_floats(), float(ctx.replica_id() + 1));
  m.backend->Upload(grads.data(), m.params.device_grads(), sizeof(float) * grads.size());
  optimizer.Step(/*learning_rate=*/0.1f);
  std::vector<float> reduced(m.params.total_floats());
  m.backend->Download(m.params.device_grads(), reduced.data(), sizeof(float) * reduced.size());
  return reduced;
}

// Gradients in memory the host cannot touch reach the collectives through a
// host copy (bucket by bucket during backward, or all at once): K=2 on the
// strict CPU device equals K=2 on the CPU bit for bit.
TEST(ReplicatorTest, ReplicasOnTheStrictDeviceReduceThroughTheHostAsOnTheCpu) {
  for (int64_t bucket_floats : {int64_t{64}, int64_t{1} << 20}) {
    EXPECT_EQ(TrainWith(2, bucket_floats, /*batch_norm=*/true, /*strict=*/true),
              TrainWith(2, bucket_floats, /*batch_norm=*/true, /*strict=*/false))
        << "buckets of " << bucket_floats;
  }
  // Without a reducer, the ReplicatedOptimizer reduces the whole buffer at once.
  auto replicator = MakeInProcess(2);
  std::vector<std::vector<float>> results(2);
  for (bool strict : {false, true}) {
    std::vector<std::unique_ptr<testing::TestModel>> models;
    for (int i = 0; i < 2; ++i) {
      std::shared_ptr<nn::Backend> device;
      if (strict) {
        device = std::make_shared<nn::StrictCpuBackend>(1);
      } else {
        device = std::make_shared<nn::CpuBackend>(1);
      }
      models.push_back(std::make_unique<testing::TestModel>(device));
    }
    ASSERT_TRUE(replicator->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
      // Replica r's gradient is r + 1 everywhere: the mean is 1.5.
      const std::vector<float> reduced = StepWithReplicaIndexGradients(ctx, *models[ctx.local_index()]);
      EXPECT_EQ(reduced, std::vector<float>(reduced.size(), 1.5f));
      return ctx.status();
    }).ok());
    results[strict] = models[0]->params.DownloadValues();
  }
  EXPECT_EQ(results[0], results[1]);
}

// K replicas on one device (collectives SHARED_DEVICE: K threads on one GPU,
// each its own stream) reduce their gradients there, with one replica's
// kernels reading the others' buffers: bit for bit the host reduction at
// K=2 (the same sum and the same halving), bucket by bucket or at once, and
// so K=1 on the whole batch within the same tolerance.
TEST(ReplicatorTest, TwoReplicasSharingOneDeviceReduceOnItAsThroughTheHost) {
  for (int64_t bucket_floats : {int64_t{64}, int64_t{1} << 20}) {
    EXPECT_EQ(TrainWith(2, bucket_floats, /*batch_norm=*/true, /*strict=*/false, /*shared_device=*/true),
              TrainWith(2, bucket_floats, /*batch_norm=*/true, /*strict=*/false, /*shared_device=*/false))
        << "buckets of " << bucket_floats;
  }
  // The ReplicatedOptimizer's whole-buffer mean, and one backend per replica.
  auto replicator = MakeInProcess(3, 30000ms, /*on_device=*/true);
  std::vector<std::unique_ptr<testing::TestModel>> models;
  for (int i = 0; i < 3; ++i) {
    models.push_back(std::make_unique<testing::TestModel>(std::make_shared<nn::CpuBackend>(1)));
  }
  ASSERT_TRUE(replicator->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    EXPECT_TRUE(ctx.ReducesOnDevice());
    EXPECT_EQ(ctx.collectives().local_rank(), 0) << "every replica on device 0";
    // Replica r's gradient is r + 1 everywhere: the mean is 2.
    const std::vector<float> reduced = StepWithReplicaIndexGradients(ctx, *models[ctx.local_index()]);
    EXPECT_EQ(reduced, std::vector<float>(reduced.size(), 2.0f));
    return ctx.status();
  }).ok());
  const std::vector<float> one = TrainWith(/*k=*/1, /*bucket_floats=*/1 << 20);
  const std::vector<float> two = TrainWith(2, 64, true, false, /*shared_device=*/true);
  double worst = 0;
  for (size_t i = 0; i < one.size(); ++i) worst = std::max<double>(worst, std::fabs(one[i] - two[i]));
  EXPECT_LT(worst, 2e-5);
}

TEST(ReplicatorTest, TwoReplicasWithoutBatchNormEqualOneReplica) {
  const std::vector<float> one = TrainWith(/*k=*/1, /*bucket_floats=*/1 << 20, /*batch_norm=*/false);
  const std::vector<float> two = TrainWith(/*k=*/2, /*bucket_floats=*/1 << 20, /*batch_norm=*/false);
  double worst = 0;
  for (size_t i = 0; i < one.size(); ++i) worst = std::max<double>(worst, std::fabs(one[i] - two[i]));
  EXPECT_LT(worst, 2e-5);
}

TEST(ReplicatorTest, GradientReducerMakesBucketsOfConsecutiveParameters) {
  auto replicator = MakeInProcess(1);
  testing::TestModel model;
  ASSERT_TRUE(replicator->RunReplicas([&](ReplicaContext& ctx) {
    GradientReducer one_bucket(&ctx, &model.params, /*bucket_floats=*/1 << 20);
    GradientReducer per_param(&ctx, &model.params, /*bucket_floats=*/1);
    EXPECT_EQ(one_bucket.num_buckets(), 1);
    EXPECT_EQ(per_param.num_buckets(), model.params.size());
    return absl::OkStatus();
  }).ok());
}

TEST(ReplicatorTest, AllGatherAndBroadcastDeliverEveryReplicasData) {
  auto replicator = MakeInProcess(3);
  absl::Status s = replicator->RunReplicas([](ReplicaContext& ctx) -> absl::Status {
    const float mine[2] = {static_cast<float>(ctx.replica_id()), 10.0f + ctx.replica_id()};
    std::vector<float> all(6);
    RETURN_IF_ERROR(ctx.AllGather(mine, all));
    EXPECT_EQ(all, (std::vector<float>{0, 10, 1, 11, 2, 12}));
    std::vector<float> b = {static_cast<float>(ctx.replica_id())};
    RETURN_IF_ERROR(ctx.Broadcast(b, /*root=*/2));
    EXPECT_EQ(b[0], 2.0f);
    std::vector<float> sum = {1.0f, static_cast<float>(ctx.replica_id())};
    RETURN_IF_ERROR(ctx.AllReduce(sum, ReduceOp::kMean));
    EXPECT_EQ(sum, (std::vector<float>{1.0f, 1.0f}));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Replica r gets the reduction of every replica's part r: the sums and means
// of K=3 replicas' [r + 10 i] parts, out of place and in place (its own
// part of the input); an all-gather in place leaves every part in place.
TEST(ReplicatorTest, ReduceScatterGivesEachReplicaItsPartOfTheReduction) {
  auto replicator = MakeInProcess(3);
  absl::Status s = replicator->RunReplicas([](ReplicaContext& ctx) -> absl::Status {
    const int r = ctx.replica_id();
    // in[p * 2 + j] = 100 p + 10 j + r: part p of replica r.
    std::vector<float> in(6);
    for (int p = 0; p < 3; ++p) {
      for (int j = 0; j < 2; ++j) in[p * 2 + j] = 100.0f * p + 10.0f * j + r;
    }
    // Summed over r = 0, 1, 2: 3 (100 r + 10 j) + 3.
    const std::vector<float> sum = {300.0f * r + 3, 300.0f * r + 33};
    std::vector<float> out(2);
    RETURN_IF_ERROR(ctx.ReduceScatter(in, out, ReduceOp::kSum));
    EXPECT_EQ(out, sum);
    RETURN_IF_ERROR(ctx.ReduceScatter(in, {in.data() + 2 * r, 2}, ReduceOp::kMean));
    EXPECT_EQ(std::vector<float>(in.begin() + 2 * r, in.begin() + 2 * r + 2),
              (std::vector<float>{100.0f * r + 1, 100.0f * r + 11}));
    std::vector<float> gathered(6, -1.0f);
    gathered[2 * r] = 7.0f * r;
    gathered[2 * r + 1] = 7.0f * r + 1;
    RETURN_IF_ERROR(ctx.AllGather({gathered.data() + 2 * r, 2}, gathered));
    EXPECT_EQ(gathered, (std::vector<float>{0, 1, 7, 8, 14, 15}));
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(ReplicatorTest, AFailingReplicaIsAnErrorNamingItAndReleasesTheOthers) {
  auto replicator = MakeInProcess(2, /*timeout=*/30000ms);
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = replicator->RunReplicas([](ReplicaContext& ctx) -> absl::Status {
    if (ctx.replica_id() == 1) return absl::InternalError("out of data");
    std::vector<float> g(4, 1.0f);
    absl::Status blocked = ctx.AllReduce(g, ReduceOp::kSum);  // would wait forever for replica 1
    EXPECT_EQ(blocked.code(), absl::StatusCode::kAborted);
    EXPECT_THAT(blocked.message(), HasSubstr("replica 1 failed: out of data"));
    return blocked;
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("replica 1: out of data"));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "released, not timed out";
}

TEST(ReplicatorTest, AStalledReplicaTimesOutNamingIt) {
  auto replicator = MakeInProcess(2, /*timeout=*/200ms);
  absl::Status s = replicator->RunReplicas([](ReplicaContext& ctx) -> absl::Status {
    std::vector<float> g(4, 1.0f);
    RETURN_IF_ERROR(ctx.AllReduce(g, ReduceOp::kSum));  // #0: both
    if (ctx.replica_id() == 1) {
      std::this_thread::sleep_for(1000ms);  // stalls past the timeout
      return absl::OkStatus();
    }
    return ctx.AllReduce(g, ReduceOp::kSum);  // #1: replica 1 never comes
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("replica 1 did not reach collective #1 (AllReduce of 4 floats)"));
}

TEST(ReplicatorTest, CollectivesCalledInADifferentOrderAreAnErrorNamingTheReplica) {
  auto replicator = MakeInProcess(2, /*timeout=*/5000ms);
  absl::Status s = replicator->RunReplicas([](ReplicaContext& ctx) -> absl::Status {
    std::vector<float> g(10, 1.0f);
    if (ctx.replica_id() == 0) return ctx.AllReduce(g, ReduceOp::kSum);
    return ctx.Broadcast(g, /*root=*/0);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("replica 1 called Broadcast of 10 floats from root 0, replica 0 called AllReduce of 10 floats"));
}

TEST(ReplicatorTest, RunLoopsInputAndStepFunctions) {
  auto replicator = MakeInProcess(2);
  std::atomic<int> steps{0};
  absl::Status s = replicator->Run<int>(
      /*num_steps=*/3, [](ReplicaContext& ctx) -> absl::StatusOr<int> { return ctx.replica_id(); },
      [&](ReplicaContext& ctx, int& shard) -> absl::Status {
        EXPECT_EQ(shard, ctx.replica_id());
        ++steps;
        std::vector<float> v = {1.0f};
        return ctx.AllReduce(v, ReduceOp::kSum);
      });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(steps.load(), 6);
}

// local_index() is a replica's place among its own process's replicas, what
// indexes the Replicator's backends and a caller's per-replica state; the
// replica id is its place in the whole group. One process running all K:
// the two are equal.
TEST(ReplicatorTest, LocalIndexIsTheReplicasPlaceInItsProcess) {
  auto replicator = MakeInProcess(3);
  std::vector<int> index_of(3, -1);
  ASSERT_TRUE(replicator->RunReplicas([&](ReplicaContext& ctx) {
    index_of[ctx.replica_id()] = ctx.local_index();
    EXPECT_EQ(ctx.backend(), replicator->backend(ctx.local_index()));
    return absl::OkStatus();
  }).ok());
  EXPECT_EQ(index_of, (std::vector<int>{0, 1, 2}));
}

// As under MPI, where a process runs some of the group's replicas: two
// "processes" (Replicators) of two replicas each over one group of four.
// The second runs ids 2 and 3 at local indices 0 and 1, so state indexed by
// the replica id would run past its two local entries.
TEST(ReplicatorTest, LocalIndexCountsFromZeroInAProcessThatRunsLaterIds) {
  auto group = std::make_shared<InProcessGroup>(4, 30000ms);
  auto process = [&](int first_id) {
    ReplicatorOptions o;
    o.num_replicas = 2;
    o.make_collectives = [group, first_id](int, std::chrono::milliseconds) -> absl::StatusOr<LocalCollectives> {
      LocalCollectives local;
      for (int id = first_id; id < first_id + 2; ++id) local.members.push_back(group->Member(id));
      local.shared = group;
      return local;
    };
    auto r = Replicator::Create(o);
    TROUPE_CHECK(r.ok());
    return std::move(r).value();
  };
  std::unique_ptr<Replicator> processes[2] = {process(0), process(2)};
  EXPECT_EQ(processes[1]->num_replicas(), 4);
  EXPECT_EQ(processes[1]->local_replicas(), (std::vector<int>{2, 3}));
  // Per process: each local replica's id and the group's gather of every
  // replica's local index, indexed by local index.
  std::vector<int> ids[2] = {std::vector<int>(2, -1), std::vector<int>(2, -1)};
  std::vector<std::vector<float>> gathered[2] = {std::vector<std::vector<float>>(2),
                                                 std::vector<std::vector<float>>(2)};
  absl::Status status[2];
  {
    std::vector<std::jthread> threads;
    for (int p = 0; p < 2; ++p) {
      threads.emplace_back([&, p] {
        status[p] = processes[p]->RunReplicas([&, p](ReplicaContext& ctx) -> absl::Status {
          const int k = ctx.local_index();
          EXPECT_EQ(ctx.backend(), processes[p]->backend(k));
          EXPECT_EQ(processes[p]->local_replicas()[k], ctx.replica_id());
          ids[p][k] = ctx.replica_id();
          const float mine[1] = {static_cast<float>(k)};
          gathered[p][k].resize(4);
          return ctx.AllGather(mine, gathered[p][k]);
        });
      });
    }
  }  // joined here
  EXPECT_TRUE(status[0].ok()) << status[0];
  EXPECT_TRUE(status[1].ok()) << status[1];
  EXPECT_EQ(ids[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(ids[1], (std::vector<int>{2, 3}));
  for (int p = 0; p < 2; ++p) {
    for (int k = 0; k < 2; ++k) EXPECT_EQ(gathered[p][k], (std::vector<float>{0, 1, 0, 1})) << p << " " << k;
  }
}

std::unique_ptr<Replicator> MakeMesh(int k, int m, std::chrono::milliseconds timeout = 30000ms) {
  ReplicatorOptions o;
  o.num_replicas = k;
  o.model_parallel = m;
  o.timeout = timeout;
  auto r = Replicator::Create(o);
  TROUPE_CHECK(r.ok());
  return std::move(r).value();
}

TEST(ReplicatorTest, AMeshGroupsTheReplicasAlongEachAxis) {
  // 6 replicas as 2 models of 3 parts: replica r is part r % 3 of model r / 3.
  auto replicator = MakeMesh(6, 3);
  EXPECT_EQ(replicator->model_parallel(), 3);
  std::vector<std::array<int, 4>> axes(6);  // model index, parts, data index, copies
  std::vector<std::array<float, 2>> sums(6);
  ASSERT_TRUE(replicator->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    const int r = ctx.replica_id();
    axes[r] = {ctx.model_axis().replica_id(), ctx.model_axis().num_replicas(), ctx.data_axis().replica_id(),
               ctx.data_axis().num_replicas()};
    std::vector<float> model = {float(r)}, data = {float(r)};
    RETURN_IF_ERROR(ctx.model_axis().AllReduce(model, ReduceOp::kSum));
    RETURN_IF_ERROR(ctx.data_axis().AllReduce(data, ReduceOp::kSum));
    sums[r] = {model[0], data[0]};
    return absl::OkStatus();
  }).ok());
  for (int r = 0; r < 6; ++r) {
    SCOPED_TRACE(absl::StrCat("replica ", r));
    EXPECT_EQ(axes[r], (std::array<int, 4>{r % 3, 3, r / 3, 2}));
    // Over the parts of its model (ids 3d..3d+2), and over its part's copies (r % 3 and r % 3 + 3).
    EXPECT_EQ(sums[r][0], float(3 * (r / 3) * 3 + 0 + 1 + 2));
    EXPECT_EQ(sums[r][1], float(2 * (r % 3) + 3));
  }
}

TEST(ReplicatorTest, WithoutAMeshTheDataAxisIsTheWholeGroupAndTheModelAxisOneReplica) {
  auto replicator = MakeInProcess(2);
  EXPECT_EQ(replicator->model_parallel(), 1);
  ASSERT_TRUE(replicator->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    EXPECT_EQ(&ctx.data_axis(), &ctx);
    EXPECT_EQ(ctx.model_axis().num_replicas(), 1);
    EXPECT_EQ(ctx.model_axis().replica_id(), 0);
    std::vector<float> v = {float(ctx.replica_id() + 1)};
    RETURN_IF_ERROR(ctx.model_axis().AllReduce(v, ReduceOp::kSum));
    EXPECT_EQ(v[0], float(ctx.replica_id() + 1)) << "a sum over one replica";
    return absl::OkStatus();
  }).ok());
}

TEST(ReplicatorTest, AFailingReplicaReleasesTheOthersOnEitherAxisAndItsErrorIsTheContexts) {
  auto replicator = MakeMesh(4, 2, /*timeout=*/30000ms);
  const auto start = std::chrono::steady_clock::now();
  std::vector<absl::Status> blocked(4), context(4);
  absl::Status s = replicator->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    const int r = ctx.replica_id();
    if (r == 3) return absl::InternalError("out of data");
    std::vector<float> g(4, 1.0f);
    // Replica 2 shares replica 3's data index, replica 1 its model index:
    // each would wait forever for it.
    if (r == 2) blocked[r] = ctx.model_axis().AllReduce(g, ReduceOp::kSum);
    if (r == 1) blocked[r] = ctx.data_axis().AllReduce(g, ReduceOp::kSum);
    context[r] = ctx.status();
    return absl::OkStatus();
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("replica 3: out of data"));
  for (int r : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("replica ", r));
    EXPECT_EQ(blocked[r].code(), absl::StatusCode::kAborted);
    EXPECT_THAT(blocked[r].message(), HasSubstr("failed: out of data"));
    EXPECT_EQ(context[r], blocked[r]) << "an axis's error is the replica's";
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "released, not timed out";
}

TEST(ReplicatorOptionsTest, RejectsAMeshThatDoesNotDivideTheReplicas) {
  ReplicatorOptions o;
  o.num_replicas = 6;
  o.model_parallel = 4;
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(o.Validate().message(), HasSubstr("6 replicas do not split into models of model_parallel 4"));
  o.model_parallel = 0;
  EXPECT_THAT(o.Validate().message(), HasSubstr("model_parallel 0 < 1"));
  // Collectives made above this layer (NCCL) have no axis groups.
  o.model_parallel = 2;
  o.make_collectives = [](int, std::chrono::milliseconds) -> absl::StatusOr<LocalCollectives> {
    return LocalCollectives{};
  };
  EXPECT_EQ(o.Validate().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(o.Validate().message(), HasSubstr("a mesh of replicas needs in-process or MPI collectives"));
}

TEST(ReplicatorOptionsTest, RejectsZeroReplicas) {
  ReplicatorOptions o;
  o.num_replicas = 0;
  EXPECT_THAT(o.Validate().message(), HasSubstr("num_replicas 0"));
}

}  // namespace
}  // namespace troupe::replicator
