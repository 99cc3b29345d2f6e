// One round of `troupe bench straggler`: K = 4 replicas training an MLP
// (the shape of D4PG's critic from state: 64 -> 256 -> 256 -> 51, 64 rows a
// replica) for a time, replica 3 slowed 2x when asked (after each of its
// forward pass and backward nodes it sleeps as long as that work took: a
// neighbour taking half its core without taking the others' cores), waiting
// for every replica or with a step deadline. The replicas are threads of
// this process, or MPI ranks (run under `mpiexec -np 4`:
// bench/peers/straggler_mpi.cc).
#ifndef TROUPE_BENCH_STRAGGLER_ROUND_H_
#define TROUPE_BENCH_STRAGGLER_ROUND_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "engine/replicator/replicator.h"

namespace troupe::bench {

inline constexpr int kStragglerReplicas = 4;
inline constexpr int kStragglerSlowReplica = 3;
inline constexpr int64_t kStragglerRows = 64, kStragglerIn = 64, kStragglerHidden = 256, kStragglerOut = 51;

// Steps/s of a fresh group of kStragglerReplicas replicas training for
// `seconds` (they stop together: replica 0's clock, in an all-reduce);
// `deadline` > 0: engine.straggler DEADLINE at that factor, else waiting.
absl::StatusOr<double> StragglerRound(replicator::ReplicatorOptions::Backend collectives, double seconds, bool slowed,
                                      float deadline);

}  // namespace troupe::bench

#endif  // TROUPE_BENCH_STRAGGLER_ROUND_H_
