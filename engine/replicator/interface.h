// Collective communication between replicas: the strategy family behind the
// Replicator (in_process.h: K threads in one process; mpi.h: MPI processes).
//
// Every replica calls the same collectives in the same order. Each call is
// checked against the other replicas' (sequence number, kind, element count);
// a replica that calls something else, or does not arrive within the timeout,
// or has failed, makes the call return an error that names it:
//   DeadlineExceeded "replica 1 did not reach collective #7 (AllReduce of 1024 floats) within 10s"
//   FailedPrecondition "collective #7: replica 1 called Broadcast of 10 floats, replica 0 AllReduce of 20"
//   Aborted "replica 1 failed: <its error>"
// After an error every later collective on that replica fails at once.
#ifndef TROUPE_ENGINE_REPLICATOR_INTERFACE_H_
#define TROUPE_ENGINE_REPLICATOR_INTERFACE_H_

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "engine/nn/backend.h"

namespace troupe::replicator {

enum class ReduceOp { kSum, kMean };

// One replica's end of a collective group. Not thread-safe: one replica
// thread uses it.
class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int replica_id() const = 0;
  virtual int num_replicas() const = 0;
  // This replica's rank among the replicas on its machine, which picks its
  // device (GPU): the replica id in a group of threads, the node-local rank
  // under MPI.
  virtual int local_rank() const { return replica_id(); }
  // True when the collectives take a device backend's memory in place
  // (NCCL); otherwise they take host memory, and ReplicaContext stages a
  // device buffer through it.
  virtual bool takes_device_memory() const { return false; }
  // True when the replicas share one device and reduce its memory there with
  // their own backends' kernels (K replicas on one GPU, each its own stream):
  // device buffers then go to AllReduceOnDevice, host memory (batch-norm
  // statistics) to AllReduce as before.
  virtual bool reduces_on_device() const { return false; }
  // data (`count` floats of `backend`'s memory) = op over replicas, computed
  // on the device with one replica's kernels reading the others' buffers.
  virtual absl::Status AllReduceOnDevice(nn::Backend& backend, float* data, int64_t count, ReduceOp op) {
    return absl::UnimplementedError("these collectives reduce host memory (reduces_on_device is false)");
  }

  // data = op over replicas of data (in place). Blocks until all arrive; a
  // replica that does not arrive, or stops inside the collective, is an
  // error within the timeout on every backend.
  virtual absl::Status AllReduce(std::span<float> data, ReduceOp op) = 0;
  // out[r * in.size() + i] = replica r's in[i]; out.size() == K * in.size().
  // In place when `in` is this replica's own part of `out` (in.data() ==
  // out.data() + replica_id() * in.size()).
  virtual absl::Status AllGather(std::span<const float> in, std::span<float> out) = 0;
  // Replica r's out[i] = op over replicas of in[r * out.size() + i];
  // in.size() == K * out.size(): each replica gets its part of the reduced
  // whole (a sharded optimizer's gradient). In place when `out` is this
  // replica's own part of `in` (out.data() == in.data() + replica_id() *
  // out.size()).
  virtual absl::Status ReduceScatter(std::span<const float> in, std::span<float> out, ReduceOp op) = 0;
  // Every replica's data = replica `root`'s data.
  virtual absl::Status Broadcast(std::span<float> data, int root) = 0;

  // Starts an all-reduce that may complete in the background (MPI), so a
  // bucket of late-layer gradients reduces while earlier layers are still
  // differentiated; `data` must stay untouched until WaitAll(). Backends
  // without background progress complete it before returning.
  virtual absl::Status StartAllReduce(std::span<float> data, ReduceOp op) = 0;
  // Waits for every started all-reduce (applying kMean's division).
  virtual absl::Status WaitAll() = 0;

  // Marks this replica failed so that the others' pending and later
  // collectives return Aborted naming it instead of waiting.
  virtual void Fail(const absl::Status& status) = 0;
};

// "AllReduce of 1024 floats": how errors describe a collective.
std::string DescribeCollective(int kind, int64_t count);
enum CollectiveKind { kAllReduce = 1, kAllGather = 2, kBroadcast = 3, kAllReduceOnDevice = 4, kReduceScatter = 5 };

}  // namespace troupe::replicator

#endif  // TROUPE_ENGINE_REPLICATOR_INTERFACE_H_
