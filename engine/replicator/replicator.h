// The Replicator (after TF-Replicator): a researcher writes the
// single-replica program, an `input_fn` that yields a batch and a `step_fn`
// that does one update, and Run() executes it on K replicas. Inside step_fn a
// ReplicaContext offers replica_id(), local_index(), num_replicas() and the
// cross-replica collectives; ReplicatedOptimizer averages gradients across
// replicas so a single-replica step becomes a K-replica one without changing
// its code.
//
// Collectives (chosen by ReplicatorOptions::backend): kInProcess runs the K
// replicas as K threads of this process; kMpi runs one replica in this process
// as rank r of `mpirun -np K`; a process may pass its own factory instead
// (engine::MakeReplicator passes NCCL's), so this layer knows no device code.
// Each local replica also gets its compute backend from the Replicator
// (ReplicatorOptions::make_backend: replica r on device r), which
// ReplicaContext::backend() hands to its code.
//
// A mesh (ReplicatorOptions::model_parallel = M): the K replicas form a
// (K/M data) x (M model) grid, replica r at data index r / M and model index
// r % M (a model's parts on neighbouring replicas, as Megatron-LM places
// them on one node's GPUs). ctx.model_axis() reduces over the M replicas
// that share a data index (the parts of one model: tensor-parallel layers'
// sums), ctx.data_axis() over the K/M that share a model index (the same
// part of every model copy: data-parallel gradient means). Without a mesh
// data_axis() is the whole group and model_axis() a group of one.
//
// Threads: Run() starts one std::jthread per local replica and joins them
// before returning. Each replica's state (its ParameterSet, tape, optimizer)
// must be its own: index it by ctx.local_index(), its place among this
// process's replicas (not ctx.replica_id(), which under MPI is the rank).
#ifndef TROUPE_ENGINE_REPLICATOR_REPLICATOR_H_
#define TROUPE_ENGINE_REPLICATOR_REPLICATOR_H_

#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/nn/backend.h"
#include "engine/nn/ops.h"
#include "engine/nn/optimizer.h"
#include "engine/nn/tape.h"
#include "engine/replicator/interface.h"

namespace troupe::replicator {

// The collectives of this process's replicas, one per local replica in
// ascending id order, and whatever they share (an in-process group), kept
// alive as long as they are.
struct LocalCollectives {
  std::vector<std::unique_ptr<Collectives>> members;
  std::shared_ptr<void> shared;
};

// A local replica's collectives along each axis of a mesh: over the replicas
// with its data index (model) and with its model index (data).
struct AxisCollectives {
  std::unique_ptr<Collectives> model, data;
};

struct ReplicatorOptions {
  enum class Backend { kInProcess, kMpi };
  Backend backend = Backend::kInProcess;
  int num_replicas = 1;  // kInProcess only; MPI takes it from mpirun
  // M, the replicas that hold the parts of one model (tensor parallelism):
  // the replicas form a (K/M) x M mesh (see the top of this file). K must be
  // a multiple of M. In-process and MPI collectives only.
  int model_parallel = 1;
  std::chrono::milliseconds timeout{60000};  // per collective
  // When set, makes the collectives instead of `backend` (NCCL, from a layer
  // above this one): given num_replicas and the timeout.
  std::function<absl::StatusOr<LocalCollectives>(int num_replicas, std::chrono::milliseconds timeout)>
      make_collectives;
  // The compute backend of the local replica whose collectives are
  // `collectives` (its device: collectives.local_rank()), with
  // `local_replicas` local replicas in all. Null: a one-thread CPU backend each.
  std::function<absl::StatusOr<std::unique_ptr<nn::Backend>>(const Collectives& collectives, int local_replicas)>
      make_backend;
  absl::Status Validate() const;
};

// InvalidArgument, naming both, unless num_replicas is a multiple of model_parallel.
absl::Status CheckMesh(int num_replicas, int model_parallel);


// What a replica's code sees. Collective errors are also remembered: the
// first one is status(), and later collectives fail at once.
class ReplicaContext final : public nn::CrossReplicaSum {
 public:
  // `backend`: this replica's compute backend (may be null in tests of
  // collectives alone); `local_index`: see local_index().
  explicit ReplicaContext(Collectives* collectives, std::shared_ptr<nn::Backend> backend = nullptr,
                          int local_index = 0)
      : collectives_(collectives), backend_(std::move(backend)), local_index_(local_index) {}
  ReplicaContext(const ReplicaContext&) = delete;
  ReplicaContext& operator=(const ReplicaContext&) = delete;
  ~ReplicaContext() override;
  // This replica's id in the whole group (0..num_replicas() - 1; the rank under MPI).
  int replica_id() const { return collectives_->replica_id(); }
  int num_replicas() const { return collectives_->num_replicas(); }
  // This replica's place among the replicas this process runs: what indexes
  // per-process state (Replicator::local_replicas(), Replicator::backend(),
  // a caller's vector of local models). Equals replica_id() only when one
  // process runs them all; under MPI (one replica per process) it is 0 on
  // every rank. Not the device either: that is Collectives::local_rank().
  int local_index() const { return local_index_; }
  // This replica's compute backend (its device), shared with whoever keeps it.
  const std::shared_ptr<nn::Backend>& backend() const { return backend_; }

  // The mesh's axes (see the top of this file): contexts over the replicas
  // this one shares a data index with (model_axis) or a model index with
  // (data_axis), whose replica_id() and num_replicas() are along that axis
  // (model_axis().replica_id() is this replica's model index). Their errors
  // are also this context's status(). Without a mesh data_axis() is this
  // context and model_axis() a group of one.
  ReplicaContext& model_axis();
  ReplicaContext& data_axis() { return *data_axis_; }

  // Collectives on host memory.
  absl::Status AllReduce(std::span<float> data, ReduceOp op);
  absl::Status AllGather(std::span<const float> in, std::span<float> out);
  absl::Status ReduceScatter(std::span<const float> in, std::span<float> out, ReduceOp op);
  absl::Status Broadcast(std::span<float> data, int root);
  // A background all-reduce (see Collectives::StartAllReduce) and its wait.
  absl::Status StartAllReduce(std::span<float> data, ReduceOp op);
  absl::Status WaitAll();
  // nn::CrossReplicaSum (cross-replica batch norm), an AllReduceDevice sum:
  // errors go to status().
  void SumOnDevice(nn::Backend& backend, float* values, int64_t count) override;

  // An all-reduce of `count` floats of `backend`'s memory: in place when the
  // collectives can take it (host-addressable memory, or collectives that
  // take device memory), otherwise downloaded, reduced on the host and
  // uploaded back (a step's one allowed host round trip: nn::Backend::
  // HostStaging). Nothing at all with one replica.
  absl::Status AllReduceDevice(nn::Backend& backend, float* data, int64_t count, ReduceOp op);
  // The same for K parts of `part` floats each, in `backend`'s memory: `in`
  // (K x part) -> `out` (part floats), the op over replicas of their part
  // replica_id() (a reduce-scatter); `in` (part floats) -> `out` (K x part),
  // every replica's `in` in replica order (an all-gather). `out` may be
  // this replica's own part of `in` (reduce-scatter) and `in` its own part
  // of `out` (all-gather), except inside a step that runs as one program for
  // every replica (there no offset may depend on the replica). Inside such a
  // step a collective of the program; otherwise in place, or through a host
  // copy.
  absl::Status ReduceScatterDevice(nn::Backend& backend, const float* in, float* out, int64_t part, ReduceOp op);
  absl::Status AllGatherDevice(nn::Backend& backend, const float* in, float* out, int64_t part);
  // Whether `backend`'s buffers go to the collectives in place (no staging).
  bool ReducesInPlace(const nn::Backend& backend) const;
  // Whether device buffers are reduced on the device they share
  // (Collectives::reduces_on_device: K replicas on one GPU).
  bool ReducesOnDevice() const { return collectives_->reduces_on_device(); }

  // The first collective error on this replica (OK if none).
  const absl::Status& status() const { return status_; }
  Collectives& collectives() { return *collectives_; }

 private:
  friend class Replicator;
  absl::Status Record(absl::Status s);
  Collectives* collectives_;
  std::shared_ptr<nn::Backend> backend_;
  int local_index_;
  absl::Status status_;
  ReplicaContext* parent_ = nullptr;  // an axis's context: whose status() its errors also are
  // An axis's groups of replicas for collectives inside a step that runs as
  // one program for every replica (null: all of them).
  const nn::Backend::ReplicaGroups* in_step_groups_ = nullptr;
  ReplicaContext* model_axis_ = nullptr;  // null: a group of one, made on first use
  ReplicaContext* data_axis_ = this;
  std::shared_ptr<void> solo_group_;  // the in-process group of one behind solo_collectives_
  std::unique_ptr<Collectives> solo_collectives_;
  std::unique_ptr<ReplicaContext> solo_context_;
  // A collective on `count` floats of `backend`'s memory at `data`: `run`
  // given them in place where the collectives can take them, else a host
  // copy of them, downloaded before and uploaded after.
  absl::Status OnDevice(nn::Backend& backend, float* data, int64_t count,
                        const std::function<absl::Status(std::span<float>)>& run);
  // A collective from `in_count` floats at `in` to `out_count` floats at
  // `out`, both of `backend`'s memory (`what`, for errors): inside a step run
  // as one program, `in_step`; else `run` on them in place where the
  // collectives can take them, or on a host copy.
  absl::Status Between(nn::Backend& backend, const float* in, int64_t in_count, float* out, int64_t out_count,
                       const char* what, absl::FunctionRef<void()> in_step,
                       absl::FunctionRef<absl::Status(std::span<const float>, std::span<float>)> run);
  std::vector<float> staging_;  // the device collectives' host copy, grows only
};

// What ReplicatedOptimizer waits for: a listener to Tape::Backward that
// averages a ParameterSet's gradients across the replicas by the time
// Finish() returns (GradientReducer; DeadlineReducer in straggler.h).
class GradientReduction : public nn::GradientListener {
 public:
  // Call before each backward pass.
  virtual void Reset() = 0;
  // The gradients averaged (an error stays in the context too).
  virtual absl::Status Finish() = 0;
};

// Reduces (averages) a ParameterSet's gradients across replicas in buckets of
// consecutive parameters, starting each bucket as soon as backward has
// finished all its parameters (pass it to Tape::Backward as the listener), so
// late layers reduce while early ones are still differentiated. Gradients the
// collectives cannot take in place are downloaded bucket by bucket into a
// host copy and uploaded once all have reduced. With one replica it does
// nothing (there is nothing to average).
class GradientReducer final : public GradientReduction {
 public:
  // `bucket_floats`: a bucket closes once it holds at least this many floats.
  GradientReducer(ReplicaContext* ctx, nn::ParameterSet* params, int64_t bucket_floats = 1 << 20);
  void Reset() override;
  void OnGradientReady(const nn::ParameterSet& set, int param_index) override;
  // Starts any bucket not yet started (unused parameters) and waits for all.
  absl::Status Finish() override;
  int num_buckets() const { return static_cast<int>(buckets_.size()); }

 private:
  struct Bucket {
    int first_param, last_param;  // inclusive, in declaration order
    int64_t begin, end;           // float range in the gradient buffer
    int remaining = 0;
    bool started = false;
  };
  void Start(Bucket& b);
  ReplicaContext* ctx_;
  nn::ParameterSet* params_;
  std::vector<float> host_grads_;  // staging, when not reduced in place
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;
  std::vector<char> ready_;
};

// Wraps a replica's optimizer: Apply() (Step's device part) first averages the gradients across
// replicas (all at once, or waits for a GradientReducer that did it during
// backward), then applies the inner optimizer. A collective error is kept in
// the context and the update is skipped.
class ReplicatedOptimizer final : public nn::ForwardingOptimizer {
 public:
  ReplicatedOptimizer(nn::Optimizer* inner, ReplicaContext* ctx, GradientReduction* reducer = nullptr)
      : ForwardingOptimizer(inner), ctx_(ctx), reducer_(reducer) {}
  void Apply() override;

 private:
  ReplicaContext* ctx_;
  GradientReduction* reducer_;
};

class Replicator {
 public:
  static absl::StatusOr<std::unique_ptr<Replicator>> Create(const ReplicatorOptions& options);
  ~Replicator();

  // Replicas in the whole group, and the ids this process runs (ascending;
  // local_replicas()[ctx.local_index()] == ctx.replica_id()).
  int num_replicas() const { return num_replicas_; }
  // M of the (K/M) x M mesh: 1 without one.
  int model_parallel() const { return model_parallel_; }
  const std::vector<int>& local_replicas() const { return local_ids_; }
  // The compute backend of local replica `local_index` (its ReplicaContext's:
  // backend(ctx.local_index()) == ctx.backend()).
  const std::shared_ptr<nn::Backend>& backend(int local_index) const { return backends_[local_index]; }

  // Runs `replica_fn` once on every local replica, concurrently. Returns OK
  // if all did; otherwise the first error, prefixed with the replica that
  // failed ("replica 1: ..."). A replica that fails releases the others from
  // their collectives (they get Aborted naming it), so nothing hangs.
  absl::Status RunReplicas(const std::function<absl::Status(ReplicaContext&)>& replica_fn);

  // TF-Replicator's loop: for `num_steps` steps, each replica gets its shard
  // of the global batch from input_fn and runs step_fn on it.
  template <typename Batch>
  absl::Status Run(int64_t num_steps, const std::function<absl::StatusOr<Batch>(ReplicaContext&)>& input_fn,
                   const std::function<absl::Status(ReplicaContext&, Batch&)>& step_fn) {
    return RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
      for (int64_t step = 0; step < num_steps; ++step) {
        absl::StatusOr<Batch> batch = input_fn(ctx);
        if (!batch.ok()) return batch.status();
        if (absl::Status s = step_fn(ctx, *batch); !s.ok()) return s;
        if (!ctx.status().ok()) return ctx.status();
      }
      return absl::OkStatus();
    });
  }

 private:
  Replicator() = default;
  absl::Status MakeAxes(const ReplicatorOptions& options);
  int num_replicas_ = 1;
  int model_parallel_ = 1;
  std::vector<int> local_ids_;
  LocalCollectives collectives_;
  // Per local replica, its axes' collectives (model only, a group of one,
  // without a mesh), and the in-process groups behind them.
  std::vector<AxisCollectives> axes_;
  std::vector<std::shared_ptr<void>> axis_groups_;
  // The mesh's groups by global replica id, for collectives inside a step
  // that runs as one program: a model's parts, and a part's copies.
  nn::Backend::ReplicaGroups model_groups_, data_groups_;
  std::vector<std::shared_ptr<nn::Backend>> backends_;
};

}  // namespace troupe::replicator

#endif  // TROUPE_ENGINE_REPLICATOR_REPLICATOR_H_
