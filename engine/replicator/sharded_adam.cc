#include "engine/replicator/sharded_adam.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace troupe::replicator {

absl::StatusOr<std::unique_ptr<ShardedAdam>> ShardedAdam::Create(nn::ParameterSet* params, int replica_id,
                                                                 int num_replicas, const ShardedAdamOptions& options) {
  TROUPE_CHECK(params->allocated() && replica_id >= 0 && replica_id < num_replicas);
  RETURN_IF_ERROR(options.adam.Validate());
  if (!(options.max_grad_norm >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("sharded Adam: max_grad_norm ", options.max_grad_norm, " < 0"));
  }
  const int k = num_replicas;
  const int64_t whole = params->padded_floats();
  if (whole % PadMultiple(k) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sharded Adam over ", k, " replicas: the parameters' buffers hold ", whole, " floats, not a multiple of ",
        PadMultiple(k), " (allocate them with ParameterSet::Allocate(backend, seed, ShardedAdam::PadMultiple(", k,
        ")))"));
  }
  return std::unique_ptr<ShardedAdam>(
      new ShardedAdam(params, replica_id, num_replicas, options, whole / k, /*part=*/nullptr));
}

absl::StatusOr<std::unique_ptr<ShardedAdam>> ShardedAdam::CreateForParameters(ShardedParameters* parts,
                                                                              int replica_id, int num_replicas,
                                                                              const ShardedAdamOptions& options) {
  RETURN_IF_ERROR(options.adam.Validate());
  if (!(options.max_grad_norm >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat("sharded Adam: max_grad_norm ", options.max_grad_norm, " < 0"));
  }
  TROUPE_CHECK(parts->part().has_gradients() && parts->part_begin() == replica_id * parts->part_floats() &&
               parts->set().padded_floats() == num_replicas * parts->part_floats());
  return std::unique_ptr<ShardedAdam>(new ShardedAdam(&parts->set(), replica_id, num_replicas, options,
                                                      parts->part_floats(), &parts->part()));
}

ShardedAdam::ShardedAdam(nn::ParameterSet* params, int replica_id, int num_replicas, const ShardedAdamOptions& options,
                         int64_t count, nn::ParameterSet* part)
    : params_(params),
      replica_id_(replica_id),
      num_replicas_(num_replicas),
      options_(options),
      begin_(replica_id * count),
      count_(count),
      part_set_(part) {
  nn::Backend& backend = params->backend();
  if (part_set_ == nullptr && backend.runs_replicas_as_one_program() && num_replicas > 1) {
    own_.Add("part", {count}, nn::Init::Zeros());
    own_.Allocate(backend, /*seed=*/0);
    backend.Copy(params->device_values() + begin_, own_.device_values(), count_);
    part_set_ = &own_;
  }
  if (part_set_ != nullptr) {
    part_ = std::make_unique<nn::Adam>(part_set_, &backend, options.adam);
  } else {
    part_ = std::make_unique<nn::Adam>(params, &backend, options.adam, begin_, count_);
  }
}

float* ShardedAdam::part_values() const {
  return part_set_ != nullptr ? part_set_->device_values() : params_->device_values() + begin_;
}
float* ShardedAdam::part_grads() const {
  return part_set_ != nullptr ? part_set_->device_grads() : params_->device_grads() + begin_;
}

absl::Status ShardedAdam::set_context(ReplicaContext* ctx) {
  if (ctx->replica_id() != replica_id_ || ctx->num_replicas() != num_replicas_) {
    return absl::InternalError(absl::StrCat("sharded Adam of replica ", replica_id_, " of ", num_replicas_,
                                            " given the context of replica ", ctx->replica_id(), " of ",
                                            ctx->num_replicas()));
  }
  if (ctx->ReducesOnDevice()) {
    return absl::UnimplementedError(
        "sharded optimizer state: replicas sharing one device reduce on it, where splitting the state saves no "
        "device memory; give each replica its own device");
  }
  ctx_ = ctx;
  return absl::OkStatus();
}

void ShardedAdam::Apply() {
  TROUPE_CHECK(ctx_ != nullptr);  // set_context first
  if (!ctx_->status().ok()) return;
  nn::Backend& backend = params_->backend();
  // Errors stay in ctx_->status().
  if (!ctx_->ReduceScatterDevice(backend, params_->device_grads(), part_grads(), count_, ReduceOp::kMean).ok()) return;
  if (options_.max_grad_norm > 0 && !ClipPart(part_grads()).ok()) return;
  part_->Apply();
  if (gather_values_) ctx_->AllGatherDevice(backend, part_values(), params_->device_values(), count_).IgnoreError();
}

// x *= max_norm / max(||x||, max_norm) (nn::ClipGradientsByGlobalNorm's
// factor), ||x|| over every part: its square all-reduced on the device.
absl::Status ShardedAdam::ClipPart(float* grads) {
  nn::Backend& backend = params_->backend();
  if (norm_.empty()) norm_ = nn::DeviceBuffer(backend, 2);
  float* factor = norm_.data();
  float* limit = norm_.data() + 1;
  backend.SquaredNorm(grads, count_, factor);
  RETURN_IF_ERROR(ctx_->AllReduceDevice(backend, factor, 1, ReduceOp::kSum));
  nn::ClipBySquaredNorm(backend, options_.max_grad_norm, factor, limit, grads, count_);
  return absl::OkStatus();
}

std::vector<nn::OptimizerState> ShardedAdam::State() {
  nn::Backend& backend = params_->backend();
  for (nn::DeviceBuffer* b : {&whole_m_, &whole_v_}) {
    if (!b->empty()) continue;
    *b = nn::DeviceBuffer(backend, params_->padded_floats());
    backend.Fill(b->data(), b->size(), 0.0f);
  }
  return {{"adam.m", whole_m_.data()}, {"adam.v", whole_v_.data()}};
}

absl::Status ShardedAdam::GatherState() {
  TROUPE_CHECK(ctx_ != nullptr || num_replicas_ == 1);  // set_context first
  const std::vector<nn::OptimizerState> whole = State(), part = part_->State();
  nn::Backend& backend = params_->backend();
  for (size_t s = 0; s < whole.size(); ++s) {
    if (num_replicas_ == 1) {
      backend.Copy(part[s].data, whole[s].data, count_);
    } else {
      RETURN_IF_ERROR(ctx_->AllGatherDevice(backend, part[s].data, whole[s].data, count_));
    }
  }
  return absl::OkStatus();
}

absl::Status ShardedAdam::GatherStateToHost(std::vector<std::vector<float>>* whole) {
  absl::Status status = GatherState();
  whole->clear();
  for (const nn::OptimizerState& s : State()) {
    if (!status.ok()) break;
    std::vector<float>& host = whole->emplace_back(params_->padded_floats());
    params_->backend().Download(s.data, host.data(), sizeof(float) * host.size());
  }
  ReleaseWholeState();
  return status;
}

absl::Status ShardedAdam::GatherLocalToHost(const std::vector<ShardedAdam*>& replicas,
                                            std::vector<std::vector<float>>* whole) {
  TROUPE_CHECK(!replicas.empty());
  const int k = replicas[0]->num_replicas_;
  if (static_cast<int>(replicas.size()) != k) {
    return absl::FailedPreconditionError(absl::StrCat("sharded Adam: ", replicas.size(), " of the ", k,
                                                      " replicas' parts are in this process; a checkpoint needs all"));
  }
  whole->clear();
  for (int r = 0; r < k; ++r) {
    ShardedAdam& from = *replicas[r];
    TROUPE_CHECK(from.replica_id_ == r && from.count_ == replicas[0]->count_);
    const std::vector<nn::OptimizerState> part = from.part_->State();
    whole->resize(part.size());
    for (size_t s = 0; s < part.size(); ++s) {
      (*whole)[s].resize(k * from.count_);
      from.params_->backend().Download(part[s].data, (*whole)[s].data() + from.begin_, sizeof(float) * from.count_);
    }
  }
  return absl::OkStatus();
}

absl::Status ShardedAdam::GatherLocal(const std::vector<ShardedAdam*>& replicas, ShardedAdam& into) {
  std::vector<std::vector<float>> host;
  RETURN_IF_ERROR(GatherLocalToHost(replicas, &host));
  const std::vector<nn::OptimizerState> whole = into.State();
  TROUPE_CHECK(host.size() == whole.size());
  for (size_t s = 0; s < whole.size(); ++s) {
    into.params_->backend().Upload(host[s].data(), whole[s].data, sizeof(float) * host[s].size());
  }
  return absl::OkStatus();
}

void ShardedAdam::KeepOwnPart() {
  if (own_.allocated()) params_->backend().Copy(params_->device_values() + begin_, own_.device_values(), count_);
  if (whole_m_.empty()) return;  // no moments were loaded
  const std::vector<nn::OptimizerState> part = part_->State();
  params_->backend().Copy(whole_m_.data() + begin_, part[0].data, count_);
  params_->backend().Copy(whole_v_.data() + begin_, part[1].data, count_);
  ReleaseWholeState();
}

void ShardedAdam::KeepOwnPartFromHost(const std::vector<std::vector<float>>& whole) {
  nn::Backend& backend = params_->backend();
  if (own_.allocated()) backend.Copy(params_->device_values() + begin_, own_.device_values(), count_);
  const std::vector<nn::OptimizerState> part = part_->State();
  TROUPE_CHECK(whole.size() == part.size());
  for (size_t s = 0; s < part.size(); ++s) {
    TROUPE_CHECK(static_cast<int64_t>(whole[s].size()) >= begin_ + count_);
    backend.Upload(whole[s].data() + begin_, part[s].data, sizeof(float) * count_);
  }
  ReleaseWholeState();
}

std::vector<std::string> ShardedAdam::StateNames() const {
  std::vector<std::string> names;
  for (const nn::OptimizerState& s : part_->State()) names.push_back(s.name);
  return names;
}

void ShardedAdam::ReleaseWholeState() {
  whole_m_ = nn::DeviceBuffer();
  whole_v_ = nn::DeviceBuffer();
}

}  // namespace troupe::replicator
