// Synchronous steps that do not wait for their slowest replica: each step
// has a compute deadline, the same on every replica; a replica whose
// backward pass has not ended by then stops between kernels and joins the
// all-reduce with zero gradients and zero weight, and the sum is divided by
// the weight actually computed, so every replica applies the same update:
// the mean gradient of the replicas that finished (DropCompute, Giladi et
// al., NeurIPS 2023; the backup workers of Chen et al. 2016, "Revisiting
// Distributed Synchronous SGD", where the slowest b of N+b are dropped).
// An all-reduce cannot skip a member, so the late replica still arrives,
// at once, with nothing.
//
// The deadline: the step's start (Reset(), before the forward pass, or
// before the backward pass, which alone then counts) plus
// `factor` x the mean time the replicas that finished the previous step took
// to end their backward pass (all-reduced with the weights, so every replica
// computes the same deadline). The first `warmup_steps` steps have none. A
// step no replica finished updates with a zero gradient (counted), and the
// estimate doubles, so a slowdown of every replica is followed, not
// refused.
//
// Unlike GradientReducer it reduces once, after backward: a replica knows
// whether it contributes only when its pass ends. Only the backward pass
// stops: the forward's kernels (and its collectives, as cross-replica batch
// norm) run on every replica.
//
// Not thread-safe: one replica's thread uses it.
#ifndef TROUPE_ENGINE_REPLICATOR_STRAGGLER_H_
#define TROUPE_ENGINE_REPLICATOR_STRAGGLER_H_

#include <chrono>
#include <cstdint>

#include "absl/status/status.h"
#include "engine/nn/parameters.h"
#include "engine/replicator/replicator.h"

namespace troupe::replicator {

struct DeadlineOptions {
  double factor = 1.25;  // the deadline, in multiples of the finishers' mean backward-done time
  int warmup_steps = 5;  // steps without a deadline, that measure
};

struct DeadlineStats {
  int64_t steps = 0;
  int64_t late = 0;          // steps this replica stopped at the deadline
  int64_t none_finished = 0;  // steps no replica finished (a zero gradient)
  double deadline_s = 0;     // the current deadline after a step's start (0: none yet)
};

class DeadlineReducer final : public GradientReduction {
 public:
  DeadlineReducer(ReplicaContext* ctx, nn::ParameterSet* params, const DeadlineOptions& options);
  // The replicas' current call's context (the same replica id and K).
  void set_context(ReplicaContext* ctx);

  // The step starts (call before its forward pass).
  void Reset() override;
  void OnGradientReady(const nn::ParameterSet&, int) override {}
  // Past the deadline: this replica's pass stops here.
  bool StopBackward() override;
  // The weighted mean over the replicas that finished, on every replica.
  absl::Status Finish() override;

  const DeadlineStats& stats() const { return stats_; }

 private:
  using Clock = std::chrono::steady_clock;
  ReplicaContext* ctx_;
  const int replica_id_, num_replicas_;
  nn::ParameterSet* params_;
  const DeadlineOptions options_;
  Clock::time_point start_;
  bool late_ = false;
  double estimate_s_ = 0;  // the finishers' mean backward-done time (0: not measured)
  DeadlineStats stats_;
};

}  // namespace troupe::replicator

#endif  // TROUPE_ENGINE_REPLICATOR_STRAGGLER_H_
