// Run by `troupe bench straggler` under `mpiexec -np 4`: one round of the
// straggler benchmark (bench/straggler_round.h) with the replicas as MPI
// ranks, one engine thread each:
//   troupe_straggler_mpi SECONDS SLOWED DEADLINE
// SLOWED 1: rank 3 slowed 2x; DEADLINE > 0: engine.straggler DEADLINE at that
// factor, else waiting. Each rank prints "steps_per_s X".
#include <cstdio>
#include <cstdlib>

#include "bench/straggler_round.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s SECONDS SLOWED DEADLINE (under mpiexec -np %d)\n", argv[0],
                 troupe::bench::kStragglerReplicas);
    return 2;
  }
  const absl::StatusOr<double> rate = troupe::bench::StragglerRound(
      troupe::replicator::ReplicatorOptions::Backend::kMpi, std::atof(argv[1]), std::atoi(argv[2]) != 0,
      static_cast<float>(std::atof(argv[3])));
  if (!rate.ok()) {
    std::fprintf(stderr, "%s\n", rate.status().ToString().c_str());
    return 1;
  }
  // Every rank (they stop at the same step; the bench reads the last line).
  std::printf("steps_per_s %.3f\n", *rate);
  return 0;
}
