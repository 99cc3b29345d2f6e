#include "bench/straggler_round.h"

#include <chrono>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/layers.h"
#include "engine/nn/ops.h"
#include "engine/nn/optimizer.h"
#include "engine/replicator/straggler.h"

namespace troupe::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The slowed replica's pace: each piece of work is followed by as long a
// sleep (2x its time), measured from the last call.
class Pacer {
 public:
  explicit Pacer(bool slow) : slow_(slow) {}
  void Start() { last_ = Clock::now(); }
  void Lap() {
    if (!slow_) return;
    std::this_thread::sleep_for(Clock::now() - last_);
    last_ = Clock::now();
  }

 private:
  bool slow_;
  Clock::time_point last_;
};

// A reduction told of each backward node: the pacer laps, then the inner
// reduction decides whether to stop.
class PacedReduction final : public replicator::GradientReduction {
 public:
  PacedReduction(replicator::GradientReduction* inner, Pacer* pacer) : inner_(inner), pacer_(pacer) {}
  void Reset() override { inner_->Reset(); }
  void OnGradientReady(const nn::ParameterSet& set, int index) override { inner_->OnGradientReady(set, index); }
  bool StopBackward() override {
    pacer_->Lap();
    return inner_->StopBackward();
  }
  absl::Status Finish() override { return inner_->Finish(); }

 private:
  replicator::GradientReduction* inner_;
  Pacer* pacer_;
};

struct Mlp {
  nn::ParameterSet params;
  std::vector<nn::LinearLayer> layers;
};

}  // namespace

absl::StatusOr<double> StragglerRound(replicator::ReplicatorOptions::Backend collectives, double seconds, bool slowed,
                                      float deadline) {
  replicator::ReplicatorOptions o;
  o.backend = collectives;
  o.num_replicas = kStragglerReplicas;
  ASSIGN_OR_RETURN(std::unique_ptr<replicator::Replicator> replicator, replicator::Replicator::Create(o));
  if (replicator->num_replicas() != kStragglerReplicas) {
    return absl::FailedPreconditionError(absl::StrCat("the straggler round wants ", kStragglerReplicas,
                                                      " replicas, has ", replicator->num_replicas()));
  }
  std::vector<int64_t> steps(replicator->local_replicas().size(), 0);
  const auto begin = Clock::now();
  const auto until = begin + std::chrono::duration<double>(seconds);
  RETURN_IF_ERROR(replicator->RunReplicas([&](replicator::ReplicaContext& ctx) -> absl::Status {
    nn::Backend& backend = *ctx.backend();
    Mlp mlp;
    const int64_t sizes[] = {kStragglerIn, kStragglerHidden, kStragglerHidden, kStragglerOut};
    for (int l = 0; l < 3; ++l) {
      mlp.layers.push_back(nn::LinearLayer::Create(mlp.params, absl::StrFormat("l%d", l), sizes[l], sizes[l + 1]));
    }
    mlp.params.Allocate(backend, 5);
    std::mt19937_64 rng(ctx.replica_id());
    std::normal_distribution<float> normal;
    std::vector<float> x(kStragglerRows * kStragglerIn), y(kStragglerRows * kStragglerOut);
    for (float& v : x) v = normal(rng);
    for (float& v : y) v = normal(rng);
    nn::Tape tape(&backend);
    nn::Adam adam(&mlp.params, &backend);
    std::optional<replicator::GradientReducer> bucketed;
    std::optional<replicator::DeadlineReducer> timed;
    replicator::GradientReduction* reduction;
    if (deadline > 0) {
      reduction = &timed.emplace(&ctx, &mlp.params, replicator::DeadlineOptions{.factor = deadline});
    } else {
      reduction = &bucketed.emplace(&ctx, &mlp.params);
    }
    Pacer pacer(slowed && ctx.replica_id() == kStragglerSlowReplica);
    PacedReduction paced(reduction, &pacer);
    replicator::ReplicatedOptimizer optimizer(&adam, &ctx, &paced);
    // Every replica steps until the time is up on replica 0 (a flag in the
    // all-reduce: they stop at the same step).
    for (;;) {
      float stop = ctx.replica_id() == 0 && Clock::now() >= until ? 1.0f : 0.0f;
      RETURN_IF_ERROR(ctx.AllReduce({&stop, 1}, replicator::ReduceOp::kSum));
      if (stop > 0) break;
      pacer.Start();
      tape.Reset();
      mlp.params.ZeroGrad();
      paced.Reset();
      nn::Var h = tape.Input(x.data(), {kStragglerRows, kStragglerIn});
      for (size_t l = 0; l < mlp.layers.size(); ++l) {
        h = mlp.layers[l](tape, mlp.params, h);
        if (l + 1 < mlp.layers.size()) h = nn::Relu(h);
      }
      nn::Var loss = nn::MeanSquaredError(h, tape.Input(y.data(), {kStragglerRows, kStragglerOut}));
      backend.Synchronize();
      pacer.Lap();  // the forward pass
      tape.Backward(loss, &paced);
      optimizer.Step(1e-3f);
      RETURN_IF_ERROR(ctx.status());
      ++steps[ctx.local_index()];
    }
    return absl::OkStatus();
  }));
  return steps[0] / std::chrono::duration<double>(Clock::now() - begin).count();
}


}  // namespace troupe::bench
