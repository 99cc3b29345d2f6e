#include "engine/replicator/sharded_parameters.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/replicator/sharded_adam.h"

namespace troupe::replicator {

absl::StatusOr<std::unique_ptr<ShardedParameters>> ShardedParameters::Create(nn::ParameterSet* set, int replica_id,
                                                                             int num_replicas) {
  TROUPE_CHECK(set->allocated() && set->holds_buffers() && replica_id >= 0 && replica_id < num_replicas);
  const int64_t whole = set->padded_floats();
  if (whole % ShardedAdam::PadMultiple(num_replicas) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "parameters split over ", num_replicas, " replicas: the set's buffers hold ", whole,
        " floats, not a multiple of ", ShardedAdam::PadMultiple(num_replicas),
        " (allocate them with ParameterSet::Allocate(backend, seed, ShardedAdam::PadMultiple(", num_replicas, ")))"));
  }
  return std::unique_ptr<ShardedParameters>(
      new ShardedParameters(set, replica_id, num_replicas, whole / num_replicas, set->has_gradients()));
}

ShardedParameters::ShardedParameters(nn::ParameterSet* set, int replica_id, int num_replicas, int64_t count,
                                     bool gradients)
    : set_(set),
      replica_id_(replica_id),
      num_replicas_(num_replicas),
      begin_(replica_id * count),
      count_(count),
      has_gradients_(gradients) {
  nn::Backend& backend = set->backend();
  part_.Add("part", {count}, nn::Init::Zeros());
  part_.Allocate(backend, /*seed=*/0, /*pad_multiple=*/1, gradients);
  backend.Copy(set->device_values() + begin_, part_.device_values(), count_);
  set->ReleaseBuffers();
}

absl::Status ShardedParameters::Gather(ReplicaContext& ctx) {
  TROUPE_CHECK(ctx.replica_id() == replica_id_ && ctx.num_replicas() == num_replicas_);
  set_->AllocateBuffers();
  nn::Backend& backend = set_->backend();
  if (num_replicas_ == 1) {
    backend.Copy(part_.device_values(), set_->device_values(), count_);
    return absl::OkStatus();
  }
  return ctx.AllGatherDevice(backend, part_.device_values(), set_->device_values(), count_);
}

absl::Status ShardedParameters::GatherToHost(ReplicaContext& ctx, std::vector<float>* whole) {
  TROUPE_CHECK(!set_->holds_buffers());  // between steps
  const absl::Status status = Gather(ctx);
  if (status.ok()) *whole = set_->DownloadValues();
  Release();
  return status;
}

void ShardedParameters::Polyak(const ShardedParameters& online, float tau) {
  TROUPE_CHECK(online.count_ == count_ && online.begin_ == begin_);
  part_.backend().Polyak(count_, tau, online.part_.device_values(), part_.device_values());
}

absl::Status ShardedParameters::GatherLocalToHost(std::span<const ShardedParameters* const> parts,
                                                  std::vector<float>* whole) {
  TROUPE_CHECK(!parts.empty());
  const int k = parts[0]->num_replicas_;
  if (static_cast<int>(parts.size()) != k) {
    return absl::FailedPreconditionError(absl::StrCat("parameters split over ", k, " replicas: ", parts.size(),
                                                      " of their parts are in this process; the whole needs all"));
  }
  whole->resize(k * parts[0]->count_);
  for (int r = 0; r < k; ++r) {
    const ShardedParameters& from = *parts[r];
    TROUPE_CHECK(from.replica_id_ == r && from.count_ == parts[0]->count_);
    from.part_.backend().Download(from.part_.device_values(), whole->data() + from.begin_,
                                  sizeof(float) * from.count_);
  }
  return absl::OkStatus();
}

void ShardedParameters::SetPartFromHost(std::span<const float> whole) {
  TROUPE_CHECK(static_cast<int64_t>(whole.size()) >= begin_ + count_);
  part_.backend().Upload(whole.data() + begin_, part_.device_values(), sizeof(float) * count_);
}

}  // namespace troupe::replicator
