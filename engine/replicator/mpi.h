// The MPI backend: one replica per MPI process (`mpirun -np K`), replica id =
// rank in MPI_COMM_WORLD. Collectives are nonblocking MPI calls polled against
// a deadline, so a stalled replica is a DeadlineExceeded error, not a hang.
// Before each collective the ranks exchange (sequence, kind, count) point to
// point, which names a replica that is missing or called something else.
// (A replica that dies makes mpirun end the job, as OpenMPI does.)
//
// Not thread-safe: the replica's one thread uses it (MPI_THREAD_FUNNELED).
#ifndef TROUPE_ENGINE_REPLICATOR_MPI_H_
#define TROUPE_ENGINE_REPLICATOR_MPI_H_

#include <chrono>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/replicator/interface.h"

namespace troupe::replicator {

// The MPI communicator a MpiCollectives uses (MPI_COMM_WORLD, or a part of
// it split off for one axis of a mesh).
struct MpiComm;

// This process's place in MPI_COMM_WORLD: its rank, the world's size, and its
// rank among the ranks on its machine (which GPU is its). Initialises MPI
// (threads funnelled) if nobody has; `initialized_here` says so.
struct MpiWorld {
  int rank = 0;
  int size = 1;
  int local_rank = 0;
  bool initialized_here = false;
};
absl::StatusOr<MpiWorld> JoinMpiWorld();

class MpiCollectives final : public Collectives {
 public:
  // Initialises MPI if nobody has (and then finalises it on destruction).
  static absl::StatusOr<std::unique_ptr<MpiCollectives>> Create(std::chrono::milliseconds timeout);
  // The collectives of the ranks of MPI_COMM_WORLD that pass the same
  // `color`, ranked among themselves by `key` (MPI_Comm_split; every rank
  // calls it): one axis of a mesh. MPI must be initialised (Create first).
  static absl::StatusOr<std::unique_ptr<MpiCollectives>> CreateSplit(int color, int key,
                                                                     std::chrono::milliseconds timeout);
  ~MpiCollectives() override;

  int replica_id() const override { return rank_; }
  int num_replicas() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  absl::Status AllReduce(std::span<float> data, ReduceOp op) override;
  absl::Status AllGather(std::span<const float> in, std::span<float> out) override;
  absl::Status ReduceScatter(std::span<const float> in, std::span<float> out, ReduceOp op) override;
  absl::Status Broadcast(std::span<float> data, int root) override;
  absl::Status StartAllReduce(std::span<float> data, ReduceOp op) override;
  absl::Status WaitAll() override;
  void Fail(const absl::Status& status) override;

 private:
  MpiCollectives(std::unique_ptr<MpiComm> comm, int rank, int size, int local_rank, bool owns_mpi,
                 std::chrono::milliseconds timeout);
  // Exchanges descriptors with every other rank; names the missing/mismatched one.
  absl::Status CheckDescriptors(int kind, int64_t count, int root);
  // Polls `request` (an MPI_Request*) until done or the deadline.
  absl::Status Wait(void* request, int kind, int64_t count);

  const std::unique_ptr<MpiComm> comm_;  // MPI_COMM_WORLD's or split off it (then freed with this)
  const int rank_, size_, local_rank_;
  const bool owns_mpi_;
  const std::chrono::milliseconds timeout_;
  int64_t seq_ = 0;
  absl::Status failure_;
  struct Pending;
  std::vector<std::unique_ptr<Pending>> pending_;
  std::vector<float> scratch_;  // ReduceScatter's result when it is in place
};

}  // namespace troupe::replicator

#endif  // TROUPE_ENGINE_REPLICATOR_MPI_H_
