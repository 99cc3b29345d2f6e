// Run by `troupe bench learner` under `mpiexec -np 2`: times the all-reduce
// (mean) of a gradient buffer of N floats through troupe's MPI Replicator
// backend (ReplicaContext::AllReduce: the descriptor exchange that turns a
// missing or mismatched replica into an error, a nonblocking MPI_Iallreduce
// polled against the timeout, and the division by K of a mean) and a raw
// blocking MPI_Allreduce (sum) of the same buffer. Rank 0 prints
// "troupe_ms X raw_ms Y".
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "engine/replicator/replicator.h"

int main(int argc, char** argv) {
  using namespace troupe::replicator;
  const long floats = argc > 1 ? std::atol(argv[1]) : 1 << 21;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 20;
  ReplicatorOptions options;
  options.backend = ReplicatorOptions::Backend::kMpi;
  options.timeout = std::chrono::milliseconds(60000);
  auto replicator = Replicator::Create(options);
  if (!replicator.ok()) {
    std::fprintf(stderr, "%s\n", replicator.status().ToString().c_str());
    return 1;
  }
  std::vector<float> grads(floats, 1.0f);
  double troupe_ms = 0, raw_ms = 0;
  absl::Status s = (*replicator)->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    using Clock = std::chrono::steady_clock;
    // Warm up both paths, then time `reps` of each.
    if (auto st = ctx.AllReduce(grads, ReduceOp::kMean); !st.ok()) return st;
    MPI_Allreduce(MPI_IN_PLACE, grads.data(), static_cast<int>(floats), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    auto start = Clock::now();
    for (int i = 0; i < reps; ++i) {
      if (auto st = ctx.AllReduce(grads, ReduceOp::kMean); !st.ok()) return st;
    }
    troupe_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count() / reps;
    MPI_Barrier(MPI_COMM_WORLD);
    start = Clock::now();
    for (int i = 0; i < reps; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, grads.data(), static_cast<int>(floats), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    raw_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count() / reps;
    return absl::OkStatus();
  });
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  if ((*replicator)->local_replicas()[0] == 0) std::printf("troupe_ms %.4f raw_ms %.4f\n", troupe_ms, raw_ms);
  return 0;
}
