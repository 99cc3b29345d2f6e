// The engine around the ops: tape reuse, an MLP fitting a regression,
// optimizers against hand-computed updates, schedules, Polyak targets,
// clipping and checkpoints; each on the CPU backend and on the strict CPU
// device (memory the host cannot touch: every host read here is a Download),
// where the results are the CPU's bit for bit.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/nn/checkpoint.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/layers.h"
#include "engine/nn/optimizer.h"
#include "engine/nn/schedule.h"
#include "engine/nn/state_match.h"
#include "engine/nn/strict_cpu_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::nn {
namespace {

using ::testing::HasSubstr;

enum class Device { kCpu, kStrict };

std::unique_ptr<Backend> MakeDevice(Device device, int threads) {
  if (device == Device::kStrict) return std::make_unique<StrictCpuBackend>(threads);
  return std::make_unique<CpuBackend>(threads);
}

// Host copies of parameter i's value and gradient, and a gradient set from the host.
std::vector<float> Value(const ParameterSet& params, int i) {
  std::vector<float> host(params.info(i).shape.size());
  params.backend().Download(params.value(i).data, host.data(), sizeof(float) * host.size());
  return host;
}
std::vector<float> Grad(const ParameterSet& params, int i) {
  std::vector<float> host(params.info(i).shape.size());
  params.backend().Download(params.grad(i).data, host.data(), sizeof(float) * host.size());
  return host;
}
void SetGrad(ParameterSet& params, int i, const std::vector<float>& host) {
  ASSERT_EQ(static_cast<int64_t>(host.size()), params.info(i).shape.size());
  params.backend().Upload(host.data(), params.grad(i).data, sizeof(float) * host.size());
}

// Each test runs on a backend of GetParam()'s device.
class EngineTest : public ::testing::TestWithParam<Device> {
 protected:
  std::unique_ptr<Backend> NewBackend(int threads = 1) { return MakeDevice(GetParam(), threads); }
};

std::string DeviceName(const ::testing::TestParamInfo<Device>& info) {
  return info.param == Device::kStrict ? "Strict" : "Cpu";
}

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

TEST_P(EngineTest, SecondStepWithTheSameOpsAllocatesNoNewArena) {
  auto backend = NewBackend(/*threads=*/2);
  ParameterSet params;
  Mlp mlp = Mlp::Create(params, "mlp", {2, 32, 1});
  params.Allocate(*backend, /*seed=*/1);
  std::vector<float> x, y;
  MakeRegression(64, 2, x, y);
  Tape tape(backend.get());
  int64_t bytes_after_first = 0;
  for (int step = 0; step < 3; ++step) {
    tape.Reset();
    Var out = mlp(tape, params, tape.Input(x.data(), {64, 2}));
    Var loss = MeanSquaredError(out, tape.Input(y.data(), {64, 1}));
    tape.Backward(loss);
    if (step == 0) bytes_after_first = tape.arena_bytes();
  }
  EXPECT_EQ(tape.arena_bytes(), bytes_after_first);
}

TEST_P(EngineTest, GradientsOfAParameterUsedTwiceAccumulate) {
  auto backend = NewBackend();
  ParameterSet params;
  const int p = params.Add("p", {3}, Init::Constant(2.0f));
  params.Allocate(*backend, 0);
  Tape tape(backend.get());
  Var a = tape.Parameter(params, p);
  Var b = tape.Parameter(params, p);
  tape.Backward(Sum(Mul(a, b)));  // d/dp sum p^2 = 2p
  for (float g : Grad(params, p)) EXPECT_FLOAT_EQ(g, 4.0f);
  params.ZeroGrad();
  for (float g : Grad(params, p)) EXPECT_EQ(g, 0.0f);
}

// `steps` Adam steps of an MLP on the regression; returns the held-out MSE
// before and after, and the final parameters.
struct Fit {
  float initial = 0, final_loss = 0;
  std::vector<float> values;
};
Fit FitRegression(Backend& backend, int steps) {
  ParameterSet params;
  Mlp mlp = Mlp::Create(params, "mlp", {2, 64, 64, 1});
  params.Allocate(backend, /*seed=*/3);
  Adam adam(&params, &backend);
  std::vector<float> x, y, tx, ty;
  MakeRegression(256, 4, x, y);
  MakeRegression(256, 5, tx, ty);
  Tape tape(&backend);
  Fit fit;
  for (int step = 0; step < steps; ++step) {
    tape.Reset();
    params.ZeroGrad();
    Var loss = MeanSquaredError(mlp(tape, params, tape.Input(x.data(), {256, 2})), tape.Input(y.data(), {256, 1}));
    if (step == 0) fit.initial = tape.item(loss);
    tape.Backward(loss);
    adam.Step(/*learning_rate=*/3e-3f);
  }
  tape.Reset();
  fit.final_loss =
      tape.item(MeanSquaredError(mlp(tape, params, tape.Input(tx.data(), {256, 2})), tape.Input(ty.data(), {256, 1})));
  fit.values = params.DownloadValues();
  return fit;
}

TEST_P(EngineTest, AnMlpFitsASmoothRegression) {
  auto backend = NewBackend(/*threads=*/2);
  const Fit fit = FitRegression(*backend, 600);
  EXPECT_GT(fit.initial, 0.3f);
  EXPECT_LT(fit.final_loss, 0.01f) << "held-out MSE after 600 Adam steps";
}

// The strict device's whole training run equals the CPU's, bit for bit (one
// thread each: the CPU backend's reductions split by thread count).
TEST(StrictDeviceTest, AnMlpTrainsToTheCpusParametersBitForBit) {
  CpuBackend cpu(1);
  StrictCpuBackend strict(1);
  const Fit a = FitRegression(cpu, 50), b = FitRegression(strict, 50);
  EXPECT_EQ(a.values, b.values);
  EXPECT_EQ(a.final_loss, b.final_loss);
  EXPECT_NE(a.values, FitRegression(cpu, 49).values) << "the last step changes something";
}

TEST_P(EngineTest, AdamMatchesTheFormulaForTwoSteps) {
  auto backend = NewBackend();
  ParameterSet params;
  const int p = params.Add("p", {2}, Init::Constant(1.0f));
  params.Allocate(*backend, 0);
  Adam adam(&params, backend.get(), AdamOptions{0.9f, 0.999f, 1e-8f, /*weight_decay=*/0.1f});
  double w = 1.0, m = 0, v = 0;
  const float grads[2] = {0.5f, -0.25f};
  for (int t = 1; t <= 2; ++t) {
    SetGrad(params, p, {grads[t - 1], 0.0f});
    adam.Step(/*learning_rate=*/0.01f);
    m = 0.9 * m + 0.1 * grads[t - 1];
    v = 0.999 * v + 0.001 * grads[t - 1] * grads[t - 1];
    const double mhat = m / (1 - std::pow(0.9, t)), vhat = v / (1 - std::pow(0.999, t));
    w = w - 0.01 * 0.1 * w - 0.01 * mhat / (std::sqrt(vhat) + 1e-8);
    EXPECT_NEAR(Value(params, p)[0], w, 1e-6) << "step " << t;
  }
  EXPECT_EQ(adam.steps(), 2);
}

// Adam's bias corrections (1 - beta^step, computed by squaring, not libm's
// pow) against the formula in double at step counts far from the first, a
// loaded optimizer's (set_steps): one step from zero moments at each.
TEST_P(EngineTest, AdamsBiasCorrectionsMatchTheFormulaAtAnyStepCount) {
  for (const int64_t step : {int64_t{3}, int64_t{10}, int64_t{777}, int64_t{123457}}) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    auto backend = NewBackend();
    ParameterSet params;
    const int p = params.Add("p", {2}, Init::Constant(1.0f));
    params.Allocate(*backend, 0);
    Adam adam(&params, backend.get(), AdamOptions{0.9f, 0.999f, 1e-8f, /*weight_decay=*/0.0f});
    adam.set_steps(step - 1);
    const double g = 0.5;
    SetGrad(params, p, {static_cast<float>(g), 0.0f});
    adam.Step(/*learning_rate=*/0.01f);
    const double mhat = 0.1 * g / (1 - std::pow(0.9, step)), vhat = 0.001 * g * g / (1 - std::pow(0.999, step));
    EXPECT_NEAR(Value(params, p)[0], 1.0 - 0.01 * mhat / (std::sqrt(vhat) + 1e-8), 1e-6);
    EXPECT_EQ(adam.steps(), step);
  }
}

// Per-tensor host references of the published rules, in double.
double Norm(const std::vector<double>& x) {
  double s = 0;
  for (double v : x) s += v * v;
  return std::sqrt(s);
}

// LAMB (You et al. 2020, Algorithm 2) against its formula for three steps on
// two tensors of different scales, with weight decay.
TEST_P(EngineTest, LambMatchesThePublishedUpdateRule) {
  auto backend = NewBackend();
  ParameterSet params;
  const int a = params.Add("a", {3}, Init::Constant(0.5f));
  const int b = params.Add("b", {2}, Init::Constant(-2.0f));
  params.Allocate(*backend, 0);
  const LambOptions options{0.9f, 0.999f, 1e-6f, /*weight_decay=*/0.01f};
  ASSERT_TRUE(options.Validate().ok());
  Lamb lamb(&params, backend.get(), options);
  std::vector<std::vector<double>> x = {{0.5, 0.5, 0.5}, {-2.0, -2.0}}, m = {{0, 0, 0}, {0, 0}}, v = m;
  const std::vector<std::vector<std::vector<float>>> grads = {
      {{0.3f, -0.1f, 0.02f}, {1.0f, -4.0f}}, {{-0.2f, 0.1f, 0.05f}, {0.5f, 3.0f}}, {{0.1f, 0.1f, -0.3f}, {-2.0f, 1.0f}}};
  for (int t = 1; t <= 3; ++t) {
    SetGrad(params, a, grads[t - 1][0]);
    SetGrad(params, b, grads[t - 1][1]);
    lamb.Step(/*learning_rate=*/0.05f);
    for (int k = 0; k < 2; ++k) {
      std::vector<double> r(x[k].size());
      for (size_t i = 0; i < r.size(); ++i) {
        const double g = grads[t - 1][k][i];
        m[k][i] = 0.9 * m[k][i] + 0.1 * g;
        v[k][i] = 0.999 * v[k][i] + 0.001 * g * g;
        const double mhat = m[k][i] / (1 - std::pow(0.9, t)), vhat = v[k][i] / (1 - std::pow(0.999, t));
        r[i] = mhat / (std::sqrt(vhat) + 1e-6) + 0.01 * x[k][i];
      }
      const double trust = Norm(x[k]) / Norm(r);
      for (size_t i = 0; i < r.size(); ++i) x[k][i] -= 0.05 * trust * r[i];
    }
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(Value(params, a)[i], x[0][i], 1e-5) << "step " << t << " a" << i;
    for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(Value(params, b)[i], x[1][i], 1e-5) << "step " << t << " b" << i;
  }
  EXPECT_EQ(lamb.steps(), 3);
}

// LARS (You, Gitman & Ginsburg 2017, Algorithm 1) against its formula for
// three steps on two tensors, with momentum and weight decay.
TEST_P(EngineTest, LarsMatchesThePublishedUpdateRule) {
  auto backend = NewBackend();
  ParameterSet params;
  const int a = params.Add("a", {3}, Init::Constant(0.5f));
  const int b = params.Add("b", {2}, Init::Constant(-2.0f));
  params.Allocate(*backend, 0);
  const LarsOptions options{/*momentum=*/0.9f, /*weight_decay=*/0.0005f, /*trust_coefficient=*/0.02f};
  ASSERT_TRUE(options.Validate().ok());
  Lars lars(&params, backend.get(), options);
  std::vector<std::vector<double>> w = {{0.5, 0.5, 0.5}, {-2.0, -2.0}}, vel = {{0, 0, 0}, {0, 0}};
  const std::vector<std::vector<std::vector<float>>> grads = {
      {{0.3f, -0.1f, 0.02f}, {1.0f, -4.0f}}, {{-0.2f, 0.1f, 0.05f}, {0.5f, 3.0f}}, {{0.1f, 0.1f, -0.3f}, {-2.0f, 1.0f}}};
  const float rates[3] = {1.0f, 0.5f, 2.0f};  // the rate sits inside the momentum, as in the paper
  for (int t = 1; t <= 3; ++t) {
    SetGrad(params, a, grads[t - 1][0]);
    SetGrad(params, b, grads[t - 1][1]);
    lars.Step(rates[t - 1]);
    for (int k = 0; k < 2; ++k) {
      std::vector<double> g(grads[t - 1][k].begin(), grads[t - 1][k].end());
      const double local = 0.02 * Norm(w[k]) / (Norm(g) + 0.0005 * Norm(w[k]));
      for (size_t i = 0; i < g.size(); ++i) {
        vel[k][i] = 0.9 * vel[k][i] + rates[t - 1] * local * (g[i] + 0.0005 * w[k][i]);
        w[k][i] -= vel[k][i];
      }
    }
    for (size_t i = 0; i < 3; ++i) EXPECT_NEAR(Value(params, a)[i], w[0][i], 1e-5) << "step " << t << " a" << i;
    for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(Value(params, b)[i], w[1][i], 1e-5) << "step " << t << " b" << i;
  }
  EXPECT_EQ(lars.steps(), 3);
}

// A backend counts its memory: what its allocations hold (scratch too) and
// the most they held at once; a budget refuses the allocation that would
// pass it, naming the sizes, as a device of that size would (the process
// stops: a step cannot go on without its memory), on the CPU and the strict
// device alike.
TEST(BackendMemoryTest, CountsWhatIsInUseAndItsPeakAndABudgetRefusesTheAllocationPastIt) {
  constexpr size_t kMiB = size_t{1} << 20;
  for (const bool strict : {false, true}) {
    std::unique_ptr<Backend> backend =
        strict ? std::unique_ptr<Backend>(std::make_unique<StrictCpuBackend>(1)) : std::make_unique<CpuBackend>(1);
    EXPECT_EQ(backend->memory_in_use(), 0u);
    void* a = backend->Allocate(3 * kMiB);
    void* b = backend->AllocateScratch(2 * kMiB);
    EXPECT_EQ(backend->memory_in_use(), 5 * kMiB);
    backend->Free(a);
    backend->Free(nullptr);
    EXPECT_EQ(backend->memory_in_use(), 2 * kMiB);
    EXPECT_EQ(backend->peak_memory(), 5 * kMiB);
    backend->ResetPeakMemory();
    EXPECT_EQ(backend->peak_memory(), 2 * kMiB);
    backend->set_memory_budget(4 * kMiB);
    void* c = backend->Allocate(2 * kMiB);  // exactly the budget
    EXPECT_EQ(backend->memory_in_use(), 4 * kMiB);
    EXPECT_DEATH(backend->Allocate(1), "out of its memory budget: 0.00 MiB asked with 4.00 MiB in use, over the "
                                       "budget of 4.00 MiB \\(engine.device_memory_mib\\)");
    backend->Free(c);
    backend->Free(b);
    EXPECT_EQ(backend->memory_in_use(), 0u);
  }
}

TEST(OptimizerTest, LambAndLarsRefuseOutOfRangeOptions) {
  EXPECT_THAT(LambOptions{1.0f}.Validate().message(), HasSubstr("lamb beta1 1 not in [0, 1)"));
  EXPECT_THAT((LambOptions{0.9f, 0.999f, 0.0f}).Validate().message(), HasSubstr("lamb eps 0 must be > 0"));
  EXPECT_THAT((LarsOptions{0.9f, 0.0f, 0.0f}).Validate().message(), HasSubstr("lars trust_coefficient 0"));
  EXPECT_THAT((LarsOptions{0.9f, -1.0f}).Validate().message(), HasSubstr("lars weight_decay -1 < 0"));
}

// A decorator steps its inner optimizer its own way; state, step count, name
// and parameters are the inner one's, so checkpoints see no difference.
TEST_P(EngineTest, AForwardingOptimizerSharesItsInnerOptimizersState) {
  auto backend = NewBackend();
  ParameterSet params;
  const int p = params.Add("p", {2}, Init::Constant(1.0f));
  params.Allocate(*backend, 0);
  Sgd sgd(&params, backend.get(), SgdOptions{/*momentum=*/0.0f});
  struct DoubleRate final : ForwardingOptimizer {
    using ForwardingOptimizer::ForwardingOptimizer;
    void Prepare(float learning_rate, StepStaging* staging) override { inner()->Prepare(2 * learning_rate, staging); }
  } doubled(&sgd);
  SetGrad(params, p, {1.0f, 0.0f});
  doubled.Step(/*learning_rate=*/0.25f);
  EXPECT_FLOAT_EQ(Value(params, p)[0], 0.5f);  // 1 - 2 * 0.25 * 1
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

TEST_P(EngineTest, SgdMomentumMatchesTheFormula) {
  auto backend = NewBackend();
  ParameterSet params;
  const int p = params.Add("p", {1}, Init::Constant(1.0f));
  params.Allocate(*backend, 0);
  Sgd sgd(&params, backend.get(), SgdOptions{/*momentum=*/0.5f, /*weight_decay=*/0.0f});
  SetGrad(params, p, {1.0f});
  sgd.Step(0.1f);  // buf = 1, w = 0.9
  sgd.Step(0.1f);  // buf = 1.5, w = 0.75
  EXPECT_NEAR(Value(params, p)[0], 0.75f, 1e-6);
}

TEST_P(EngineTest, ClipByGlobalNormScalesOnlyWhenAboveTheLimit) {
  auto backend = NewBackend();
  ParameterSet params;
  const int a = params.Add("a", {1}, Init::Zeros());
  const int b = params.Add("b", {1}, Init::Zeros());
  params.Allocate(*backend, 0);
  SetGrad(params, a, {3.0f});
  SetGrad(params, b, {4.0f});
  DeviceBuffer norm(*backend, 1);
  auto norm_on_host = [&] { return norm.Download()[0]; };
  ClipGradientsByGlobalNorm(params, *backend, /*max_norm=*/10.0f, norm.data());
  EXPECT_FLOAT_EQ(norm_on_host(), 5.0f);
  EXPECT_FLOAT_EQ(Grad(params, a)[0], 3.0f);
  ClipGradientsByGlobalNorm(params, *backend, /*max_norm=*/1.0f, norm.data());
  EXPECT_FLOAT_EQ(norm_on_host(), 5.0f);
  EXPECT_NEAR(Grad(params, a)[0], 0.6f, 1e-6);
  EXPECT_NEAR(Grad(params, b)[0], 0.8f, 1e-6);
}

TEST_P(EngineTest, PolyakMovesTargetTauOfTheWayAndRefusesAnotherLayout) {
  auto backend = NewBackend();
  ParameterSet online, target, other;
  online.Add("w", {2}, Init::Constant(1.0f));
  target.Add("w", {2}, Init::Zeros());
  other.Add("v", {2}, Init::Zeros());
  online.Allocate(*backend, 0), target.Allocate(*backend, 0), other.Allocate(*backend, 0);
  ASSERT_TRUE(PolyakUpdate(online, target, *backend, /*tau=*/0.25f).ok());
  EXPECT_FLOAT_EQ(Value(target, 0)[1], 0.25f);
  ASSERT_TRUE(PolyakUpdate(online, target, *backend, /*tau=*/0.25f).ok());
  EXPECT_FLOAT_EQ(Value(target, 0)[1], 0.4375f);
  EXPECT_THAT(PolyakUpdate(online, other, *backend, 0.1f).message(), HasSubstr("'w'"));
}

TEST_P(EngineTest, ParametersMoveBetweenHostAndDeviceOnlyThroughUploadAndDownload) {
  auto backend = NewBackend();
  ParameterSet params, copy;
  for (ParameterSet* set : {&params, &copy}) Mlp::Create(*set, "mlp", {3, 4, 2});
  params.Allocate(*backend, /*seed=*/5);
  copy.Allocate(*backend, /*seed=*/6);
  EXPECT_NE(params.DownloadValues(), copy.DownloadValues());
  ASSERT_TRUE(copy.CopyValuesFrom(params).ok());
  EXPECT_EQ(params.DownloadValues(), copy.DownloadValues());
  std::vector<float> host(params.total_floats(), 0.5f);
  ASSERT_TRUE(params.UploadValues(host).ok());
  EXPECT_EQ(params.DownloadValues(), host);
  host.pop_back();
  EXPECT_THAT(params.UploadValues(host).message(), HasSubstr("got " + std::to_string(host.size()) + " floats"));
  // The same seed gives the same values on any backend.
  CpuBackend cpu(1);
  ParameterSet on_cpu, here;
  for (ParameterSet* set : {&on_cpu, &here}) Mlp::Create(*set, "mlp", {3, 4, 2});
  on_cpu.Allocate(cpu, /*seed=*/6);
  here.Allocate(*backend, /*seed=*/6);
  EXPECT_EQ(on_cpu.DownloadValues(), here.DownloadValues());
}

// Sets every parameter's gradient (not the alignment padding between them).
void FillGrads(ParameterSet& params, float value) {
  for (int i = 0; i < params.size(); ++i) SetGrad(params, i, std::vector<float>(params.info(i).shape.size(), value));
}

TEST_P(EngineTest, ACheckpointRoundTripRestoresParametersAndAdamState) {
  auto backend = NewBackend();
  ParameterSet params;
  Mlp::Create(params, "mlp", {3, 4, 2});
  params.Allocate(*backend, /*seed=*/7);
  Adam adam(&params, backend.get());
  FillGrads(params, 0.1f);
  adam.Step(0.01f);
  const std::string path = TempPath("troupe_ckpt_roundtrip");
  ASSERT_TRUE(SaveCheckpoint(path, params, &adam).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  ParameterSet restored;
  Mlp::Create(restored, "mlp", {3, 4, 2});
  restored.Allocate(*backend, /*seed=*/8);
  Adam restored_adam(&restored, backend.get());
  ASSERT_NE(params.DownloadValues(), restored.DownloadValues());
  ASSERT_TRUE(LoadCheckpoint(path, restored, &restored_adam).ok());
  EXPECT_EQ(params.DownloadValues(), restored.DownloadValues());
  EXPECT_EQ(restored_adam.steps(), 1);
  // The next step is identical.
  FillGrads(params, 0.1f);
  FillGrads(restored, 0.1f);
  adam.Step(0.01f);
  restored_adam.Step(0.01f);
  EXPECT_EQ(params.DownloadValues(), restored.DownloadValues());
  std::filesystem::remove(path);
}

// nn::SameState (engine/nn/state_match.h), the whole-state comparison of
// the equivalence tests: a gradient twice too large moves Adam's first step
// by the same lr * sign(g), so the weights agree while the moments (and so
// SameState) do not; a state that never moved, and counters that differ,
// fail too; a true copy passes.
TEST(StateMatchTest, SeesAGradientsMagnitudeInAdamsMomentsWhereTheWeightsHideIt) {
  CpuBackend backend(1);
  struct Model {
    ParameterSet params;
    std::unique_ptr<Adam> adam;
  };
  auto make = [&](Model& m) {
    Mlp::Create(m.params, "mlp", {3, 4, 2});
    m.params.Allocate(backend, /*seed=*/7);
    m.adam = std::make_unique<Adam>(&m.params, &backend);
  };
  Model want, same, doubled;
  make(want), make(same), make(doubled);
  const std::vector<CheckpointTensor> start = CheckpointTensors(want.params, want.adam.get());
  for (auto [model, gradient] : {std::pair{&want, 0.1f}, std::pair{&same, 0.1f}, std::pair{&doubled, 0.2f}}) {
    FillGrads(model->params, gradient);
    model->adam->Step(0.01f);
  }
  const std::vector<CheckpointTensor> w = CheckpointTensors(want.params, want.adam.get());
  EXPECT_TRUE(SameState(start, w, CheckpointTensors(same.params, same.adam.get()), {.tolerance = 1e-6}));
  // The weights alone cannot tell a doubled gradient.
  const std::vector<float> a = want.params.DownloadValues(), b = doubled.params.DownloadValues();
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-6) << "weight " << i;
  const ::testing::AssertionResult doubled_match =
      SameState(start, w, CheckpointTensors(doubled.params, doubled.adam.get()), {.tolerance = 1e-4});
  EXPECT_FALSE(doubled_match);
  EXPECT_THAT(doubled_match.message(), HasSubstr("adam.m/mlp.0.w: 0.5 "));  // m = 0.01 against 0.02
  EXPECT_THAT(doubled_match.message(), HasSubstr("adam.v/mlp.0.w: 0.75 "));
  EXPECT_THAT(doubled_match.message(), ::testing::Not(HasSubstr("param/mlp.0.w")));
  // Compared with itself as the start: nothing moved, which says nothing.
  const ::testing::AssertionResult unmoved = SameState(w, w, w, {.tolerance = 1e-4});
  EXPECT_FALSE(unmoved);
  EXPECT_THAT(unmoved.message(), HasSubstr("group param moved 0 from the start"));
  EXPECT_TRUE(SameState(w, w, w, {.tolerance = 1e-4, .unmoved = {"param", "adam.m", "adam.v"}}));
  // One more step on one side: its counter differs.
  FillGrads(same.params, 0.1f);
  same.adam->Step(0.0f);
  const ::testing::AssertionResult counted = SameState(start, w, CheckpointTensors(same.params, same.adam.get()), {});
  EXPECT_FALSE(counted);
  EXPECT_THAT(counted.message(), HasSubstr("adam.steps: counters differ"));
}

// A file in the checkpoint format written byte by byte (as the engine wrote
// them before its memory moved to the backend): parameters, Adam's moments
// and step count load, on any device.
TEST_P(EngineTest, ACheckpointFileOfTheDocumentedFormatLoads) {
  std::string bytes = "TRPCKPT1";
  auto put = [&bytes](const auto& v) { bytes.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  const int64_t steps = 3;
  const float moments[2][2] = {{0.25f, -0.5f}, {0.125f, 2.0f}};
  const std::vector<std::pair<std::string, std::vector<float>>> entries = {
      {"param/w", {1.5f, -2.5f}}, {"adam.m/w", {moments[0][0], moments[0][1]}}, {"adam.v/w", {moments[1][0], moments[1][1]}}};
  put(uint32_t{4});
  for (const auto& [name, values] : entries) {
    put(uint32_t(name.size()));
    bytes += name;
    put(uint32_t{1});
    put(int64_t{2});
    for (float v : values) put(v);
  }
  const std::string steps_name = "adam.steps";
  put(uint32_t(steps_name.size()));
  bytes += steps_name;
  put(uint32_t{1});
  put(int64_t{2});
  put(steps);
  uint64_t h = 1469598103934665603ull;  // FNV-1a-64 of everything before it
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  put(h);
  const std::string path = TempPath("troupe_ckpt_format");
  std::ofstream(path, std::ios::binary) << bytes;

  auto backend = NewBackend();
  ParameterSet params;
  params.Add("w", {2}, Init::Zeros());
  params.Allocate(*backend, 0);
  Adam adam(&params, backend.get());
  ASSERT_TRUE(LoadCheckpoint(path, params, &adam).ok());
  EXPECT_EQ(Value(params, 0), (std::vector<float>{1.5f, -2.5f}));
  EXPECT_EQ(adam.steps(), 3);
  const std::vector<OptimizerState> state = adam.State();
  ASSERT_EQ(state.size(), 2u);
  for (int k = 0; k < 2; ++k) {
    std::vector<float> host(2);
    backend->Download(state[k].data, host.data(), sizeof(float) * 2);
    EXPECT_EQ(host, (std::vector<float>{moments[k][0], moments[k][1]})) << state[k].name;
  }
  // Saved again, the file is the same bytes.
  ASSERT_TRUE(SaveCheckpoint(path + ".again", params, &adam).ok());
  std::ifstream again(path + ".again", std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(again), {}), bytes);
  std::filesystem::remove(path);
  std::filesystem::remove(path + ".again");
}

TEST_P(EngineTest, ACheckpointOfADifferentModelIsRefusedNamingTheFirstMismatch) {
  auto backend = NewBackend();
  ParameterSet params;
  Mlp::Create(params, "mlp", {3, 4, 2});
  params.Allocate(*backend, 1);
  const std::string path = TempPath("troupe_ckpt_mismatch");
  ASSERT_TRUE(SaveCheckpoint(path, params).ok());

  ParameterSet wider;
  Mlp::Create(wider, "mlp", {3, 5, 2});
  wider.Allocate(*backend, 1);
  const std::vector<float> before = wider.DownloadValues();
  absl::Status s = LoadCheckpoint(path, wider);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'param/mlp.0.w' has shape [3, 4], the model expects [3, 5]"));
  EXPECT_EQ(wider.DownloadValues(), before) << "nothing overwritten";

  ParameterSet renamed;
  Mlp::Create(renamed, "net", {3, 4, 2});
  renamed.Allocate(*backend, 1);
  EXPECT_THAT(LoadCheckpoint(path, renamed).message(), HasSubstr("'param/mlp.0.w', the model expects 'param/net.0.w'"));
  std::filesystem::remove(path);
}

TEST_P(EngineTest, ReadCheckpointGivesEveryTensorByNameInFileOrder) {
  auto backend = NewBackend();
  ParameterSet params;
  Mlp::Create(params, "mlp", {3, 4, 2});
  params.Allocate(*backend, 1);
  const std::string path = TempPath("troupe_ckpt_read");
  ASSERT_TRUE(SaveCheckpoint(path, params).ok());
  auto tensors = ReadCheckpoint(path);
  ASSERT_TRUE(tensors.ok()) << tensors.status();
  ASSERT_EQ(tensors->size(), 4u);
  EXPECT_EQ((*tensors)[0].name, "param/mlp.0.w");
  EXPECT_EQ((*tensors)[0].shape, (Shape{3, 4}));
  EXPECT_EQ((*tensors)[3].name, "param/mlp.1.b");
  for (int i = 0; i < params.size(); ++i) EXPECT_EQ((*tensors)[i].values, Value(params, i)) << i;
  // Truncated: DataLoss, as LoadCheckpoint.
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 9);
  EXPECT_EQ(ReadCheckpoint(path).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadCheckpoint(path + ".missing").status().code(), absl::StatusCode::kNotFound);
  std::filesystem::remove(path);
}

TEST_P(EngineTest, ACorruptCheckpointIsDataLoss) {
  auto backend = NewBackend();
  ParameterSet params;
  Mlp::Create(params, "mlp", {3, 4, 2});
  params.Allocate(*backend, 1);
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

INSTANTIATE_TEST_SUITE_P(Devices, EngineTest, ::testing::Values(Device::kCpu, Device::kStrict), DeviceName);

}  // namespace
}  // namespace troupe::nn
