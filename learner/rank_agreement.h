// How the RL learner's ranks stay in step under MPI (collectives MPI:
// `mpirun -np K troupe learner`, one replica per rank): rank 0 (the chief)
// tells every rank its address or why it could not start, decides each
// training step for all, and at the end every rank's state checksum is
// compared with rank 0's. Each call is a collective: every rank makes it,
// in the same order. They work the same over in-process replicas (each
// replica a rank), which is how the tests run them.
#ifndef TROUPE_LEARNER_RANK_AGREEMENT_H_
#define TROUPE_LEARNER_RANK_AGREEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/replicator/replicator.h"
#include "proto/config.pb.h"

namespace troupe::learner {

// InvalidArgument when learner.engine.replicas (K > 1) names another count
// than the `num_ranks` mpirun started under collectives MPI.
absl::Status CheckRanksMatchReplicas(const config::EngineConfig& engine, int num_ranks);

// Rank 0's start-up as floats a broadcast carries: [ok, length, characters]
// of `text` (its address, or its error's message; cut at 1000 characters).
std::vector<float> EncodeChiefStart(bool ok, const std::string& text);
// The address of a message EncodeChiefStart made; FailedPrecondition
// "learner rank 0 failed to start: WHY" for an error.
absl::StatusOr<std::string> DecodeChiefStart(const std::vector<float>& message);

// Every rank learns rank 0's address (`chief` on rank 0: its status and
// `address`; an address on every interface becomes rank 0's host name).
// Returns on rank 0 its own status; on the others rank 0's address, or
// FailedPrecondition with rank 0's error.
absl::StatusOr<std::string> ShareChiefAddress(replicator::Replicator& replicator, bool chief,
                                              const absl::Status& chief_status, const std::string& address);

// Replica 0's values in every local replica's: copies[i] is local replica
// i's (in-process replicas run at once; under MPI one per rank). What the
// calls here broadcast with.
absl::Status BroadcastFromReplicaZero(replicator::Replicator& replicator, std::vector<std::vector<float>>& copies);

// Every rank gets rank 0's `step` (what to do next).
absl::StatusOr<int> AgreeOnStep(replicator::Replicator& replicator, int step);

// Every replica's `checksum(replica)` (its state's) compared with replica
// 0's: Internal naming the first rank that differs, after `updates` updates.
absl::Status CheckReplicasAgree(replicator::Replicator& replicator, absl::FunctionRef<uint64_t(int replica)> checksum,
                                int64_t updates);

}  // namespace troupe::learner

#endif  // TROUPE_LEARNER_RANK_AGREEMENT_H_
