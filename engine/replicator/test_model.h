// A small conv + cross-replica batch norm + linear regression model shared by
// the in-process and MPI replicator tests: trains `steps` Adam steps on this
// replica's shard of a fixed global batch and leaves the parameters in
// `params`.
#ifndef TROUPE_ENGINE_REPLICATOR_TEST_MODEL_H_
#define TROUPE_ENGINE_REPLICATOR_TEST_MODEL_H_

#include <algorithm>
#include <chrono>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "common/status_macros.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/layers.h"
#include "engine/nn/optimizer.h"
#include "engine/replicator/in_process.h"
#include "engine/replicator/replicator.h"

namespace troupe::replicator::testing {

inline constexpr int kGlobalBatch = 8;

// K in-process replicas, each collective waiting at most `timeout`;
// `on_device`: the replicas share one device and reduce on it
// (InProcessGroup members made on_device, as collectives SHARED_DEVICE).
inline std::unique_ptr<Replicator> MakeInProcess(int k,
                                                 std::chrono::milliseconds timeout = std::chrono::milliseconds(30000),
                                                 bool on_device = false) {
  ReplicatorOptions o;
  o.num_replicas = k;
  o.timeout = timeout;
  if (on_device) {
    o.make_collectives = [](int replicas, std::chrono::milliseconds t) -> absl::StatusOr<LocalCollectives> {
      auto group = std::make_shared<InProcessGroup>(replicas, t);
      LocalCollectives local;
      for (int id = 0; id < replicas; ++id) local.members.push_back(group->Member(id, /*on_device=*/true));
      local.shared = std::move(group);
      return local;
    };
  }
  auto r = Replicator::Create(o);
  TROUPE_CHECK(r.ok());
  return std::move(r).value();
}

// Adam after clipping by global norm, on one replica (nothing to reduce):
// the unsplit reference of a clipped ShardedAdam.
class ClippedAdam final : public nn::ForwardingOptimizer {
 public:
  ClippedAdam(nn::Optimizer* inner, float max_norm) : ForwardingOptimizer(inner), max_norm_(max_norm) {}
  void Apply() override {
    if (max_norm_ > 0) nn::ClipGradientsByGlobalNorm(parameters(), parameters().backend(), max_norm_);
    inner()->Apply();
  }

 private:
  float max_norm_;
};


struct GlobalBatch {
  std::vector<float> images;   // [8, 2, 6, 6]
  std::vector<float> targets;  // [8, 3]
};

inline GlobalBatch MakeGlobalBatch(int step) {
  std::mt19937_64 rng(1000 + step);
  std::normal_distribution<float> d(0.0f, 1.0f);
  GlobalBatch b;
  b.images.resize(kGlobalBatch * 2 * 6 * 6);
  b.targets.resize(kGlobalBatch * 3);
  for (float& v : b.images) v = d(rng);
  for (float& v : b.targets) v = d(rng);
  return b;
}

// A small conv + batch norm + linear model, its parameters on `backend`.
struct TestModel {
  std::shared_ptr<nn::Backend> backend;  // before the parameters that live in it
  nn::ParameterSet params;
  int conv_w = -1, conv_b = -1;
  int bn_gamma = -1, bn_beta = -1;
  nn::LinearLayer head;
  nn::DeviceBuffer running_mean, running_var;  // batch norm's, on the device

  // `pad_multiple`: the parameters' padding (ShardedAdam::PadMultiple(K)).
  explicit TestModel(std::shared_ptr<nn::Backend> device = std::make_shared<nn::CpuBackend>(/*num_threads=*/1),
                     int64_t pad_multiple = 1)
      : backend(std::move(device)) {
    // The conv's bias only feeds the no-batch-norm variant: before batch norm
    // its gradient is zero up to rounding, which Adam would amplify.
    conv_w = params.Add("conv.w", {4, 2, 3, 3}, nn::Init::FanIn(18));
    conv_b = params.Add("conv.b", {4}, nn::Init::FanIn(18));
    bn_gamma = params.Add("bn.gamma", {4}, nn::Init::Constant(1.0f));
    bn_beta = params.Add("bn.beta", {4}, nn::Init::Zeros());
    head = nn::LinearLayer::Create(params, "head", 4 * 36, 3);
    params.Allocate(*backend, /*seed=*/17, pad_multiple);
    running_mean = nn::DeviceBuffer(*backend, 4);
    running_var = nn::DeviceBuffer(*backend, 4);
    backend->Fill(running_mean.data(), 4, 0.0f);
    backend->Fill(running_var.data(), 4, 1.0f);
  }
};

// Trains `model` for `steps` steps (global batches first_step, ...) on
// replica ctx.replica_id()'s shard; each step one nn::Backend step (on the
// strict device: no host round trip but the collectives' staging). With
// `given`, that optimizer steps as it is (it reduces across replicas itself,
// as ShardedAdam does, or K is 1); otherwise Adam after gradients reduced in
// buckets of `bucket_floats` during backward. `given_reduction`: the given
// optimizer's reduction, reset before each step and told of backward.
inline absl::Status TrainShard(ReplicaContext& ctx, TestModel& model, int steps, int64_t bucket_floats,
                               bool batch_norm = true, nn::Optimizer* given = nullptr, int first_step = 0,
                               GradientReduction* given_reduction = nullptr) {
  nn::Tape tape(model.backend.get());
  std::optional<nn::Adam> adam;
  std::optional<GradientReducer> reducer;
  std::optional<ReplicatedOptimizer> replicated;
  if (given == nullptr) {
    adam.emplace(&model.params, model.backend.get());
    reducer.emplace(&ctx, &model.params, bucket_floats);
    replicated.emplace(&*adam, &ctx, &*reducer);
  }
  nn::Optimizer& optimizer = given != nullptr ? *given : *replicated;
  GradientReduction* const listener = reducer ? &*reducer : given_reduction;
  const int k = ctx.num_replicas(), shard = kGlobalBatch / k, r = ctx.replica_id();
  for (int step = first_step; step < first_step + steps; ++step) {
    const GlobalBatch batch = MakeGlobalBatch(step);
    nn::StepScope device_step(*model.backend);
    tape.Reset();
    model.params.ZeroGrad();
    if (listener != nullptr) listener->Reset();
    nn::Var x = tape.Input(batch.images.data() + r * shard * 72, {shard, 2, 6, 6});
    nn::Var y = tape.Input(batch.targets.data() + r * shard * 3, {shard, 3});
    nn::Var h = nn::Conv2d(x, tape.Parameter(model.params, model.conv_w),
                           batch_norm ? nn::Var{} : tape.Parameter(model.params, model.conv_b), /*stride=*/1, /*pad=*/1);
    if (batch_norm) h = nn::BatchNorm(h, tape.Parameter(model.params, model.bn_gamma), tape.Parameter(model.params, model.bn_beta),
                      nn::BatchNormState{model.running_mean.data(), model.running_var.data(), 0.1f},
                      /*training=*/true, 1e-5f, /*cross_replica=*/&ctx);
    h = nn::Relu(h);
    nn::Var loss = nn::MeanSquaredError(model.head(tape, model.params, nn::Flatten(h)), y);
    tape.Backward(loss, listener);
    optimizer.Step(/*learning_rate=*/1e-2f);
    if (!ctx.status().ok()) return ctx.status();
  }
  return absl::OkStatus();
}

// A replica's compute, paced without taking the cores: `per_node` of sleep
// after each backward node, then the reduction asked (whether to stop: DeadlineReducer).
class Paced final : public GradientReduction {
 public:
  Paced(GradientReduction* inner, std::chrono::microseconds per_node) : inner_(inner), per_node_(per_node) {}
  void Reset() override { inner_->Reset(); }
  void OnGradientReady(const nn::ParameterSet& set, int index) override { inner_->OnGradientReady(set, index); }
  bool StopBackward() override {
    std::this_thread::sleep_for(per_node_);
    return inner_->StopBackward();
  }
  absl::Status Finish() override { return inner_->Finish(); }

 private:
  GradientReduction* inner_;
  std::chrono::microseconds per_node_;
};

// --- A tensor-parallel MLP on a data x model mesh ---------------------------
// relu(x w1 + b1) w2 + b2 with w1 split by columns (nn::ColumnParallelLinear)
// and w2 by rows (nn::RowParallelLinear) over ctx.model_axis(), the batch
// split over ctx.data_axis() and the gradients averaged over it, Adam. On one
// replica (no mesh) it is the unsplit MLP trained on the whole batch: the
// reference a mesh must equal.
inline constexpr int64_t kMlpBatch = 8, kMlpIn = 6, kMlpHidden = 16, kMlpOut = 3;

// The MLP's weights: the whole ones, or the slices of one model part.
struct MlpWeights {
  std::vector<float> w1, b1, w2, b2;  // w1 [in, hidden/M], b1 [hidden/M], w2 [hidden/M, out], b2 [out]
};

// n floats drawn from N(0, 0.5) with `seed`.
inline std::vector<float> RandomFloats(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.5f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Columns [begin, end) of a row-major [rows, cols] matrix, and rows [begin, end).
inline std::vector<float> Columns(const std::vector<float>& m, int64_t cols, int64_t begin, int64_t end) {
  std::vector<float> out;
  for (size_t r = 0; r < m.size() / cols; ++r) out.insert(out.end(), m.begin() + r * cols + begin, m.begin() + r * cols + end);
  return out;
}
inline std::vector<float> Rows(const std::vector<float>& m, int64_t cols, int64_t begin, int64_t end) {
  return {m.begin() + begin * cols, m.begin() + end * cols};
}

// ||got - want|| / ||want|| (L2 over the tensor); infinite when their sizes differ.
inline double RelativeL2(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

// Sets parameters of `params` (allocated) to the given values.
inline absl::Status SetValues(nn::ParameterSet& params,
                              std::initializer_list<std::pair<int, const std::vector<float>*>> values) {
  std::vector<float> host(params.total_floats());
  for (const auto& [index, from] : values) std::copy(from->begin(), from->end(), host.begin() + params.info(index).offset);
  return params.UploadValues(host);
}

// Part `part` of `parts` of the whole MLP's weights: w1's and b1's columns,
// w2's rows, b2 whole.
inline MlpWeights MlpPart(const MlpWeights& whole, int part, int parts) {
  const int64_t h = kMlpHidden / parts, begin = part * h;
  return {Columns(whole.w1, kMlpHidden, begin, begin + h), Columns(whole.b1, kMlpHidden, begin, begin + h),
          Rows(whole.w2, kMlpOut, begin, begin + h), whole.b2};
}

// Trains the MLP from the same starting weights on every mesh for `steps`
// Adam steps (learning rate 1e-2); returns this replica's part of the result.
inline absl::StatusOr<MlpWeights> TrainMeshMlp(ReplicaContext& ctx, int steps) {
  ReplicaContext& model = ctx.model_axis();
  ReplicaContext& data = ctx.data_axis();
  const int parts = model.num_replicas(), part = model.replica_id();
  const int64_t shard = kMlpBatch / data.num_replicas(), first = data.replica_id() * shard;
  nn::Backend& backend = *ctx.backend();
  nn::ParameterSet params;
  const auto l1 = nn::ColumnParallelLinear::Create(params, "l1", kMlpIn, kMlpHidden, parts);
  const auto l2 = nn::RowParallelLinear::Create(params, "l2", kMlpHidden, kMlpOut, parts, part);
  params.Allocate(backend, 0);
  const MlpWeights start = MlpPart({RandomFloats(kMlpIn * kMlpHidden, 3), RandomFloats(kMlpHidden, 4),
                                    RandomFloats(kMlpHidden * kMlpOut, 5), RandomFloats(kMlpOut, 6)},
                                   part, parts);
  RETURN_IF_ERROR(SetValues(params, {{l1.w, &start.w1}, {l1.b, &start.b1}, {l2.w, &start.w2}, {l2.b, &start.b2}}));
  nn::Adam adam(&params, &backend);
  ReplicatedOptimizer optimizer(&adam, &data);  // the gradients' mean over the model's copies
  nn::Tape tape(&backend);
  for (int step = 0; step < steps; ++step) {
    const std::vector<float> x = RandomFloats(kMlpBatch * kMlpIn, 100 + step);
    const std::vector<float> y = RandomFloats(kMlpBatch * kMlpOut, 200 + step);
    tape.Reset();
    params.ZeroGrad();
    const nn::Var input = tape.Input(x.data() + first * kMlpIn, {shard, kMlpIn});
    const nn::Var hidden = nn::Relu(l1(tape, params, input, &model));
    const nn::Var loss =
        nn::MeanSquaredError(l2(tape, params, hidden, &model), tape.Input(y.data() + first * kMlpOut, {shard, kMlpOut}));
    tape.Backward(loss);
    optimizer.Step(/*learning_rate=*/1e-2f);
    RETURN_IF_ERROR(ctx.status());
  }
  const std::vector<float> values = params.DownloadValues();
  auto read = [&](int index) {
    const auto begin = values.begin() + params.info(index).offset;
    return std::vector<float>(begin, begin + params.info(index).shape.size());
  };
  return MlpWeights{read(l1.w), read(l1.b), read(l2.w), read(l2.b)};
}

// The largest relative difference (L2 over a tensor) between `got`, a
// model's part `part` of `parts`, and that part of the whole `want`; b2 only
// for part 0 (the row-parallel layer's bias is part 0's).
inline double WorstMlpDifference(const MlpWeights& got, const MlpWeights& want_whole, int part, int parts) {
  const MlpWeights want = MlpPart(want_whole, part, parts);
  double worst = std::max({RelativeL2(got.w1, want.w1), RelativeL2(got.b1, want.b1), RelativeL2(got.w2, want.w2)});
  if (part == 0) worst = std::max(worst, RelativeL2(got.b2, want.b2));
  return worst;
}

}  // namespace troupe::replicator::testing

#endif  // TROUPE_ENGINE_REPLICATOR_TEST_MODEL_H_
