#include "engine/replicator/replicator.h"

#include <algorithm>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/nn/cpu_backend.h"
#include "engine/replicator/in_process.h"
#include "engine/replicator/mpi.h"

namespace troupe::replicator {

namespace {

// In-process replicas are threads, each with its networks.
constexpr int kMaxReplicas = 256;

}  // namespace

absl::Status ReplicatorOptions::Validate() const {
  if (backend == Backend::kInProcess && (num_replicas < 1 || num_replicas > kMaxReplicas)) {
    return absl::InvalidArgumentError(
        absl::StrCat("replicator num_replicas ", num_replicas, " not in [1, ", kMaxReplicas, "]"));
  }
  if (timeout.count() <= 0) return absl::InvalidArgumentError("replicator timeout must be > 0");
  if (model_parallel < 1) {
    return absl::InvalidArgumentError(absl::StrCat("replicator model_parallel ", model_parallel, " < 1"));
  }
  if (model_parallel > 1 && make_collectives) {
    return absl::UnimplementedError(absl::StrCat(
        "replicator model_parallel ", model_parallel,
        ": a mesh of replicas needs in-process or MPI collectives; the ones given here (NCCL, a shared device) "
        "have no groups along an axis yet"));
  }
  if (backend == Backend::kInProcess) RETURN_IF_ERROR(CheckMesh(num_replicas, model_parallel));
  return absl::OkStatus();
}

absl::Status CheckMesh(int num_replicas, int model_parallel) {
  if (num_replicas % model_parallel != 0) {
    return absl::InvalidArgumentError(absl::StrCat("replicator: ", num_replicas,
                                                   " replicas do not split into models of model_parallel ",
                                                   model_parallel, " parts each (", num_replicas, " % ",
                                                   model_parallel, " != 0)"));
  }
  return absl::OkStatus();
}

// --- ReplicaContext -------------------------------------------------------------

ReplicaContext::~ReplicaContext() = default;

absl::Status ReplicaContext::Record(absl::Status s) {
  if (!s.ok() && status_.ok()) status_ = s;
  if (!s.ok() && parent_ != nullptr) parent_->Record(s).IgnoreError();
  return s;
}

ReplicaContext& ReplicaContext::model_axis() {
  if (model_axis_ == nullptr) {
    // A group of one: every collective is the identity, so it never waits.
    auto group = std::make_shared<InProcessGroup>(1, std::chrono::milliseconds(1));
    solo_collectives_ = group->Member(0);
    solo_group_ = std::move(group);
    solo_context_ = std::make_unique<ReplicaContext>(solo_collectives_.get(), backend_, local_index_);
    solo_context_->parent_ = this;
    model_axis_ = solo_context_.get();
  }
  return *model_axis_;
}

absl::Status ReplicaContext::AllReduce(std::span<float> data, ReduceOp op) {
  return Record(collectives_->AllReduce(data, op));
}
absl::Status ReplicaContext::AllGather(std::span<const float> in, std::span<float> out) {
  return Record(collectives_->AllGather(in, out));
}
absl::Status ReplicaContext::ReduceScatter(std::span<const float> in, std::span<float> out, ReduceOp op) {
  return Record(collectives_->ReduceScatter(in, out, op));
}
absl::Status ReplicaContext::Broadcast(std::span<float> data, int root) {
  return Record(collectives_->Broadcast(data, root));
}
absl::Status ReplicaContext::StartAllReduce(std::span<float> data, ReduceOp op) {
  if (!status_.ok()) return status_;
  return Record(collectives_->StartAllReduce(data, op));
}
absl::Status ReplicaContext::WaitAll() {
  if (!status_.ok()) return status_;
  return Record(collectives_->WaitAll());
}
// nn::CrossReplicaSum's hook returns nothing: an error stays in status().
void ReplicaContext::SumOnDevice(nn::Backend& backend, float* values, int64_t count) {
  AllReduceDevice(backend, values, count, ReduceOp::kSum).IgnoreError();
}

bool ReplicaContext::ReducesInPlace(const nn::Backend& backend) const {
  return backend.host_addressable() || collectives_->takes_device_memory();
}

absl::Status ReplicaContext::AllReduceDevice(nn::Backend& backend, float* data, int64_t count, ReduceOp op) {
  if (num_replicas() == 1) return status_;  // a sum or mean over one replica is the data
  if (!status_.ok()) return status_;
  // Replicas that run the step as one program reduce inside it.
  if (backend.reduces_in_step()) {
    backend.AllReduceInStep(data, count, op == ReduceOp::kMean, in_step_groups_);
    return status_;
  }
  if (ReducesOnDevice()) return Record(collectives_->AllReduceOnDevice(backend, data, count, op));
  return OnDevice(backend, data, count,
                  [&](std::span<float> floats) { return AllReduce(floats, op); });
}

absl::Status ReplicaContext::ReduceScatterDevice(nn::Backend& backend, const float* in, float* out, int64_t part,
                                                 ReduceOp op) {
  return Between(
      backend, in, num_replicas() * part, out, part, "a reduce-scatter",
      [&] { backend.ReduceScatterInStep(in, out, part, op == ReduceOp::kMean); },
      [&](std::span<const float> from, std::span<float> to) { return ReduceScatter(from, to, op); });
}

absl::Status ReplicaContext::AllGatherDevice(nn::Backend& backend, const float* in, float* out, int64_t part) {
  return Between(
      backend, in, part, out, num_replicas() * part, "an all-gather", [&] { backend.AllGatherInStep(in, out, part); },
      [&](std::span<const float> from, std::span<float> to) { return AllGather(from, to); });
}

absl::Status ReplicaContext::Between(nn::Backend& backend, const float* in, int64_t in_count, float* out,
                                     int64_t out_count, const char* what, absl::FunctionRef<void()> in_step,
                                     absl::FunctionRef<absl::Status(std::span<const float>, std::span<float>)> run) {
  if (!status_.ok()) return status_;
  if (num_replicas() == 1) {
    if (in != out) backend.Copy(in, out, out_count);
    return status_;
  }
  if (backend.reduces_in_step()) {
    if (in_step_groups_ != nullptr) {
      return Record(absl::UnimplementedError(absl::StrCat(what, " along one axis of a mesh inside a compiled step")));
    }
    in_step();
    return status_;
  }
  if (ReducesInPlace(backend)) {
    backend.Synchronize();  // the kernels that wrote `in` have run
    return run({in, static_cast<size_t>(in_count)}, {out, static_cast<size_t>(out_count)});
  }
  // Through the host: `in`, then the result after it.
  if (static_cast<int64_t>(staging_.size()) < in_count + out_count) staging_.resize(in_count + out_count);
  const nn::Backend::HostStaging staging(backend);
  backend.Download(in, staging_.data(), sizeof(float) * in_count);
  RETURN_IF_ERROR(run({staging_.data(), static_cast<size_t>(in_count)},
                      {staging_.data() + in_count, static_cast<size_t>(out_count)}));
  backend.Upload(staging_.data() + in_count, out, sizeof(float) * out_count);
  return absl::OkStatus();
}

absl::Status ReplicaContext::OnDevice(nn::Backend& backend, float* data, int64_t count,
                                      const std::function<absl::Status(std::span<float>)>& run) {
  if (ReducesInPlace(backend)) {
    backend.Synchronize();  // the kernels that wrote `data` have run (NCCL reads it on its own stream)
    return run({data, static_cast<size_t>(count)});
  }
  if (static_cast<int64_t>(staging_.size()) < count) staging_.resize(count);
  const std::span<float> host(staging_.data(), static_cast<size_t>(count));
  const nn::Backend::HostStaging staging(backend);
  backend.Download(data, host.data(), sizeof(float) * count);
  RETURN_IF_ERROR(run(host));
  backend.Upload(host.data(), data, sizeof(float) * count);
  return absl::OkStatus();
}

// --- GradientReducer --------------------------------------------------------------

GradientReducer::GradientReducer(ReplicaContext* ctx, nn::ParameterSet* params, int64_t bucket_floats)
    : ctx_(ctx), params_(params), bucket_of_(params->size()), ready_(params->size()) {
  // Buckets from the last parameter backwards (backward finishes those first).
  const int n = params->size();
  int last = n - 1;
  while (last >= 0) {
    int first = last;
    int64_t floats = params->info(first).shape.size();
    while (first > 0 && floats < bucket_floats) {
      --first;
      floats += params->info(first).shape.size();
    }
    Bucket b;
    b.first_param = first;
    b.last_param = last;
    b.begin = params->info(first).offset;
    b.end = last + 1 < n ? params->info(last + 1).offset : params->total_floats();
    for (int p = first; p <= last; ++p) bucket_of_[p] = static_cast<int>(buckets_.size());
    buckets_.push_back(b);
    last = first - 1;
  }
  Reset();
}

void GradientReducer::Reset() {
  if (ctx_->num_replicas() == 1) return;
  for (Bucket& b : buckets_) {
    b.remaining = b.last_param - b.first_param + 1;
    b.started = false;
  }
  std::fill(ready_.begin(), ready_.end(), 0);
}

void GradientReducer::Start(Bucket& b) {
  b.started = true;
  float* device = params_->device_grads() + b.begin;
  const size_t count = static_cast<size_t>(b.end - b.begin);
  if (ctx_->ReducesOnDevice() || params_->backend().reduces_in_step()) {
    // On the shared device, at once (its kernels queue behind backward's);
    // or inside the step's one program for all replicas.
    ctx_->AllReduceDevice(params_->backend(), device, static_cast<int64_t>(count), ReduceOp::kMean).IgnoreError();
    return;
  }
  std::span<float> data(device, count);
  if (ctx_->ReducesInPlace(params_->backend())) {
    // Collectives that read the device buffer in place (NCCL, on its own
    // stream) start after backward's kernels so far have run.
    params_->backend().Synchronize();
  } else {
    if (host_grads_.empty()) host_grads_.resize(params_->total_floats());
    data = std::span<float>(host_grads_.data() + b.begin, count);
    const nn::Backend::HostStaging staging(params_->backend());
    params_->backend().Download(device, data.data(), sizeof(float) * count);
  }
  // An error is kept by the context; Finish() reports it.
  ctx_->StartAllReduce(data, ReduceOp::kMean).IgnoreError();
}

void GradientReducer::OnGradientReady(const nn::ParameterSet& set, int param_index) {
  if (ctx_->num_replicas() == 1 || &set != params_ || ready_[param_index]) return;
  ready_[param_index] = 1;
  Bucket& b = buckets_[bucket_of_[param_index]];
  if (--b.remaining == 0) Start(b);
}

absl::Status GradientReducer::Finish() {
  if (ctx_->num_replicas() == 1) return ctx_->status();
  for (Bucket& b : buckets_) {
    if (!b.started) Start(b);
  }
  RETURN_IF_ERROR(ctx_->WaitAll());
  // The buckets cover the whole buffer: one upload of the staged copy.
  if (!host_grads_.empty()) {
    const nn::Backend::HostStaging staging(params_->backend());
    params_->backend().Upload(host_grads_.data(), params_->device_grads(), sizeof(float) * host_grads_.size());
  }
  return absl::OkStatus();
}

// --- ReplicatedOptimizer ------------------------------------------------------------

void ReplicatedOptimizer::Apply() {
  if (!ctx_->status().ok()) return;
  absl::Status s;
  if (reducer_ != nullptr) {
    s = reducer_->Finish();
  } else {
    nn::ParameterSet& params = parameters();
    s = ctx_->AllReduceDevice(params.backend(), params.device_grads(), params.total_floats(), ReduceOp::kMean);
  }
  if (!s.ok()) return;  // kept in ctx_->status()
  inner()->Apply();
}

// --- Replicator -------------------------------------------------------------------------

Replicator::~Replicator() = default;

absl::StatusOr<std::unique_ptr<Replicator>> Replicator::Create(const ReplicatorOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<Replicator> r(new Replicator());
  if (options.make_collectives) {
    ASSIGN_OR_RETURN(r->collectives_, options.make_collectives(options.num_replicas, options.timeout));
  } else if (options.backend == ReplicatorOptions::Backend::kInProcess) {
    auto group = std::make_shared<InProcessGroup>(options.num_replicas, options.timeout);
    for (int id = 0; id < options.num_replicas; ++id) r->collectives_.members.push_back(group->Member(id));
    r->collectives_.shared = std::move(group);
  } else {
    ASSIGN_OR_RETURN(std::unique_ptr<MpiCollectives> mpi, MpiCollectives::Create(options.timeout));
    r->collectives_.members.push_back(std::move(mpi));
  }
  TROUPE_CHECK(!r->collectives_.members.empty());
  r->num_replicas_ = r->collectives_.members[0]->num_replicas();
  r->model_parallel_ = options.model_parallel;
  if (options.model_parallel > 1) RETURN_IF_ERROR(r->MakeAxes(options));
  const int local = static_cast<int>(r->collectives_.members.size());
  for (int k = 0; k < local; ++k) {
    const int id = r->collectives_.members[k]->replica_id();
    r->local_ids_.push_back(id);
    if (options.make_backend) {
      ASSIGN_OR_RETURN(std::unique_ptr<nn::Backend> backend, options.make_backend(*r->collectives_.members[k], local));
      r->backends_.push_back(std::move(backend));
    } else {
      r->backends_.push_back(std::make_shared<nn::CpuBackend>(/*num_threads=*/1));
    }
  }
  return r;
}

// Replica r of the (K/M) x M mesh: data index r / M, model index r % M.
absl::Status Replicator::MakeAxes(const ReplicatorOptions& options) {
  const int k = num_replicas_, m = model_parallel_;
  RETURN_IF_ERROR(CheckMesh(k, m));
  model_groups_.assign(k / m, {});
  data_groups_.assign(m, {});
  for (int r = 0; r < k; ++r) {
    model_groups_[r / m].push_back(r);
    data_groups_[r % m].push_back(r);
  }
  if (options.backend == ReplicatorOptions::Backend::kMpi) {
    for (const std::unique_ptr<Collectives>& member : collectives_.members) {
      const int r = member->replica_id();
      AxisCollectives axes;
      ASSIGN_OR_RETURN(axes.model, MpiCollectives::CreateSplit(/*color=*/r / m, /*key=*/r % m, options.timeout));
      ASSIGN_OR_RETURN(axes.data, MpiCollectives::CreateSplit(/*color=*/r % m, /*key=*/r / m, options.timeout));
      axes_.push_back(std::move(axes));
    }
    return absl::OkStatus();
  }
  // In-process: every replica is here. One group per data index (a model's
  // parts) and one per model index (a part's copies).
  std::vector<std::shared_ptr<InProcessGroup>> models, datas;
  for (int d = 0; d < k / m; ++d) models.push_back(std::make_shared<InProcessGroup>(m, options.timeout));
  for (int p = 0; p < m; ++p) datas.push_back(std::make_shared<InProcessGroup>(k / m, options.timeout));
  for (int r = 0; r < k; ++r) {
    AxisCollectives axes;
    axes.model = models[r / m]->Member(r % m);
    axes.data = datas[r % m]->Member(r / m);
    axes_.push_back(std::move(axes));
  }
  axis_groups_.assign(models.begin(), models.end());
  axis_groups_.insert(axis_groups_.end(), datas.begin(), datas.end());
  return absl::OkStatus();
}

absl::Status Replicator::RunReplicas(const std::function<absl::Status(ReplicaContext&)>& replica_fn) {
  const std::vector<std::unique_ptr<Collectives>>& members = collectives_.members;
  const size_t n = members.size();
  std::vector<absl::Status> results(n);
  auto run_one = [&](size_t k) {
    const int local_index = static_cast<int>(k);
    ReplicaContext ctx(members[k].get(), backends_[k], local_index);
    std::optional<ReplicaContext> model, data;
    if (!axes_.empty()) {
      model.emplace(axes_[k].model.get(), backends_[k], local_index);
      data.emplace(axes_[k].data.get(), backends_[k], local_index);
      model->parent_ = data->parent_ = &ctx;
      model->in_step_groups_ = &model_groups_;
      data->in_step_groups_ = &data_groups_;
      ctx.model_axis_ = &*model;
      ctx.data_axis_ = &*data;
    }
    absl::Status s = replica_fn(ctx);
    if (s.ok()) s = ctx.status();
    // Release the others from collectives they would wait in for this one.
    if (!s.ok()) {
      members[k]->Fail(s);
      if (!axes_.empty()) {
        axes_[k].model->Fail(s);
        axes_[k].data->Fail(s);
      }
    }
    results[k] = s;
  };
  if (n == 1) {
    run_one(0);
  } else {
    std::vector<std::jthread> threads;
    for (size_t k = 0; k < n; ++k) threads.emplace_back(run_one, k);
  }  // joined here
  // Prefer the root cause (a replica's own error) over the Aborted echoes.
  const absl::Status* first = nullptr;
  for (size_t k = 0; k < n; ++k) {
    if (results[k].ok()) continue;
    if (first == nullptr || (first->code() == absl::StatusCode::kAborted &&
                             results[k].code() != absl::StatusCode::kAborted)) {
      first = &results[k];
      if (first->code() != absl::StatusCode::kAborted) {
        return absl::Status(first->code(), absl::StrCat("replica ", local_ids_[k], ": ", first->message()));
      }
    }
  }
  if (first != nullptr) return *first;
  return absl::OkStatus();
}

}  // namespace troupe::replicator
