// Run under `mpiexec -np 2` by ctest (see learner/CMakeLists.txt), one
// scenario per test:
//   equivalence  K=2 MPI replicas on half batches == one replica on the whole
//                batch, after 5 Adam steps with bucketed gradient reduction
//   stall        replica 1 stalls; replica 0's collective times out naming it
//   mismatch     replicas call different collectives; the error names them
//   scatter      ReduceScatter (sum and mean, out of place and in place) and
//                AllGather in place give every rank the exact parts
//   sharded      K=2 MPI replicas with Adam's moments split (ShardedAdam:
//                reduce-scatter, all-gather, the clip's norm all-reduced) ==
//                one replica with Adam on the whole batch after 10 steps,
//                parameters and whole moments compared
//   mesh         K=4 MPI ranks (mpiexec -np 4) as a 2 x 2 data x model mesh
//                (ranks split per axis): the tensor-parallel MLP of
//                test_model.h after 10 Adam steps == each rank's part of the
//                unsplit MLP trained on the whole batch in this process
//   deadline     K=2 MPI ranks, rank 1's backward nodes 8x rank 0's (slept):
//                with a step deadline (DeadlineReducer) 20 steps take under
//                0.75x of waiting for it (about 0.45 on an idle machine),
//                rank 1 is late on most, and both ranks end with the same
//                parameters
// Exit status 0 iff the scenario behaved as expected on this rank.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "common/status_macros.h"
#include "engine/nn/checkpoint.h"
#include "engine/replicator/replicator.h"
#include "engine/replicator/sharded_adam.h"
#include "engine/replicator/straggler.h"
#include "engine/replicator/test_model.h"

namespace troupe::replicator {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<Replicator> Make(ReplicatorOptions::Backend backend, int k, std::chrono::milliseconds timeout) {
  ReplicatorOptions o;
  o.backend = backend;
  o.num_replicas = k;
  o.timeout = timeout;
  auto r = Replicator::Create(o);
  if (!r.ok()) {
    std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
    std::exit(2);
  }
  return std::move(r).value();
}

int Equivalence() {
  auto mpi = Make(ReplicatorOptions::Backend::kMpi, 0, 30000ms);
  if (mpi->num_replicas() != 2) {
    std::fprintf(stderr, "expected 2 MPI replicas, got %d\n", mpi->num_replicas());
    return 1;
  }
  testing::TestModel replicated, reference;
  int local_index = -1, replica_id = -1;
  absl::Status s = mpi->RunReplicas([&](ReplicaContext& ctx) {
    local_index = ctx.local_index();
    replica_id = ctx.replica_id();
    return testing::TrainShard(ctx, replicated, /*steps=*/5, /*bucket_floats=*/64);
  });
  if (!s.ok()) {
    std::fprintf(stderr, "replicated training failed: %s\n", s.ToString().c_str());
    return 1;
  }
  // One replica per process: local index 0 on every rank, the id its rank.
  if (local_index != 0 || replica_id != mpi->local_replicas()[0]) {
    std::fprintf(stderr, "rank %d: local_index %d and replica_id %d, expected 0 and the rank\n",
                 mpi->local_replicas()[0], local_index, replica_id);
    return 1;
  }
  // The single-replica reference, in this process.
  auto single = Make(ReplicatorOptions::Backend::kInProcess, 1, 30000ms);
  s = single->RunReplicas(
      [&](ReplicaContext& ctx) { return testing::TrainShard(ctx, reference, /*steps=*/5, /*bucket_floats=*/1 << 20); });
  if (!s.ok()) return 1;
  double worst = 0;
  const std::vector<float> a = reference.params.DownloadValues(), b = replicated.params.DownloadValues();
  for (size_t i = 0; i < a.size(); ++i) worst = std::max<double>(worst, std::fabs(a[i] - b[i]));
  std::printf("rank %d: largest parameter difference K=2 (MPI) vs K=1: %g\n", mpi->local_replicas()[0], worst);
  return worst < 2e-5 ? 0 : 1;
}

int Stall() {
  auto mpi = Make(ReplicatorOptions::Backend::kMpi, 0, 500ms);
  const int rank = mpi->local_replicas()[0];
  absl::Status s = mpi->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    std::vector<float> g(4, 1.0f);
    RETURN_IF_ERROR(ctx.AllReduce(g, ReduceOp::kSum));  // #0: both
    if (rank == 1) {
      std::this_thread::sleep_for(2000ms);  // never joins #1
      return absl::OkStatus();
    }
    return ctx.AllReduce(g, ReduceOp::kSum);
  });
  std::printf("rank %d: %s\n", rank, s.ToString().c_str());
  if (rank == 1) return s.ok() ? 0 : 1;
  return s.code() == absl::StatusCode::kDeadlineExceeded &&
                 std::strstr(std::string(s.message()).c_str(), "replica 1 did not reach collective #1") != nullptr
             ? 0
             : 1;
}

int Mismatch() {
  auto mpi = Make(ReplicatorOptions::Backend::kMpi, 0, 5000ms);
  const int rank = mpi->local_replicas()[0];
  absl::Status s = mpi->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    std::vector<float> g(10, 1.0f);
    if (rank == 0) return ctx.AllReduce(g, ReduceOp::kSum);
    return ctx.Broadcast(g, /*root=*/0);
  });
  std::printf("rank %d: %s\n", rank, s.ToString().c_str());
  const int other = 1 - rank;
  const std::string want = "replica " + std::to_string(other) + " called " +
                           (other == 1 ? "Broadcast of 10 floats" : "AllReduce of 10 floats");
  return s.code() == absl::StatusCode::kFailedPrecondition &&
                 std::string(s.message()).find(want) != std::string::npos
             ? 0
             : 1;
}

int Scatter() {
  auto mpi = Make(ReplicatorOptions::Backend::kMpi, 0, 30000ms);
  const int rank = mpi->local_replicas()[0];
  bool ok = true;
  absl::Status s = mpi->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    const int r = ctx.replica_id();
    // in[p * 3 + j] = 100 p + 10 j + r: part p of rank r. Summed over ranks
    // 0 and 1: 200 p + 20 j + 1.
    std::vector<float> in(6);
    for (int p = 0; p < 2; ++p) {
      for (int j = 0; j < 3; ++j) in[p * 3 + j] = 100.0f * p + 10.0f * j + r;
    }
    std::vector<float> out(3);
    RETURN_IF_ERROR(ctx.ReduceScatter(in, out, ReduceOp::kSum));
    ok = ok && out == std::vector<float>{200.0f * r + 1, 200.0f * r + 21, 200.0f * r + 41};
    RETURN_IF_ERROR(ctx.ReduceScatter(in, {in.data() + 3 * r, 3}, ReduceOp::kMean));
    ok = ok && std::vector<float>(in.begin() + 3 * r, in.begin() + 3 * r + 3) ==
                   std::vector<float>{100.0f * r + 0.5f, 100.0f * r + 10.5f, 100.0f * r + 20.5f};
    std::vector<float> gathered(6, -1.0f);
    for (int j = 0; j < 3; ++j) gathered[3 * r + j] = 7.0f * r + j;
    RETURN_IF_ERROR(ctx.AllGather({gathered.data() + 3 * r, 3}, gathered));
    ok = ok && gathered == std::vector<float>{0, 1, 2, 7, 8, 9};
    return absl::OkStatus();
  });
  std::printf("rank %d: %s, parts %s\n", rank, s.ToString().c_str(), ok ? "exact" : "WRONG");
  return s.ok() && ok ? 0 : 1;
}

int Sharded() {
  constexpr float kMaxNorm = 0.05f;  // clips (ShardedAdamTest shows it)
  auto mpi = Make(ReplicatorOptions::Backend::kMpi, 0, 30000ms);
  const int rank = mpi->local_replicas()[0];
  testing::TestModel replicated(std::make_shared<nn::CpuBackend>(1), ShardedAdam::PadMultiple(2)), reference;
  std::vector<nn::CheckpointTensor> got, want;
  absl::Status s = mpi->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(std::unique_ptr<ShardedAdam> sharded,
                     ShardedAdam::Create(&replicated.params, ctx.replica_id(), ctx.num_replicas(),
                                         {.max_grad_norm = kMaxNorm}));
    RETURN_IF_ERROR(sharded->set_context(&ctx));
    RETURN_IF_ERROR(testing::TrainShard(ctx, replicated, /*steps=*/10, 1 << 20, true, sharded.get()));
    RETURN_IF_ERROR(sharded->GatherState());
    got = nn::CheckpointTensors(replicated.params, sharded.get());
    return absl::OkStatus();
  });
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: sharded training failed: %s\n", rank, s.ToString().c_str());
    return 1;
  }
  auto single = Make(ReplicatorOptions::Backend::kInProcess, 1, 30000ms);
  nn::Adam adam(&reference.params, reference.backend.get());
  testing::ClippedAdam clipped(&adam, kMaxNorm);
  s = single->RunReplicas([&](ReplicaContext& ctx) {
    return testing::TrainShard(ctx, reference, /*steps=*/10, 1 << 20, true, &clipped);
  });
  if (!s.ok()) return 1;
  want = nn::CheckpointTensors(reference.params, &clipped);
  // Relative difference in norm, per tensor.
  double worst = 0;
  std::string at;
  for (size_t i = 0; i < want.size(); ++i) {
    double d = 0, n = 0;
    for (size_t j = 0; j < want[i].values.size(); ++j) {
      d += std::pow(double(got[i].values[j]) - want[i].values[j], 2);
      n += std::pow(double(want[i].values[j]), 2);
    }
    const double relative = n > 0 ? std::sqrt(d / n) : std::sqrt(d);
    if (got[i].name != want[i].name || relative > worst) {
      worst = got[i].name != want[i].name ? 1e30 : relative;
      at = want[i].name;
    }
  }
  std::printf("rank %d: largest relative difference of a state tensor, K=2 sharded (MPI) vs K=1 Adam: %g (%s)\n", rank,
              worst, at.c_str());
  return worst < 1e-4 ? 0 : 1;
}

// 20 steps of K=2 MPI ranks with rank 1 paced 8x slower; returns the
// seconds they took, and rank 1's late steps and the parameters equal on
// both ranks (or -1).
double PacedRun(Replicator* mpi, bool deadline, int64_t* late, bool* identical) {
  testing::TestModel model;
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = mpi->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    DeadlineReducer reducer(&ctx, &model.params, {.factor = 1.5, .warmup_steps = deadline ? 3 : 21});
    testing::Paced paced(&reducer, (ctx.replica_id() == 1 ? 8 : 1) * 1000us);
    nn::Adam adam(&model.params, model.backend.get());
    ReplicatedOptimizer optimizer(&adam, &ctx, &paced);
    RETURN_IF_ERROR(testing::TrainShard(ctx, model, 20, 0, /*batch_norm=*/false, &optimizer, 0, &paced));
    std::vector<float> late_steps = {static_cast<float>(ctx.replica_id() == 1 ? reducer.stats().late : 0)};
    RETURN_IF_ERROR(ctx.AllReduce(late_steps, ReduceOp::kSum));
    *late = static_cast<int64_t>(late_steps[0]);
    const std::vector<float> mine = model.params.DownloadValues();
    std::vector<float> both(2 * mine.size());
    RETURN_IF_ERROR(ctx.AllGather(mine, both));
    *identical = std::equal(mine.begin(), mine.end(), both.begin()) &&
                 std::equal(mine.begin(), mine.end(), both.begin() + mine.size());
    return absl::OkStatus();
  });
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return -1;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int Deadline() {
  int64_t late_waiting = 0, late = 0;
  bool identical_waiting = false, identical = false;
  auto mpi = Make(ReplicatorOptions::Backend::kMpi, 0, 30000ms);  // one per process: MPI initialises once
  const double waiting = PacedRun(mpi.get(), false, &late_waiting, &identical_waiting);
  const double deadline = PacedRun(mpi.get(), true, &late, &identical);
  std::printf("20 steps, rank 1 of 2 slowed 8x: %.3f s waiting for it, %.3f s with the deadline (rank 1 late on %lld)\n",
              waiting, deadline, static_cast<long long>(late));
  const bool ok = waiting > 0 && deadline > 0 && deadline < 0.75 * waiting && late >= 15 && late_waiting == 0 &&
                  identical && identical_waiting;
  return ok ? 0 : 1;
}

int Mesh() {
  constexpr int kModelParallel = 2;
  ReplicatorOptions o;
  o.backend = ReplicatorOptions::Backend::kMpi;
  o.model_parallel = kModelParallel;
  o.timeout = 30000ms;
  auto mpi = Replicator::Create(o);
  if (!mpi.ok()) {
    std::fprintf(stderr, "%s\n", mpi.status().ToString().c_str());
    return 1;
  }
  const int rank = (*mpi)->local_replicas()[0];
  if ((*mpi)->num_replicas() != 4) {
    std::fprintf(stderr, "expected 4 MPI replicas, got %d\n", (*mpi)->num_replicas());
    return 1;
  }
  testing::MlpWeights got, whole;
  int model_index = -1, data_index = -1;
  absl::Status s = (*mpi)->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    model_index = ctx.model_axis().replica_id();
    data_index = ctx.data_axis().replica_id();
    ASSIGN_OR_RETURN(got, testing::TrainMeshMlp(ctx, /*steps=*/10));
    return absl::OkStatus();
  });
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: mesh training failed: %s\n", rank, s.ToString().c_str());
    return 1;
  }
  auto single = Make(ReplicatorOptions::Backend::kInProcess, 1, 30000ms);
  s = single->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(whole, testing::TrainMeshMlp(ctx, /*steps=*/10));
    return absl::OkStatus();
  });
  if (!s.ok()) return 1;
  const double worst = testing::WorstMlpDifference(got, whole, rank % kModelParallel, kModelParallel);
  std::printf("rank %d (data %d, model %d): worst relative difference from one replica %.2g\n", rank, data_index,
              model_index, worst);
  return worst <= 1e-5 && model_index == rank % kModelParallel && data_index == rank / kModelParallel ? 0 : 1;
}

}  // namespace
}  // namespace troupe::replicator

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  if (scenario == "equivalence") return troupe::replicator::Equivalence();
  if (scenario == "stall") return troupe::replicator::Stall();
  if (scenario == "mismatch") return troupe::replicator::Mismatch();
  if (scenario == "sharded") return troupe::replicator::Sharded();
  if (scenario == "scatter") return troupe::replicator::Scatter();
  if (scenario == "deadline") return troupe::replicator::Deadline();
  if (scenario == "mesh") return troupe::replicator::Mesh();
  std::fprintf(stderr, "usage: %s equivalence|stall|mismatch|scatter|sharded|deadline|mesh\n", argv[0]);
  return 2;
}
