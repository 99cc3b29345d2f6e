// Parameters split across the replicas: ZeRO stage 3 (Rajbhandari et al.
// 2020; PyTorch's FSDP). Of K replicas, replica r keeps part r of a
// ParameterSet's values (1/K of its padded buffer) between uses, and the
// whole values exist only while a step needs them:
//   Gather()   makes the set's whole buffers and all-gathers every part's
//              values into them (the gradients, where the set has them, zero);
//   Release()  frees them again (ReleaseGradients: the gradients alone).
// What changes the values changes the part (ShardedAdam over the part,
// replicator::ShardedAdam::CreateForParameters; a target network's Polyak
// average on the parts, Polyak below), so between steps a replica holds
// 1/K of the values, where data parallelism holds them whole.
//
// A checkpoint holds the whole values: GatherLocalToHost assembles them on
// the host from every replica's part where all K are in this process (no
// device holds them whole), SetPartFromHost gives a replica its part of
// values read from one. Where the parts are in other processes,
// GatherToHost does the same through the device, a collective.
//
// Not thread-safe: one replica's thread uses it.
#ifndef TROUPE_ENGINE_REPLICATOR_SHARDED_PARAMETERS_H_
#define TROUPE_ENGINE_REPLICATOR_SHARDED_PARAMETERS_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/nn/parameters.h"
#include "engine/replicator/replicator.h"

namespace troupe::replicator {

class ShardedParameters {
 public:
  // Replica `replica_id`'s part of `set` (allocated, padded to
  // ShardedAdam::PadMultiple(num_replicas): InvalidArgument naming both
  // lengths otherwise): its values are copied into a buffer of the part's
  // own and the set's whole buffers released. `set` must outlive this.
  static absl::StatusOr<std::unique_ptr<ShardedParameters>> Create(nn::ParameterSet* set, int replica_id,
                                                                   int num_replicas);

  // The whole values from every replica's part (a collective every replica
  // calls, in the same order), into buffers made for them. A collective's
  // error is returned and stays in the context.
  absl::Status Gather(ReplicaContext& ctx);
  void Release() { set_->ReleaseBuffers(); }
  void ReleaseGradients() { set_->ReleaseGradients(); }
  // Between steps, where the parts are in other processes (MPI ranks): the
  // whole values into host memory by Gather, then Release (a collective;
  // the whole buffers exist only during the call).
  absl::Status GatherToHost(ReplicaContext& ctx, std::vector<float>* whole);

  // target = (1 - tau) target + tau online, on the parts (the whole
  // average's arithmetic, element by element): `online` and this are parts
  // of sets of the same layout.
  void Polyak(const ShardedParameters& online, float tau);

  nn::ParameterSet& set() const { return *set_; }
  // The part: one parameter "part" of part_floats(), with a gradient buffer
  // where the set has one (what a reduce-scatter of the whole gradients
  // writes, and ShardedAdam steps).
  nn::ParameterSet& part() { return part_; }
  int64_t part_begin() const { return begin_; }
  int64_t part_floats() const { return count_; }
  // What this replica keeps between steps, in bytes: the part's values and
  // its gradient buffer.
  int64_t part_bytes() const { return int64_t{sizeof(float)} * count_ * (has_gradients_ ? 2 : 1); }

  // The whole values (the set's padded length) from parts[r], replica r's,
  // every one of the K in this process: FailedPrecondition otherwise.
  static absl::Status GatherLocalToHost(std::span<const ShardedParameters* const> parts, std::vector<float>* whole);
  // This replica's part of `whole` (the padded length, or at least the part's end).
  void SetPartFromHost(std::span<const float> whole);

 private:
  ShardedParameters(nn::ParameterSet* set, int replica_id, int num_replicas, int64_t count, bool gradients);

  nn::ParameterSet* set_;
  const int replica_id_, num_replicas_;
  const int64_t begin_, count_;
  const bool has_gradients_;
  nn::ParameterSet part_;
};

}  // namespace troupe::replicator

#endif  // TROUPE_ENGINE_REPLICATOR_SHARDED_PARAMETERS_H_
