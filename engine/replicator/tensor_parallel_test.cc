// Tensor-parallel dense layers (nn::ColumnParallelLinear, then
// nn::RowParallelLinear) split over K = 2 and 4 in-process replicas, the
// group's sums through ReplicaContext: the loss, every weight's gradient (the
// replica's slice of the unsplit layer's) and the input's gradient equal the
// unsplit MLP's.
#include <algorithm>
#include <array>
#include <cstdio>
#include <cmath>
#include <functional>
#include <initializer_list>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/layers.h"
#include "engine/nn/ops.h"
#include "engine/replicator/replicator.h"
#include "engine/replicator/test_model.h"
#include "gtest/gtest.h"

namespace troupe::replicator {
namespace {

constexpr int64_t kBatch = 6, kIn = 8, kHidden = 16, kOut = 4;

struct Gradients {
  float loss = 0;
  std::vector<float> w1, b1, w2, b2, dx;  // w1 [in, hidden], w2 [hidden, out], dx [batch, in]
};

using testing::Columns;
using testing::RandomFloats;
using testing::RelativeL2;
using testing::Rows;

const std::vector<float> kX = RandomFloats(kBatch * kIn, 1), kTarget = RandomFloats(kBatch * kOut, 2);
const std::vector<float> kW1 = RandomFloats(kIn * kHidden, 3), kB1 = RandomFloats(kHidden, 4),
                         kW2 = RandomFloats(kHidden * kOut, 5), kB2 = RandomFloats(kOut, 6);

std::vector<float> Read(nn::Backend& backend, const nn::TensorView& view) {
  std::vector<float> host(view.shape.size());
  backend.Download(view.data, host.data(), sizeof(float) * host.size());
  return host;
}

// Sets parameters of `params` (allocated) to the given values.
void SetValues(nn::ParameterSet& params, std::initializer_list<std::pair<int, const std::vector<float>*>> values) {
  TROUPE_CHECK(testing::SetValues(params, values).ok());
}

// One forward (`forward` from the input x to y) and backward pass of the
// mean squared error to the target; the loss and the gradients of the
// parameters w1, b1, w2, b2 of `params` and of x.
Gradients LossAndGradients(nn::Backend& backend, nn::ParameterSet& params, std::array<int, 4> w1_b1_w2_b2,
                           const std::function<nn::Var(nn::Tape&, nn::Var)>& forward) {
  nn::DeviceBuffer x(backend, kBatch * kIn);
  x.Upload(kX);
  nn::Tape tape(&backend);
  params.ZeroGrad();
  const nn::Var input = tape.Leaf(x.data(), {kBatch, kIn});
  const nn::Var loss = nn::MeanSquaredError(forward(tape, input), tape.Input(kTarget.data(), {kBatch, kOut}));
  tape.Backward(loss);
  Gradients g;
  g.loss = tape.item(loss);
  const auto [w1, b1, w2, b2] = w1_b1_w2_b2;
  g.w1 = Read(backend, params.grad(w1));
  g.b1 = Read(backend, params.grad(b1));
  g.w2 = Read(backend, params.grad(w2));
  g.b2 = Read(backend, params.grad(b2));
  g.dx = Read(backend, tape.grad(input));
  return g;
}

// The unsplit MLP on one CPU backend: relu(x w1 + b1) w2 + b2.
Gradients Unsplit() {
  nn::CpuBackend backend(1);
  nn::ParameterSet params;
  const nn::LinearLayer l1 = nn::LinearLayer::Create(params, "l1", kIn, kHidden);
  const nn::LinearLayer l2 = nn::LinearLayer::Create(params, "l2", kHidden, kOut);
  params.Allocate(backend, 0);
  SetValues(params, {{l1.w, &kW1}, {l1.b, &kB1}, {l2.w, &kW2}, {l2.b, &kB2}});
  return LossAndGradients(backend, params, {l1.w, l1.b, l2.w, l2.b}, [&](nn::Tape& tape, nn::Var x) {
    return l2(tape, params, nn::Relu(l1(tape, params, x)));
  });
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_TRUE(std::any_of(want.begin(), want.end(), [](float v) { return v != 0; }))
      << what << ": the reference gradient is zero, the comparison vacuous";
  EXPECT_LE(RelativeL2(got, want), 1e-5) << what;
}

TEST(TensorParallelTest, ColumnThenRowParallelLayersEqualTheUnsplitMlp) {
  const Gradients whole = Unsplit();
  for (const int k : {2, 4}) {
    SCOPED_TRACE(absl::StrCat("K=", k));
    auto replicator = testing::MakeInProcess(k);
    std::vector<Gradients> got(k);
    std::vector<int64_t> weight_floats(k);
    ASSERT_TRUE(replicator->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
      const int r = ctx.replica_id();
      nn::Backend& backend = *ctx.backend();
      nn::ParameterSet params;
      const auto column = nn::ColumnParallelLinear::Create(params, "l1", kIn, kHidden, k);
      const auto row = nn::RowParallelLinear::Create(params, "l2", kHidden, kOut, k, r);
      params.Allocate(backend, 0);
      // This replica's slices of the unsplit layers.
      const int64_t part = kHidden / k;
      const std::vector<float> w1 = Columns(kW1, kHidden, r * part, (r + 1) * part);
      const std::vector<float> b1(kB1.begin() + r * part, kB1.begin() + (r + 1) * part);
      const std::vector<float> w2 = Rows(kW2, kOut, r * part, (r + 1) * part);
      SetValues(params, {{column.w, &w1}, {column.b, &b1}, {row.w, &w2}, {row.b, &kB2}});
      got[r] = LossAndGradients(backend, params, {column.w, column.b, row.w, row.b}, [&](nn::Tape& tape, nn::Var x) {
        return row(tape, params, nn::Relu(column(tape, params, x, &ctx)), &ctx);
      });
      RETURN_IF_ERROR(ctx.status());
      weight_floats[r] = params.info(column.w).shape.size() + params.info(row.w).shape.size();
      return absl::OkStatus();
    }).ok());
    const int64_t part = kHidden / k;
    for (int r = 0; r < k; ++r) {
      SCOPED_TRACE(absl::StrCat("replica ", r));
      EXPECT_NEAR(got[r].loss, whole.loss, 1e-6 * whole.loss);
      ExpectNear(got[r].w1, Columns(whole.w1, kHidden, r * part, (r + 1) * part), "w1's columns");
      ExpectNear(got[r].b1, {whole.b1.begin() + r * part, whole.b1.begin() + (r + 1) * part}, "b1's part");
      ExpectNear(got[r].w2, Rows(whole.w2, kOut, r * part, (r + 1) * part), "w2's rows");
      if (r == 0) ExpectNear(got[r].b2, whole.b2, "b2 (part 0's)");
      ExpectNear(got[r].dx, whole.dx, "the input's gradient");
      EXPECT_EQ(weight_floats[r] * k, kIn * kHidden + kHidden * kOut) << "1/K of the weights";
    }
  }
}

// A (K/M) x M mesh of in-process replicas: the MLP's parts over the model
// axis, the batch over the data axis. After 10 Adam steps every replica holds
// its part of what one replica training the unsplit MLP on the whole batch
// holds; replicas with the same model index hold the same part.
TEST(TensorParallelTest, ADataByModelMeshTrainsAsOneReplicaOnTheWholeBatch) {
  constexpr int kSteps = 10;
  constexpr double kTolerance = 1e-5;
  testing::MlpWeights whole, start;
  auto one = testing::MakeInProcess(1);
  ASSERT_TRUE(one->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
    ASSIGN_OR_RETURN(start, testing::TrainMeshMlp(ctx, 0));
    ASSIGN_OR_RETURN(whole, testing::TrainMeshMlp(ctx, kSteps));
    return absl::OkStatus();
  }).ok());
  EXPECT_GT(testing::WorstMlpDifference(start, whole, 0, 1), 100 * kTolerance) << "training moved nothing";
  for (const auto& [k, m] : {std::pair{4, 2}, {2, 2}, {2, 1}, {4, 4}, {8, 4}}) {
    SCOPED_TRACE(absl::StrCat(k / m, " x ", m, " mesh"));
    ReplicatorOptions o;
    o.num_replicas = k;
    o.model_parallel = m;
    auto replicator = Replicator::Create(o);
    ASSERT_TRUE(replicator.ok()) << replicator.status();
    std::vector<testing::MlpWeights> got(k);
    ASSERT_TRUE((*replicator)->RunReplicas([&](ReplicaContext& ctx) -> absl::Status {
      ASSIGN_OR_RETURN(got[ctx.replica_id()], testing::TrainMeshMlp(ctx, kSteps));
      return absl::OkStatus();
    }).ok());
    double worst = 0;
    for (int r = 0; r < k; ++r) {
      SCOPED_TRACE(absl::StrCat("replica ", r));
      const double difference = testing::WorstMlpDifference(got[r], whole, r % m, m);
      EXPECT_LE(difference, kTolerance);
      worst = std::max(worst, difference);
      EXPECT_EQ(got[r].w1, got[r % m].w1) << "the copies of one part stay identical";
    }
    std::printf("%d x %d mesh: worst relative difference from one replica %.2g\n", k / m, m, worst);
  }
}

}  // namespace
}  // namespace troupe::replicator
