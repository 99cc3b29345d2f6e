#include "engine/replicator/straggler.h"

#include "common/status_macros.h"

namespace troupe::replicator {

DeadlineReducer::DeadlineReducer(ReplicaContext* ctx, nn::ParameterSet* params, const DeadlineOptions& options)
    : ctx_(ctx),
      replica_id_(ctx->replica_id()),
      num_replicas_(ctx->num_replicas()),
      params_(params),
      options_(options) {
  TROUPE_CHECK(options.factor >= 1 && options.warmup_steps >= 1);
}

void DeadlineReducer::set_context(ReplicaContext* ctx) {
  // (The previous context may be gone: a Replicator's lives one call.)
  TROUPE_CHECK(ctx->replica_id() == replica_id_ && ctx->num_replicas() == num_replicas_);
  ctx_ = ctx;
}

void DeadlineReducer::Reset() {
  start_ = Clock::now();
  late_ = false;
}

bool DeadlineReducer::StopBackward() {
  if (stats_.deadline_s <= 0) return false;
  // The host runs ahead of an asynchronous device: the kernels issued by now
  // are what counts as computed, and the rest are not issued.
  late_ = std::chrono::duration<double>(Clock::now() - start_).count() > stats_.deadline_s;
  return late_;
}

absl::Status DeadlineReducer::Finish() {
  nn::Backend& backend = params_->backend();
  float* grads = params_->device_grads();
  const int64_t count = params_->total_floats();
  const double done_s = std::chrono::duration<double>(Clock::now() - start_).count();
  // A late replica's partial gradients do not count: zero, weight zero.
  if (late_) backend.Fill(grads, count, 0.0f);
  float weights[2] = {late_ ? 0.0f : 1.0f, late_ ? 0.0f : static_cast<float>(done_s)};
  if (num_replicas_ > 1) RETURN_IF_ERROR(ctx_->AllReduce(weights, ReduceOp::kSum));
  const float finished = weights[0];
  if (finished > 0) {
    RETURN_IF_ERROR(ctx_->AllReduceDevice(backend, grads, count, ReduceOp::kSum));
    backend.NotReplayable("a deadline's weight from the host");
    backend.Scale(1.0f / finished, grads, grads, count);
    estimate_s_ = weights[1] / finished;
  } else {
    // Every replica was late: every gradient is zero already.
    ++stats_.none_finished;
    estimate_s_ *= 2;
  }
  stats_.late += late_ ? 1 : 0;
  ++stats_.steps;
  if (stats_.steps >= options_.warmup_steps) stats_.deadline_s = options_.factor * estimate_s_;
  return absl::OkStatus();
}

}  // namespace troupe::replicator
