// Run under `mpiexec -np 2` by ctest (see learner/CMakeLists.txt), one
// scenario per test:
//   equivalence  K=2 MPI replicas on half batches == one replica on the whole
//                batch, after 5 Adam steps with bucketed gradient reduction
//   stall        replica 1 stalls; replica 0's collective times out naming it
//   mismatch     replicas call different collectives; the error names them
// Exit status 0 iff the scenario behaved as expected on this rank.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <thread>

#include "common/status_macros.h"
#include "engine/replicator/replicator.h"
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

}  // namespace
}  // namespace troupe::replicator

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  if (scenario == "equivalence") return troupe::replicator::Equivalence();
  if (scenario == "stall") return troupe::replicator::Stall();
  if (scenario == "mismatch") return troupe::replicator::Mismatch();
  std::fprintf(stderr, "usage: %s equivalence|stall|mismatch\n", argv[0]);
  return 2;
}
