// The strict CPU device: its memory faults when the host touches it between
// backend calls (so a test on it proves the device-memory contract), it moves
// bytes only through Upload/Download, and a training step on it equals the
// plain CPU backend's bit for bit.
#include "engine/nn/strict_cpu_backend.h"

#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "engine/nn/cpu_backend.h"
#include "engine/nn/layers.h"
#include "engine/nn/ops.h"
#include "engine/nn/optimizer.h"
#include "gtest/gtest.h"

namespace troupe::nn {
namespace {

TEST(StrictCpuDeviceDeathTest, AHostWriteOrReadOfDeviceMemoryFaultsAtOnce) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        StrictCpuBackend device(/*num_threads=*/1);
        float* p = device.AllocateFloats(16);
        p[3] = 1.0f;  // a host write between kernels
      },
      "");
  EXPECT_DEATH(
      {
        StrictCpuBackend device(1);
        const float* p = device.AllocateFloats(16);
        volatile float read = p[0];  // a host read between kernels
        (void)read;
      },
      "");
}

TEST(StrictCpuDeviceDeathTest, AKernelGivenHostMemoryAbortsNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        StrictCpuBackend device(1);
        float* y = device.AllocateFloats(4);
        const std::vector<float> host(4, 1.0f);
        device.Axpy(1.0f, host.data(), y, 4);  // x is host memory
      },
      "Axpy was given host memory \\(pointer argument 1");
  EXPECT_DEATH(
      {
        StrictCpuBackend device(1);
        Tape tape(&device);
        const std::vector<float> host(4, 1.0f);
        (void)Relu(tape.Constant(host.data(), {4}));  // Constant takes device data; host data goes through Input
      },
      "Unary was given host memory");  // relu: the activations run as Unary
}

TEST(StrictCpuDeviceTest, BytesMoveThroughUploadAndDownloadAndKernelsSeeThem) {
  StrictCpuBackend device(1);
  float* x = device.AllocateFloats(4);
  float* y = device.AllocateFloats(4);
  EXPECT_TRUE(device.Owns(x) && device.Owns(y));
  const float in[4] = {1, 2, 3, 4};
  device.Upload(in, x, sizeof(in));
  device.Fill(y, 4, 0.5f);
  device.Axpy(2.0f, x, y, 4);
  float out[4] = {};
  device.Download(y, out, sizeof(out));
  EXPECT_EQ(std::vector<float>(out, out + 4), (std::vector<float>{2.5, 4.5, 6.5, 8.5}));
  // A freed block is reused for the next allocation of its size; a foreign
  // pointer is not the device's.
  device.Free(y);
  EXPECT_EQ(device.AllocateFloats(4), y);
  EXPECT_FALSE(device.Owns(in));
}

// A step touching every family of the engine's ops (conv with fused ReLU,
// batch norm, layer norm, concat, activations, softmax cross-entropy, MSE,
// sums; the agents' and the GAN's own ops are proven on this device by
// their tests, agents/augment_test.cc and gan/spectral_norm_test.cc), its
// gradients and an Adam update, `steps`
// times on `backend`, each one Backend step (on the strict device: no host
// round trip, the loss read at the step's end); returns the parameters and
// appends each step's loss.
std::vector<float> TrainSteps(Backend* backend, int steps, std::vector<float>* losses) {
  constexpr int kBatch = 6;
  ParameterSet params;
  const Conv2dLayer conv = Conv2dLayer::Create(params, "conv", 3, 4, 3, 1, 1);
  const int gamma = params.Add("bn.gamma", {4}, Init::Constant(1.0f));
  const int beta = params.Add("bn.beta", {4}, Init::Zeros());
  const int dense = params.Add("dense.w", {256, 8}, Init::FanIn(256));
  const LayerNormLayer norm = LayerNormLayer::Create(params, "norm", 8);
  const LinearLayer head = LinearLayer::Create(params, "head", 8 + 2, 5);
  params.Allocate(*backend, /*seed=*/3);
  // Batch norm's running statistics are the device's.
  DeviceBuffer running_mean(*backend, 4), running_var(*backend, 4);
  backend->Fill(running_mean.data(), 4, 0.0f);
  backend->Fill(running_var.data(), 4, 1.0f);
  std::mt19937_64 data_rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> images(kBatch * 3 * 8 * 8), extra(kBatch * 2), target(kBatch * 5);
  std::vector<int32_t> labels(kBatch);
  Tape tape(backend);
  Adam adam(&params, backend);
  for (int step = 0; step < steps; ++step) {
    for (float& x : images) x = normal(data_rng);
    for (float& x : extra) x = normal(data_rng);
    for (float& x : target) x = normal(data_rng);
    for (int i = 0; i < kBatch; ++i) labels[i] = (step + i) % 5;
    StepScope device_step(*backend);
    tape.Reset();
    params.ZeroGrad();
    Var x = tape.Input(images.data(), {kBatch, 3, 8, 8});
    Var h = conv(tape, params, x, FusedActivation::kRelu);
    h = BatchNorm(h, tape.Parameter(params, gamma), tape.Parameter(params, beta),
                  {running_mean.data(), running_var.data(), 0.1f}, /*training=*/true);
    Var features = Tanh(norm(tape, params, Linear(Flatten(h), tape.Parameter(params, dense), Var{})));
    const std::array<Var, 2> parts = {features, tape.Input(extra.data(), {kBatch, 2})};
    Var logits = head(tape, params, Concat(parts, /*axis=*/1));
    Var loss = Add(SoftmaxCrossEntropy(logits, labels), MeanSquaredError(logits, tape.Input(target.data(), {kBatch, 5})));
    loss = Add(loss, Scale(Sum(Mul(logits, logits)), 1e-3f));
    tape.Backward(loss);
    adam.Step(/*learning_rate=*/1e-2f);
    float step_loss = 0;
    backend->ReadAtStepEnd(tape.data(loss).data, &step_loss, sizeof(step_loss));
    device_step.End();
    losses->push_back(step_loss);
  }
  return params.DownloadValues();
}

TEST(StrictCpuDeviceTest, ATrainingStepEqualsTheCpuBackendsBitForBit) {
  // One thread each: with two, the CPU backend's dynamically shared
  // reductions (ParallelTasks) vary in the last bits from run to run.
  CpuBackend cpu(/*num_threads=*/1);
  StrictCpuBackend strict(/*num_threads=*/1);
  std::vector<float> cpu_losses, strict_losses;
  const std::vector<float> on_cpu = TrainSteps(&cpu, /*steps=*/4, &cpu_losses);
  const std::vector<float> on_strict = TrainSteps(&strict, 4, &strict_losses);
  ASSERT_EQ(on_cpu.size(), on_strict.size());
  EXPECT_EQ(0, std::memcmp(on_cpu.data(), on_strict.data(), sizeof(float) * on_cpu.size()))
      << "parameters differ after 4 steps";
  EXPECT_EQ(cpu_losses, strict_losses);
  for (float loss : cpu_losses) EXPECT_TRUE(std::isfinite(loss));
}

TEST(StrictCpuDeviceDeathTest, ADownloadInsideAStepAborts) {
  StrictCpuBackend device(1);
  float* x = device.AllocateFloats(4);
  device.Fill(x, 4, 1.0f);
  float host[4];
  EXPECT_DEATH(
      {
        device.BeginStep();
        device.Download(x, host, sizeof(host));
      },
      "Download of 16 bytes inside a step");
  // A tape's item() is such a download.
  EXPECT_DEATH(
      {
        Tape tape(&device);
        const Var v = tape.Constant(x, {1});
        device.BeginStep();
        tape.item(v);
      },
      "inside a step");
  EXPECT_DEATH(
      {
        device.BeginStep();
        device.BeginStep();
      },
      "steps do not nest");
}

TEST(StrictCpuDeviceTest, ReadsAskedForInAStepLandAtItsEndAndStagingIsAllowed) {
  StrictCpuBackend device(1);
  float* x = device.AllocateFloats(2);
  float at_end[2] = {-1, -1};
  {
    StepScope step(device);
    device.Fill(x, 2, 3.0f);
    device.ReadAtStepEnd(x, at_end, sizeof(at_end));
    device.Fill(x, 1, 5.0f);  // issued before the end: the read sees it
    EXPECT_EQ(at_end[0], -1.0f) << "a deferred read landed before the step's end";
    float staged[2];
    {
      const Backend::HostStaging staging(device);  // a collective's round trip
      device.Download(x, staged, sizeof(staged));
      device.Upload(staged, x, sizeof(staged));
    }
    EXPECT_EQ(staged[1], 3.0f);
  }
  EXPECT_EQ(at_end[0], 5.0f);
  EXPECT_EQ(at_end[1], 3.0f);
  // Outside a step a read is at once.
  float now = 0;
  device.ReadAtStepEnd(x + 1, &now, sizeof(now));
  EXPECT_EQ(now, 3.0f);
}

// Late reads on the strict device: a step's read lands only at its
// LandReads, after a second step wrote the same device memory and read it
// into the same host memory (the value read is the one at its own step's
// end, kept by the backend); each step's lands in turn, oldest first.
TEST(StrictCpuDeviceTest, LateReadsLandAtLandReadsWithTheirOwnStepsValues) {
  StrictCpuBackend device(/*num_threads=*/1);
  float* x = device.AllocateFloats(2);
  float out = -1;
  device.set_late_reads(true);
  uint64_t steps[2];
  for (int s = 0; s < 2; ++s) {
    {
      StepScope step(device);
      device.Fill(x, 2, 10.0f + static_cast<float>(s));
      device.ReadAtStepEnd(x + 1, &out, sizeof(out));
    }
    steps[s] = device.steps_begun();
  }
  device.set_late_reads(false);
  EXPECT_EQ(out, -1.0f) << "a late read landed at its step's end";
  EXPECT_EQ(device.steps_unlanded(), 2u);
  device.LandReads(steps[0]);
  EXPECT_EQ(out, 10.0f);
  EXPECT_EQ(device.steps_unlanded(), 1u);
  device.LandReads(steps[1]);
  EXPECT_EQ(out, 11.0f);
  EXPECT_EQ(device.steps_unlanded(), 0u);
  // Off again: at the step's end.
  {
    StepScope step(device);
    device.Fill(x, 2, 12.0f);
    device.ReadAtStepEnd(x, &out, sizeof(out));
  }
  EXPECT_EQ(out, 12.0f);
}

// LAMB and LARS keep their norms and trust ratios on the device: a step of
// each on the strict device makes no host round trip and moves the
// parameters as on the CPU backend.
TEST(StrictCpuDeviceTest, LambAndLarsStepsStayOnTheDeviceAndEqualTheCpu) {
  auto run = [](Backend* backend, bool lamb) {
    ParameterSet params;
    params.Add("w", {8, 4}, Init::FanIn(4));
    params.Add("b", {4}, Init::Zeros());
    params.Allocate(*backend, /*seed=*/5);
    std::unique_ptr<Optimizer> optimizer;
    if (lamb) {
      optimizer = std::make_unique<Lamb>(&params, backend, LambOptions{.weight_decay = 0.01f});
    } else {
      optimizer = std::make_unique<Lars>(&params, backend, LarsOptions{.weight_decay = 1e-4f});
    }
    std::vector<float> grads(params.total_floats());
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = std::sin(static_cast<float>(i));
    for (int step = 0; step < 3; ++step) {
      StepScope device_step(*backend);
      backend->Upload(grads.data(), params.device_grads(), sizeof(float) * grads.size());
      optimizer->Step(/*learning_rate=*/0.1f);
    }
    return params.DownloadValues();
  };
  for (bool lamb : {true, false}) {
    CpuBackend cpu(1);
    StrictCpuBackend strict(1);
    const std::vector<float> on_cpu = run(&cpu, lamb), on_strict = run(&strict, lamb);
    EXPECT_EQ(on_cpu, on_strict) << (lamb ? "LAMB" : "LARS");
    CpuBackend fresh(1);
    ParameterSet start;
    start.Add("w", {8, 4}, Init::FanIn(4));
    start.Add("b", {4}, Init::Zeros());
    start.Allocate(fresh, 5);
    EXPECT_NE(on_cpu, start.DownloadValues()) << "the optimizer did not move the parameters";
  }
}

}  // namespace
}  // namespace troupe::nn
