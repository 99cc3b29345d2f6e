// The op conformance harness of the engine's ops and of the ops the layers
// above own (agents/augment.h, gan/spectral_norm.h): an op built on a tape
// from inputs, its loss and input gradients on every backend against the
// CPU reference (ggml's test-backend-ops), and a finite-difference gradient
// check. Test-only.
#ifndef TROUPE_ENGINE_NN_OP_TESTING_H_
#define TROUPE_ENGINE_NN_OP_TESTING_H_

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine_config.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/ops.h"
#include "engine/nn/strict_cpu_backend.h"
#include "engine/nn/tape.h"
#include "engine/nn/testing.h"
#include "gtest/gtest.h"

namespace troupe::nn {

using BuildFn = std::function<Var(Tape&, std::vector<Var>&)>;

struct Input {
  std::vector<float> data;
  Shape shape;
  bool differentiate = true;
};

// loss = sum(op(inputs) * r) for a fixed random r (so every output element
// matters with a different weight). Returns the loss; with grads != null runs
// backward and fills grads[i] for differentiated inputs.
// Inputs are uploaded to the backend's memory first; values and gradients
// come back with Download.
inline double Evaluate(Backend& backend, std::vector<Input>& inputs, const BuildFn& build,
                std::vector<std::vector<float>>* grads) {
  Tape tape(&backend);
  std::vector<Var> vars;
  for (auto& in : inputs) {
    float* data = tape.AllocateFloats(in.shape.size());
    backend.Upload(in.data.data(), data, sizeof(float) * in.shape.size());
    vars.push_back(in.differentiate ? tape.Leaf(data, in.shape) : tape.Constant(data, in.shape));
  }
  Var y = build(tape, vars);
  const std::vector<float> r = RandomVector(tape.value(y).shape.size(), /*seed=*/99);
  Var rv = tape.Input(r.data(), tape.value(y).shape);
  Var loss = Sum(Mul(y, rv));
  const double value = tape.item(loss);
  if (grads != nullptr) {
    tape.Backward(loss);
    grads->clear();
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::vector<float> g;
      if (inputs[i].differentiate) {
        g.resize(inputs[i].shape.size());
        backend.Download(tape.grad(vars[i]).data, g.data(), sizeof(float) * g.size());
      }
      grads->push_back(std::move(g));
    }
  }
  return value;
}

// Largest violation of |analytic - numeric| <= atol + rtol * max(|a|, |n|), as
// a ratio (<= 1 passes), over every differentiated input element.
inline double GradientError(std::vector<Input> inputs, const BuildFn& build, double step, double rtol, double atol,
                     bool flip_sign_of_analytic = false) {
  CpuBackend backend(/*num_threads=*/2);
  std::vector<std::vector<float>> analytic;
  Evaluate(backend, inputs, build, &analytic);
  double worst = 0.0;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].differentiate) continue;
    for (size_t k = 0; k < inputs[i].data.size(); ++k) {
      const float saved = inputs[i].data[k];
      inputs[i].data[k] = saved + static_cast<float>(step);
      const double plus = Evaluate(backend, inputs, build, nullptr);
      inputs[i].data[k] = saved - static_cast<float>(step);
      const double minus = Evaluate(backend, inputs, build, nullptr);
      inputs[i].data[k] = saved;
      const double numeric = (plus - minus) / (2.0 * step);
      const double a = flip_sign_of_analytic ? -analytic[i][k] : analytic[i][k];
      const double bound = atol + rtol * std::max(std::fabs(a), std::fabs(numeric));
      worst = std::max(worst, std::fabs(a - numeric) / bound);
    }
  }
  return worst;
}

constexpr double kStep = 1e-2;
constexpr double kRtol = 2e-2;
constexpr double kAtol = 2e-3;

// CUDA against the CPU, per precision: float32 with another summation order;
// bfloat16 matmul/conv inputs (8-bit mantissa, float32 accumulation).
constexpr double kCudaRtol = 1e-3;
constexpr double kCudaBfloat16Rtol = 5e-2;
// The composed kernels against the CPU's fused ones: the same float32 math
// in another order.
constexpr double kComposedRtol = 1e-4;

// `backend`'s value and input gradients against the CPU's (`want_value`, `want`).
inline void ExpectAgreesWithin(Backend& backend, double rtol, const std::string& name, std::vector<Input>& inputs,
                        const BuildFn& build, double want_value, const std::vector<std::vector<float>>& want) {
  std::vector<std::vector<float>> got;
  const double value = Evaluate(backend, inputs, build, &got);
  EXPECT_NEAR(value, want_value, rtol * (1 + std::fabs(want_value))) << name;
  ASSERT_EQ(got.size(), want.size()) << name;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size());
    for (size_t k = 0; k < want[i].size(); ++k) {
      EXPECT_NEAR(got[i][k], want[i][k], rtol * (1 + std::fabs(want[i][k]))) << name << " input " << i << "[" << k << "]";
    }
  }
}

constexpr double kPjrtRtol = 1e-4;

// The op on the PJRT backend (the XLA CPU plugin at TROUPE_PJRT_PLUGIN, which
// ctest's fixture fetches) against the CPU backend: another summation order.
inline void ExpectAgreesOnPjrt(std::vector<Input> inputs, const BuildFn& build) {
  const char* plugin = std::getenv("TROUPE_PJRT_PLUGIN");
  if (plugin == nullptr || !std::filesystem::exists(plugin)) {
    GTEST_SKIP() << "no PJRT plugin at TROUPE_PJRT_PLUGIN (tools/pjrt_cpu_plugin.sh fetches one from PyPI)";
  }
  CpuBackend reference(/*num_threads=*/1);
  std::vector<std::vector<float>> want;
  const double want_value = Evaluate(reference, inputs, build, &want);
  config::EngineConfig pjrt;
  pjrt.set_device(config::EngineConfig::PJRT);
  pjrt.set_pjrt_plugin(plugin);
  auto backend = engine::MakeBackend(pjrt, /*local_index=*/0, /*threads=*/1);
  ASSERT_TRUE(backend.ok()) << backend.status();
  ExpectAgreesWithin(**backend, kPjrtRtol, "PJRT", inputs, build, want_value, want);
}

// The op's value and input gradients on every other backend against the CPU
// reference (one thread each, so the reference is deterministic).
inline void ExpectBackendsConform(std::vector<Input> inputs, const BuildFn& build) {
  CpuBackend reference(/*num_threads=*/1);
  std::vector<std::vector<float>> want, got;
  const double want_value = Evaluate(reference, inputs, build, &want);
  StrictCpuBackend strict(/*num_threads=*/1);
  const double strict_value = Evaluate(strict, inputs, build, &got);
  EXPECT_EQ(strict_value, want_value) << "strict CPU device";
  EXPECT_EQ(got, want) << "strict CPU device gradients";
  // The composed kernels (a backend of the core only) within float tolerance.
  CoreOnlyBackend core(/*num_threads=*/1);
  ExpectAgreesWithin(core, kComposedRtol, "composed kernels (core-only backend)", inputs, build, want_value, want);
  config::EngineConfig cuda;
  cuda.set_device(config::EngineConfig::CUDA);
  if (!engine::CheckDeviceAvailable(cuda, "test").ok()) return;  // no GPU here (or not built)
  for (const auto& [precision, rtol] : {std::pair{config::EngineConfig::FLOAT32, kCudaRtol},
                                        std::pair{config::EngineConfig::BFLOAT16, kCudaBfloat16Rtol}}) {
    cuda.set_precision(precision);
    auto gpu = engine::MakeBackend(cuda, /*local_index=*/0, /*threads=*/1);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    ExpectAgreesWithin(**gpu, rtol, absl::StrCat("CUDA ", config::EngineConfig::Precision_Name(precision)), inputs,
                       build, want_value, want);
  }
}

inline Input Random(Shape shape, uint64_t seed, float min_abs = 0.0f) {
  return {RandomVector(shape.size(), seed, -1.0f, 1.0f, min_abs), shape, true};
}

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_OP_TESTING_H_
