// Adam with its moments split across the replicas: ZeRO stage 1
// (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
// Trillion Parameter Models"). Of K replicas, replica r keeps Adam's two
// moments for part r only, 1/K of the parameters' buffer. An update:
//   1. the gradients reduce-scattered: replica r gets the mean over replicas
//      of its part (where plain data parallelism all-reduces all of it);
//   2. clipped by the global norm when asked (the parts' squared norms
//      all-reduced on the device: one float);
//   3. Adam on its part, with its part's moments;
//   4. the parameters all-gathered: every replica has the whole update.
// Every replica ends the update with the parameters unsharded Adam after an
// all-reduce gives (up to the order of float sums), keeping 2/K of a
// parameter buffer of optimizer state where Adam keeps 2.
//
// Where the replicas run each step as one program (PJRT with K replicas:
// Backend::runs_replicas_as_one_program), no kernel may address the
// replica's own part of a buffer (its offset differs by replica), so the
// part lives in buffers of its own: the reduce-scatter writes its gradient
// there, Adam updates the part's values there, and the all-gather reads
// them (the part's values are kept between updates: 2/K of a buffer more;
// KeepOwnPart takes them again after the whole values were loaded).
// Elsewhere the part is updated in place in the parameters' buffers.
//
// With the parameters split too (ZeRO stage 3: CreateForParameters), the
// part is a ShardedParameters' part, whose values are the parameters' part
// between updates; the whole buffers exist only from its Gather() to its
// Release(), and Apply gathers the updated values into them only when asked
// (set_gather_values).
//
// A checkpoint holds the whole moments under unsharded Adam's names
// ("adam.m", "adam.v"), so a run saved with any K, sharded or not, loads
// into any other: GatherState() (a collective) before writing one,
// KeepOwnPart() after reading one.
//
// Not thread-safe: one replica's thread uses it.
#ifndef TROUPE_ENGINE_REPLICATOR_SHARDED_ADAM_H_
#define TROUPE_ENGINE_REPLICATOR_SHARDED_ADAM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/nn/optimizer.h"
#include "engine/nn/parameters.h"
#include "engine/replicator/replicator.h"
#include "engine/replicator/sharded_parameters.h"

namespace troupe::replicator {

struct ShardedAdamOptions {
  nn::AdamOptions adam;
  float max_grad_norm = 0;  // > 0: the averaged gradients clipped to this global norm first
};

class ShardedAdam final : public nn::Optimizer {
 public:
  // The padding K equal parts need: allocate the parameters with
  // ParameterSet::Allocate(backend, seed, PadMultiple(K)).
  static int64_t PadMultiple(int num_replicas) { return int64_t{16} * num_replicas; }

  // Replica `replica_id`'s part of `params` (allocated on their backend,
  // padded to PadMultiple(num_replicas)). InvalidArgument when they are not
  // padded so, naming both lengths.
  static absl::StatusOr<std::unique_ptr<ShardedAdam>> Create(nn::ParameterSet* params, int replica_id,
                                                             int num_replicas, const ShardedAdamOptions& options);

  // Adam over `parts`' part of the parameters (ZeRO stage 3), `parts`
  // outliving it: Apply reduce-scatters the whole gradients (gathered
  // buffers) into the part's gradient, steps the part, and all-gathers the
  // updated values into the whole ones when set_gather_values (the default).
  static absl::StatusOr<std::unique_ptr<ShardedAdam>> CreateForParameters(ShardedParameters* parts, int replica_id,
                                                                          int num_replicas,
                                                                          const ShardedAdamOptions& options);
  // Whether Apply ends with the whole values all-gathered (false where the
  // step releases them next, unread: one collective less).
  void set_gather_values(bool gather) { gather_values_ = gather; }

  // The context of the replicas' current call (a Replicator makes one per
  // RunReplicas), before an update or GatherState: its replica id and K are
  // Create's. Unimplemented for replicas sharing one device (they reduce on
  // it, and splitting the state there saves no memory).
  absl::Status set_context(ReplicaContext* ctx);

  using Optimizer::Prepare;
  void Prepare(float learning_rate, nn::StepStaging* staging) override { part_->Prepare(learning_rate, staging); }
  // Steps 1-4 above. A collective's error stays in the context (its
  // status()) and the rest of the update is skipped, as ReplicatedOptimizer
  // does.
  void Apply() override;
  int64_t steps() const override { return part_->steps(); }
  void set_steps(int64_t steps) override { part_->set_steps(steps); }
  // The whole moments (the parameters' padded length each), allocated on
  // first use: what GatherState() fills and a checkpoint's load writes.
  std::vector<nn::OptimizerState> State() override;
  std::string name() const override { return "adam"; }
  nn::ParameterSet& parameters() override { return *params_; }

  // Every replica's part of the moments into the whole ones (State()): a
  // collective every replica calls before a checkpoint is written.
  absl::Status GatherState();
  // GatherState into host memory ((*whole)[s]: state s, StateNames' order,
  // the parameters' padded length, as KeepOwnPartFromHost takes them), the
  // whole moments released after: a checkpoint where the other parts are in
  // other processes.
  absl::Status GatherStateToHost(std::vector<std::vector<float>>* whole);
  // After a checkpoint's load filled State() and the parameters: this
  // replica's part of the moments becomes its moments (the whole ones are
  // released), and where the part has buffers of its own, its part of the
  // values is taken again. Outside a step.
  void KeepOwnPart();
  // KeepOwnPart from a checkpoint's whole moments on the host (whole[s]:
  // state s, StateNames' order, the parameters' padded length or more), the
  // whole values already loaded: no device holds the whole moments.
  void KeepOwnPartFromHost(const std::vector<std::vector<float>>& whole);
  // The names of the states State() gives ("adam.m", "adam.v"), without
  // making the whole ones.
  std::vector<std::string> StateNames() const;
  // Releases the whole moments (after a checkpoint was written).
  void ReleaseWholeState();
  // GatherState without a collective, where all K replicas are in this
  // process: replicas[r] is replica r's (each on its own backend); their
  // parts go into `into`'s whole moments, for a checkpoint taken between
  // updates.
  static absl::Status GatherLocal(const std::vector<ShardedAdam*>& replicas, ShardedAdam& into);
  // The same into host memory, no device holding the whole moments (a
  // checkpoint of a model that only fits split): (*whole)[s] is state s
  // (StateNames' order) of the parameters' padded length, as
  // KeepOwnPartFromHost takes them.
  static absl::Status GatherLocalToHost(const std::vector<ShardedAdam*>& replicas,
                                        std::vector<std::vector<float>>* whole);

  int64_t part_begin() const { return begin_; }
  int64_t part_floats() const { return count_; }
  // The optimizer state this replica keeps between updates, in bytes: its
  // part of the two moments (unsharded Adam keeps 2 x the whole buffer).
  int64_t state_bytes() const { return int64_t{sizeof(float)} * part_->state_floats(); }
  // Whether the part lives in buffers of its own (see the top of this file).
  bool own_part_buffers() const { return own_.allocated(); }

 private:
  ShardedAdam(nn::ParameterSet* params, int replica_id, int num_replicas, const ShardedAdamOptions& options,
              int64_t count, nn::ParameterSet* part);
  absl::Status ClipPart(float* grads);
  // This replica's part of the values and gradients: in the parameters'
  // buffers, or in its own.
  float* part_values() const;
  float* part_grads() const;

  nn::ParameterSet* params_;
  ReplicaContext* ctx_ = nullptr;
  const int replica_id_, num_replicas_;
  const ShardedAdamOptions options_;
  const int64_t begin_, count_;
  nn::ParameterSet own_;                // the part's values and gradients, where they have buffers of their own
  nn::ParameterSet* part_set_ = nullptr;  // own_, a ShardedParameters' part, or null (in the parameters' buffers)
  bool gather_values_ = true;
  std::unique_ptr<nn::Adam> part_;      // Adam over the part
  nn::DeviceBuffer whole_m_, whole_v_;  // State()'s, while a checkpoint needs them
  nn::DeviceBuffer norm_;               // the gradient's squared norm, then the clip's factor; its limit
};

}  // namespace troupe::replicator

#endif  // TROUPE_ENGINE_REPLICATOR_SHARDED_ADAM_H_
