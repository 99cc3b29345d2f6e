// A small conv + cross-replica batch norm + linear regression model shared by
// the in-process and MPI replicator tests: trains `steps` Adam steps on this
// replica's shard of a fixed global batch and leaves the parameters in
// `params`.
#ifndef TROUPE_ENGINE_REPLICATOR_TEST_MODEL_H_
#define TROUPE_ENGINE_REPLICATOR_TEST_MODEL_H_

#include <chrono>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

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

}  // namespace troupe::replicator::testing

#endif  // TROUPE_ENGINE_REPLICATOR_TEST_MODEL_H_
