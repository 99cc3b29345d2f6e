// The engine around the ops: tape reuse, an MLP fitting a regression,
// optimizers against hand-computed updates, schedules, Polyak targets,
// clipping and checkpoints.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <vector>

#include "engine/nn/checkpoint.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/layers.h"
#include "engine/nn/optimizer.h"
#include "engine/nn/schedule.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::nn {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() / (name + "." + std::to_string(::getpid()))).string();
}

// y = sin(3 x0) + x1^2 on [-1, 1]^2.
void MakeRegression(int64_t n, uint64_t seed, std::vector<float>& x, std::vector<float>& y) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  x.resize(2 * n);
  y.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    x[2 * i] = d(rng);
    x[2 * i + 1] = d(rng);
    y[i] = std::sin(3.0f * x[2 * i]) + x[2 * i + 1] * x[2 * i + 1];
  }
}

TEST(TapeTest, SecondStepWithTheSameOpsAllocatesNoNewArena) {
  CpuBackend backend(/*num_threads=*/2);
  ParameterSet params;
  Mlp mlp = Mlp::Create(params, "mlp", {2, 32, 1});
  params.Allocate(/*seed=*/1);
  std::vector<float> x, y;
  MakeRegression(64, 2, x, y);
  Tape tape(&backend);
  int64_t bytes_after_first = 0;
  for (int step = 0; step < 3; ++step) {
    tape.Reset();
    Var out = mlp(tape, params, tape.Constant(x.data(), {64, 2}));
    Var loss = MeanSquaredError(out, tape.Constant(y.data(), {64, 1}));
    tape.Backward(loss);
    if (step == 0) bytes_after_first = tape.arena_bytes();
  }
  EXPECT_EQ(tape.arena_bytes(), bytes_after_first);
}

TEST(TapeTest, GradientsOfAParameterUsedTwiceAccumulate) {
  CpuBackend backend(1);
  ParameterSet params;
  const int p = params.Add("p", {3}, Init::Constant(2.0f));
  params.Allocate(0);
  Tape tape(&backend);
  Var a = tape.Parameter(params, p);
  Var b = tape.Parameter(params, p);
  tape.Backward(Sum(Mul(a, b)));  // d/dp sum p^2 = 2p
  for (float g : params.grad(p).span()) EXPECT_FLOAT_EQ(g, 4.0f);
}

TEST(MlpTest, FitsASmoothRegression) {
  CpuBackend backend(/*num_threads=*/2);
  ParameterSet params;
  Mlp mlp = Mlp::Create(params, "mlp", {2, 64, 64, 1});
  params.Allocate(/*seed=*/3);
  Adam adam(&params, &backend);
  std::vector<float> x, y, tx, ty;
  MakeRegression(256, 4, x, y);
  MakeRegression(256, 5, tx, ty);
  Tape tape(&backend);
  float initial = 0, final_loss = 0;
  for (int step = 0; step < 600; ++step) {
    tape.Reset();
    params.ZeroGrad();
    Var loss = MeanSquaredError(mlp(tape, params, tape.Constant(x.data(), {256, 2})), tape.Constant(y.data(), {256, 1}));
    if (step == 0) initial = tape.item(loss);
    tape.Backward(loss);
    adam.Step(/*learning_rate=*/3e-3f);
  }
  tape.Reset();
  final_loss = tape.item(
      MeanSquaredError(mlp(tape, params, tape.Constant(tx.data(), {256, 2})), tape.Constant(ty.data(), {256, 1})));
  EXPECT_GT(initial, 0.3f);
  EXPECT_LT(final_loss, 0.01f) << "held-out MSE after 600 Adam steps";
}

TEST(OptimizerTest, AdamMatchesTheFormulaForTwoSteps) {
  CpuBackend backend(1);
  ParameterSet params;
  const int p = params.Add("p", {2}, Init::Constant(1.0f));
  params.Allocate(0);
  Adam adam(&params, &backend, AdamOptions{0.9f, 0.999f, 1e-8f, /*weight_decay=*/0.1f});
  double w = 1.0, m = 0, v = 0;
  const float grads[2] = {0.5f, -0.25f};
  for (int t = 1; t <= 2; ++t) {
    params.grad(p).data[0] = grads[t - 1];
    adam.Step(/*learning_rate=*/0.01f);
    m = 0.9 * m + 0.1 * grads[t - 1];
    v = 0.999 * v + 0.001 * grads[t - 1] * grads[t - 1];
    const double mhat = m / (1 - std::pow(0.9, t)), vhat = v / (1 - std::pow(0.999, t));
    w = w - 0.01 * 0.1 * w - 0.01 * mhat / (std::sqrt(vhat) + 1e-8);
    EXPECT_NEAR(params.value(p).data[0], w, 1e-6) << "step " << t;
  }
  EXPECT_EQ(adam.steps(), 2);
}

// A decorator steps its inner optimizer its own way; state, step count, name
// and parameters are the inner one's, so checkpoints see no difference.
TEST(OptimizerTest, AForwardingOptimizerSharesItsInnerOptimizersState) {
  CpuBackend backend(1);
  ParameterSet params;
  const int p = params.Add("p", {2}, Init::Constant(1.0f));
  params.Allocate(0);
  Sgd sgd(&params, &backend, SgdOptions{/*momentum=*/0.0f});
  struct DoubleRate final : ForwardingOptimizer {
    using ForwardingOptimizer::ForwardingOptimizer;
    void Step(float learning_rate) override { inner()->Step(2 * learning_rate); }
  } doubled(&sgd);
  params.grad(p).data[0] = 1.0f;
  doubled.Step(/*learning_rate=*/0.25f);
  EXPECT_FLOAT_EQ(params.value(p).data[0], 0.5f);  // 1 - 2 * 0.25 * 1
  EXPECT_EQ(sgd.steps(), 1);
  doubled.set_steps(7);
  EXPECT_EQ(sgd.steps(), 7);
  EXPECT_EQ(doubled.name(), "sgd");
  EXPECT_EQ(&doubled.parameters(), &params);
  ASSERT_EQ(doubled.State().size(), sgd.State().size());
  EXPECT_EQ(doubled.State()[0].data, sgd.State()[0].data);
}

// Second moments that decay below the smallest normal float become zero, not
// subnormal (whose arithmetic is ~100x slower), on every thread of the update.
TEST(OptimizerTest, AdamStateDecaysToZeroNotToSubnormals) {
  CpuBackend backend(2);
  const int64_t n = 1 << 16;  // split over both threads
  std::vector<float> grad(n, 0.0f), param(n, 1.0f), m(n, 0.0f), v(n, std::numeric_limits<float>::min());
  backend.AdamUpdate(n, /*lr=*/1e-3f, 0.9f, 0.999f, 1e-8f, /*weight_decay=*/0.0f, /*c1=*/1.0f, /*c2=*/1.0f,
                     grad.data(), param.data(), m.data(), v.data());
  int64_t subnormal = 0;
  for (float x : v) subnormal += std::fpclassify(x) == FP_SUBNORMAL;
  EXPECT_EQ(subnormal, 0);
  EXPECT_EQ(v.front(), 0.0f);
  EXPECT_EQ(v.back(), 0.0f);
}

TEST(OptimizerTest, SgdMomentumMatchesTheFormula) {
  CpuBackend backend(1);
  ParameterSet params;
  const int p = params.Add("p", {1}, Init::Constant(1.0f));
  params.Allocate(0);
  Sgd sgd(&params, &backend, SgdOptions{/*momentum=*/0.5f, /*weight_decay=*/0.0f});
  params.grad(p).data[0] = 1.0f;
  sgd.Step(0.1f);  // buf = 1, w = 0.9
  sgd.Step(0.1f);  // buf = 1.5, w = 0.75
  EXPECT_NEAR(params.value(p).data[0], 0.75f, 1e-6);
}

TEST(OptimizerTest, ClipByGlobalNormScalesOnlyWhenAboveTheLimit) {
  CpuBackend backend(1);
  ParameterSet params;
  const int a = params.Add("a", {1}, Init::Zeros());
  const int b = params.Add("b", {1}, Init::Zeros());
  params.Allocate(0);
  params.grad(a).data[0] = 3.0f;
  params.grad(b).data[0] = 4.0f;
  EXPECT_FLOAT_EQ(ClipGradientsByGlobalNorm(params, backend, /*max_norm=*/10.0f), 5.0f);
  EXPECT_FLOAT_EQ(params.grad(a).data[0], 3.0f);
  EXPECT_FLOAT_EQ(ClipGradientsByGlobalNorm(params, backend, /*max_norm=*/1.0f), 5.0f);
  EXPECT_NEAR(params.grad(a).data[0], 0.6f, 1e-6);
  EXPECT_NEAR(params.grad(b).data[0], 0.8f, 1e-6);
}

TEST(OptimizerTest, PolyakMovesTargetTauOfTheWayAndRefusesAnotherLayout) {
  CpuBackend backend(1);
  ParameterSet online, target, other;
  online.Add("w", {2}, Init::Constant(1.0f));
  target.Add("w", {2}, Init::Zeros());
  other.Add("v", {2}, Init::Zeros());
  online.Allocate(0), target.Allocate(0), other.Allocate(0);
  ASSERT_TRUE(PolyakUpdate(online, target, backend, /*tau=*/0.25f).ok());
  EXPECT_FLOAT_EQ(target.value(0).data[1], 0.25f);
  ASSERT_TRUE(PolyakUpdate(online, target, backend, /*tau=*/0.25f).ok());
  EXPECT_FLOAT_EQ(target.value(0).data[1], 0.4375f);
  EXPECT_THAT(PolyakUpdate(online, other, backend, 0.1f).message(), HasSubstr("'w'"));
}

TEST(ScheduleTest, WarmupThenCosineReachesTheFloor) {
  ScheduleOptions o;
  o.base_lr = 1.0f, o.warmup_steps = 10, o.decay = ScheduleOptions::Decay::kCosine, o.total_steps = 100;
  o.final_fraction = 0.1f;
  ASSERT_TRUE(o.Validate().ok());
  EXPECT_FLOAT_EQ(LearningRate(o, 0), 0.1f);
  EXPECT_FLOAT_EQ(LearningRate(o, 9), 1.0f);
  EXPECT_FLOAT_EQ(LearningRate(o, 10), 1.0f);
  EXPECT_NEAR(LearningRate(o, 60), 0.55f, 1e-5);  // halfway: floor + half the range
  EXPECT_NEAR(LearningRate(o, 110), 0.1f, 1e-6);
  EXPECT_NEAR(LearningRate(o, 5000), 0.1f, 1e-6);
}

TEST(ScheduleTest, ExponentialDecayHalvesEveryDecaySteps) {
  ScheduleOptions o;
  o.base_lr = 2.0f, o.decay = ScheduleOptions::Decay::kExponential, o.decay_rate = 0.5f, o.decay_steps = 100;
  EXPECT_NEAR(LearningRate(o, 100), 1.0f, 1e-6);
  EXPECT_NEAR(LearningRate(o, 200), 0.5f, 1e-6);
  EXPECT_NEAR(LinearScalingRule(/*base_lr=*/0.1f, /*base_batch=*/256, /*batch=*/1024), 0.4f, 1e-6);
  o.decay_steps = 0;
  EXPECT_FALSE(o.Validate().ok());
}

// Sets every parameter's gradient (not the alignment padding between them).
void FillGrads(ParameterSet& params, float value) {
  for (int i = 0; i < params.size(); ++i) {
    for (float& g : params.grad(i).span()) g = value;
  }
}

TEST(CheckpointTest, RoundTripRestoresParametersAndAdamState) {
  CpuBackend backend(1);
  ParameterSet params;
  Mlp::Create(params, "mlp", {3, 4, 2});
  params.Allocate(/*seed=*/7);
  Adam adam(&params, &backend);
  FillGrads(params, 0.1f);
  adam.Step(0.01f);
  const std::string path = TempPath("troupe_ckpt_roundtrip");
  ASSERT_TRUE(SaveCheckpoint(path, params, &adam).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  ParameterSet restored;
  Mlp::Create(restored, "mlp", {3, 4, 2});
  restored.Allocate(/*seed=*/8);
  Adam restored_adam(&restored, &backend);
  ASSERT_TRUE(LoadCheckpoint(path, restored, &restored_adam).ok());
  EXPECT_TRUE(std::equal(params.values().begin(), params.values().end(), restored.values().begin()));
  EXPECT_EQ(restored_adam.steps(), 1);
  // The next step is identical.
  FillGrads(params, 0.1f);
  FillGrads(restored, 0.1f);
  adam.Step(0.01f);
  restored_adam.Step(0.01f);
  EXPECT_TRUE(std::equal(params.values().begin(), params.values().end(), restored.values().begin()));
  std::filesystem::remove(path);
}

TEST(CheckpointTest, RefusesADifferentModelNamingTheFirstMismatch) {
  ParameterSet params;
  Mlp::Create(params, "mlp", {3, 4, 2});
  params.Allocate(1);
  const std::string path = TempPath("troupe_ckpt_mismatch");
  ASSERT_TRUE(SaveCheckpoint(path, params).ok());

  ParameterSet wider;
  Mlp::Create(wider, "mlp", {3, 5, 2});
  wider.Allocate(1);
  const std::vector<float> before(wider.values().begin(), wider.values().end());
  absl::Status s = LoadCheckpoint(path, wider);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'param/mlp.0.w' has shape [3, 4], the model expects [3, 5]"));
  EXPECT_TRUE(std::equal(before.begin(), before.end(), wider.values().begin())) << "nothing overwritten";

  ParameterSet renamed;
  Mlp::Create(renamed, "net", {3, 4, 2});
  renamed.Allocate(1);
  EXPECT_THAT(LoadCheckpoint(path, renamed).message(), HasSubstr("'param/mlp.0.w', the model expects 'param/net.0.w'"));
  std::filesystem::remove(path);
}

TEST(CheckpointTest, ReadCheckpointGivesEveryTensorByNameInFileOrder) {
  ParameterSet params;
  Mlp::Create(params, "mlp", {3, 4, 2});
  params.Allocate(1);
  const std::string path = TempPath("troupe_ckpt_read");
  ASSERT_TRUE(SaveCheckpoint(path, params).ok());
  auto tensors = ReadCheckpoint(path);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->size(), 4u);
  EXPECT_EQ((*tensors)[0].name, "param/mlp.0.w");
  EXPECT_EQ((*tensors)[0].shape, (Shape{3, 4}));
  EXPECT_EQ((*tensors)[3].name, "param/mlp.1.b");
  for (int i = 0; i < params.size(); ++i) {
    const auto value = params.value(i);
    EXPECT_EQ((*tensors)[i].values, std::vector<float>(value.data, value.data + value.size())) << i;
  }
  // Truncated: DataLoss, as LoadCheckpoint.
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 9);
  EXPECT_EQ(ReadCheckpoint(path).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadCheckpoint(path + ".missing").status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove(path);
}

TEST(CheckpointTest, CorruptFileIsDataLoss) {
  ParameterSet params;
  Mlp::Create(params, "mlp", {3, 4, 2});
  params.Allocate(1);
  const std::string path = TempPath("troupe_ckpt_corrupt");
  ASSERT_TRUE(SaveCheckpoint(path, params).ok());
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(40);
    f.put('\x7f');
  }
  absl::Status s = LoadCheckpoint(path, params);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr("checksum"));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace troupe::nn
