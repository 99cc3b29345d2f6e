// Every op: a finite-difference gradient check (central differences of a
// random projection of the op's output), plus forward references for the
// convolutions; and the conformance of every backend built into this binary
// against the CPU reference on the same op (ggml's test-backend-ops): the
// strict CPU device bit for bit, the composed kernels (CoreOnlyBackend:
// the core and nothing else) and CUDA where a GPU answers within a tolerance.
// Built a second time with TROUPE_CONFORMANCE_PJRT (nn_ops_pjrt_test, ctest
// -L pjrt): the same ops on the PJRT backend against the CPU.
#include "engine/nn/ops.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/engine_config.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/strict_cpu_backend.h"
#include "engine/nn/testing.h"
#include "gtest/gtest.h"

namespace troupe::nn {
namespace {

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
double Evaluate(Backend& backend, std::vector<Input>& inputs, const BuildFn& build,
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

#ifndef TROUPE_CONFORMANCE_PJRT  // nn_ops_pjrt_test compares backends only
// Largest violation of |analytic - numeric| <= atol + rtol * max(|a|, |n|), as
// a ratio (<= 1 passes), over every differentiated input element.
double GradientError(std::vector<Input> inputs, const BuildFn& build, double step, double rtol, double atol,
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
#endif

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
void ExpectAgreesWithin(Backend& backend, double rtol, const std::string& name, std::vector<Input>& inputs,
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

#ifdef TROUPE_CONFORMANCE_PJRT
// This binary (nn_ops_pjrt_test): the PJRT backend on the XLA CPU plugin the
// ctest fixture fetched, against the CPU backend (another summation order).
constexpr double kPjrtRtol = 1e-4;

void ExpectBackendsAgree(std::vector<Input> inputs, const BuildFn& build) {
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

// The finite-difference checks are nn_ops_test's; this binary compares backends.
void ExpectGradientsMatch(std::vector<Input> inputs, const BuildFn& build, double step = kStep) {
  ExpectBackendsAgree(std::move(inputs), build);
}
#else
// The op's value and input gradients on every other backend against the CPU
// reference (one thread each, so the reference is deterministic).
void ExpectBackendsAgree(std::vector<Input> inputs, const BuildFn& build) {
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

void ExpectGradientsMatch(std::vector<Input> inputs, const BuildFn& build, double step = kStep) {
  ExpectBackendsAgree(inputs, build);
  EXPECT_LE(GradientError(std::move(inputs), build, step, kRtol, kAtol), 1.0);
}
#endif

Input Random(Shape shape, uint64_t seed, float min_abs = 0.0f) {
  return {RandomVector(shape.size(), seed, -1.0f, 1.0f, min_abs), shape, true};
}

#ifndef TROUPE_CONFORMANCE_PJRT
TEST(GradientCheckTest, DetectsAGradientWithTheWrongSign) {
  // The harness itself must be able to fail.
  const double error = GradientError({Random({3, 4}, 1)}, [](Tape&, std::vector<Var>& v) { return Tanh(v[0]); },
                                     kStep, kRtol, kAtol, /*flip_sign_of_analytic=*/true);
  EXPECT_GT(error, 10.0);
}

#endif

TEST(OpsGradientTest, Linear) {
  ExpectGradientsMatch({Random({3, 5}, 1), Random({5, 4}, 2), Random({4}, 3)},
                       [](Tape&, std::vector<Var>& v) { return Linear(v[0], v[1], v[2]); });
}

TEST(OpsGradientTest, MatMul) {
  ExpectGradientsMatch({Random({2, 3}, 1), Random({3, 6}, 2)},
                       [](Tape&, std::vector<Var>& v) { return MatMul(v[0], v[1]); });
}

TEST(OpsGradientTest, Conv2dStride1Pad1) {
  ExpectGradientsMatch({Random({2, 3, 5, 5}, 1), Random({4, 3, 3, 3}, 2), Random({4}, 3)},
                       [](Tape&, std::vector<Var>& v) { return Conv2d(v[0], v[1], v[2], /*stride=*/1, /*pad=*/1); });
}

TEST(OpsGradientTest, Conv2dStride2NoPad) {
  ExpectGradientsMatch({Random({2, 2, 7, 6}, 4), Random({3, 2, 3, 3}, 5), Random({3}, 6)},
                       [](Tape&, std::vector<Var>& v) { return Conv2d(v[0], v[1], v[2], /*stride=*/2, /*pad=*/0); });
}

TEST(OpsGradientTest, Conv2dStride1NoPadFullPadAndWideKernel) {
  // Stride 1 takes the path where dx is itself a convolution of dy.
  for (auto [kernel, pad] : {std::pair{3, 0}, std::pair{3, 2}, std::pair{5, 1}}) {
    SCOPED_TRACE(::testing::Message() << "kernel " << kernel << " pad " << pad);
    ExpectGradientsMatch({Random({2, 3, 7, 6}, 7), Random({4, 3, kernel, kernel}, 8), Random({4}, 9)},
                         [pad](Tape&, std::vector<Var>& v) { return Conv2d(v[0], v[1], v[2], /*stride=*/1, pad); });
  }
}

TEST(OpsGradientTest, Conv2dNonSquareKernel) {
  ExpectGradientsMatch({Random({2, 2, 6, 7}, 10), Random({3, 2, 2, 3}, 11), Random({3}, 12)},
                       [](Tape&, std::vector<Var>& v) { return Conv2d(v[0], v[1], v[2], /*stride=*/1, /*pad=*/1); });
}

#ifndef TROUPE_CONFORMANCE_PJRT
TEST(FusedActivationTest, Conv2dReluEqualsReluOfConv2dInValueAndGradient) {
  // The fused kernel against the two-op composition, value and every
  // gradient, for each dx path (stride 1 and 2) and with two threads.
  CpuBackend backend(/*num_threads=*/2);
  for (auto [stride, pad] : {std::pair{1, 0}, std::pair{1, 1}, std::pair{2, 0}}) {
    SCOPED_TRACE(::testing::Message() << "stride " << stride << " pad " << pad);
    std::vector<Input> inputs = {Random({3, 4, 9, 8}, 13), Random({5, 4, 3, 3}, 14), Random({5}, 15)};
    std::vector<std::vector<float>> fused_grads, composed_grads;
    const double fused = Evaluate(backend, inputs, [=](Tape&, std::vector<Var>& v) {
      return Conv2d(v[0], v[1], v[2], stride, pad, FusedActivation::kRelu);
    }, &fused_grads);
    const double composed = Evaluate(backend, inputs, [=](Tape&, std::vector<Var>& v) {
      return Relu(Conv2d(v[0], v[1], v[2], stride, pad));
    }, &composed_grads);
    EXPECT_NEAR(fused, composed, 1e-4 * std::fabs(composed));
    ASSERT_EQ(fused_grads.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      ASSERT_EQ(fused_grads[i].size(), composed_grads[i].size());
      for (size_t k = 0; k < fused_grads[i].size(); ++k) {
        ASSERT_NEAR(fused_grads[i][k], composed_grads[i][k], 1e-4) << "input " << i << " element " << k;
      }
    }
    // And the ReLU did something: some outputs were clipped.
    std::vector<std::vector<float>> none_grads;
    Evaluate(backend, inputs, [=](Tape&, std::vector<Var>& v) { return Conv2d(v[0], v[1], v[2], stride, pad); },
             &none_grads);
    EXPECT_NE(none_grads[1], fused_grads[1]);
  }
}

#endif

TEST(OpsGradientTest, ConvTranspose2dStride2) {
  ExpectGradientsMatch({Random({2, 3, 3, 3}, 7), Random({3, 2, 4, 4}, 8), Random({2}, 9)},
                       [](Tape&, std::vector<Var>& v) {
                         return ConvTranspose2d(v[0], v[1], v[2], /*stride=*/2, /*pad=*/1, /*output_pad=*/0);
                       });
}

TEST(OpsGradientTest, ConvTranspose2dOutputPad) {
  ExpectGradientsMatch({Random({1, 2, 3, 4}, 10), Random({2, 3, 3, 3}, 11), Random({3}, 12)},
                       [](Tape&, std::vector<Var>& v) {
                         return ConvTranspose2d(v[0], v[1], v[2], /*stride=*/2, /*pad=*/1, /*output_pad=*/1);
                       });
}

TEST(OpsGradientTest, Activations) {
  // Inputs kept away from the kinks at 0.
  const std::vector<std::pair<const char*, std::function<Var(Var)>>> cases = {
      {"relu", [](Var x) { return Relu(x); }},
      {"leaky_relu", [](Var x) { return LeakyRelu(x, 0.2f); }},
      {"elu", [](Var x) { return Elu(x, 1.0f); }},
      {"tanh", [](Var x) { return Tanh(x); }},
      {"sigmoid", [](Var x) { return Sigmoid(x); }},
      {"softplus", [](Var x) { return Softplus(x); }},
  };
  for (const auto& [name, f] : cases) {
    SCOPED_TRACE(name);
    ExpectGradientsMatch({Random({4, 5}, 13, /*min_abs=*/0.05f)}, [&f](Tape&, std::vector<Var>& v) { return f(v[0]); });
  }
}

TEST(OpsGradientTest, AddSubMulScale) {
  ExpectGradientsMatch({Random({3, 4}, 14), Random({3, 4}, 15)}, [](Tape&, std::vector<Var>& v) {
    return Scale(Mul(Sub(v[0], v[1]), Add(v[0], v[1])), 1.5f);
  });
}

TEST(OpsGradientTest, ExpSquareAndClamp) {
  // Clamp's inputs kept away from its bounds (+-0.5), where it has kinks.
  ExpectGradientsMatch({Random({3, 4}, 40)}, [](Tape&, std::vector<Var>& v) {
    const Var parts[] = {Exp(v[0]), Square(v[0]), Clamp(Scale(v[0], 2.0f), -0.5f, 0.5f)};
    return Concat(parts, 0);
  });
}

TEST(OpsGradientTest, MinimumRoutesTheGradientToTheSmaller) {
  ExpectGradientsMatch({Random({4, 5}, 41), Random({4, 5}, 42)},
                       [](Tape&, std::vector<Var>& v) { return Minimum(v[0], v[1]); });
}

#ifndef TROUPE_CONFORMANCE_PJRT
TEST(OpsGradientTest, MinimumOfEqualValuesPassesTheGradientOnce) {
  // PPO's clipped objective ties whenever the ratio is inside the clip
  // range: the gradient must reach one side, not both and not neither.
  CpuBackend cpu(1);
  Tape t(&cpu);
  const std::vector<float> host = {0.5f, -1.0f, 2.0f};
  DeviceBuffer a(cpu, 3), b(cpu, 3);
  a.Upload(host);
  b.Upload(host);
  Var x = t.Leaf(a.data(), {3}), y = t.Leaf(b.data(), {3});
  t.Backward(Sum(Minimum(x, y)));
  std::vector<float> dx(3), dy(3);
  cpu.Download(t.grad(x).data, dx.data(), 3 * sizeof(float));
  cpu.Download(t.grad(y).data, dy.data(), 3 * sizeof(float));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(dx[i] + dy[i], 1.0f) << i;
}
#endif

TEST(OpsGradientTest, MulOfAValueWithItself) {
  ExpectGradientsMatch({Random({5}, 16)}, [](Tape&, std::vector<Var>& v) { return Mul(v[0], v[0]); });
}

TEST(OpsGradientTest, SumMeanAndSumAxis) {
  ExpectGradientsMatch({Random({2, 3, 4}, 17)}, [](Tape&, std::vector<Var>& v) {
    const Var parts[] = {Scale(SumAxis(SumAxis(v[0], 1), 1), 0.5f), Reshape(Add(Sum(v[0]), Mean(v[0])), {1})};
    return Concat(parts, 0);
  });
  ExpectGradientsMatch({Random({2, 3, 4}, 18)}, [](Tape&, std::vector<Var>& v) { return SumAxis(v[0], 2); });
}

TEST(OpsGradientTest, MeanSquaredError) {
  ExpectGradientsMatch({Random({4, 3}, 19), Random({4, 3}, 20)},
                       [](Tape&, std::vector<Var>& v) { return MeanSquaredError(v[0], v[1]); });
}

TEST(OpsGradientTest, ReshapeFlattenConcatSlice) {
  ExpectGradientsMatch({Random({2, 3, 2, 2}, 21), Random({2, 5}, 22)}, [](Tape&, std::vector<Var>& v) {
    Var flat = Flatten(v[0]);                             // [2, 12]
    const Var parts[] = {Slice(flat, 1, 2, 9), v[1], v[1]};  // shared input twice
    return Tanh(Concat(parts, 1));                        // [2, 17]
  });
  ExpectGradientsMatch({Random({3, 2, 2}, 23)}, [](Tape&, std::vector<Var>& v) {
    const Var parts[] = {Slice(v[0], 0, 1, 3), v[0]};
    return Reshape(Concat(parts, 0), {5, 4});
  });
}

TEST(OpsGradientTest, LayerNorm) {
  ExpectGradientsMatch({Random({3, 6}, 24), Random({6}, 25), Random({6}, 26)},
                       [](Tape&, std::vector<Var>& v) { return LayerNorm(v[0], v[1], v[2]); });
}

TEST(OpsGradientTest, BatchNormTraining) {
  ExpectGradientsMatch({Random({4, 3, 2, 2}, 27), Random({3}, 28), Random({3}, 29)}, [](Tape&, std::vector<Var>& v) {
    return BatchNorm(v[0], v[1], v[2], BatchNormState{}, /*training=*/true);
  });
  ExpectGradientsMatch({Random({5, 4}, 30), Random({4}, 31), Random({4}, 32)}, [](Tape&, std::vector<Var>& v) {
    return BatchNorm(v[0], v[1], v[2], BatchNormState{}, /*training=*/true);
  });
}

TEST(OpsGradientTest, SpectralNormWithFixedPowerIterationVectors) {
  // u, v converged first, then held fixed (iterations = 0) as in training's
  // backward, so finite differences see the same function.
  std::vector<float> u = RandomVector(3, 33), v = RandomVector(8, 34);
  {
    CpuBackend backend(1);
    std::vector<float> w = RandomVector(24, 35);
    backend.SpectralNormPowerIteration(3, 8, w.data(), u.data(), v.data(), /*iterations=*/30);
  }
  Input w{RandomVector(24, 35), Shape{3, 2, 2, 2}, true};
  ExpectGradientsMatch({w}, [&](Tape& t, std::vector<Var>& in) {
    // u and v in the backend's memory, as a ParameterSet keeps them.
    return SpectralNorm(in[0], t.data(t.Input(u.data(), {3})).data, t.data(t.Input(v.data(), {8})).data,
                        /*iterations=*/0);
  }, /*step=*/1e-3);
}

TEST(OpsGradientTest, SoftmaxAndLogSoftmax) {
  ExpectGradientsMatch({Random({3, 5}, 36)}, [](Tape&, std::vector<Var>& v) { return Softmax(Scale(v[0], 2.0f)); });
  ExpectGradientsMatch({Random({3, 5}, 37)}, [](Tape&, std::vector<Var>& v) { return LogSoftmax(Scale(v[0], 2.0f)); });
}

TEST(OpsGradientTest, SoftmaxCrossEntropy) {
  const std::vector<int32_t> labels = {0, 4, 2};
  ExpectGradientsMatch({Random({3, 5}, 38)},
                       [&](Tape&, std::vector<Var>& v) { return SoftmaxCrossEntropy(Scale(v[0], 3.0f), labels); });
}

TEST(OpsGradientTest, RandomShiftWithFixedSeed) {
  ExpectGradientsMatch({Random({2, 2, 5, 6}, 39)}, [](Tape&, std::vector<Var>& v) {
    std::mt19937_64 rng(/*seed=*/5);  // same shifts on every evaluation
    return RandomShift(v[0], /*pad=*/2, rng);
  });
}

#ifndef TROUPE_CONFORMANCE_PJRT
// --- Forward references ------------------------------------------------------

std::vector<float> NaiveConv(const ConvGeometry& g, const std::vector<float>& x, const std::vector<float>& w,
                             const std::vector<float>& b) {
  std::vector<float> y(g.n * g.oc * g.oh() * g.ow());
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t o = 0; o < g.oc; ++o)
      for (int64_t i = 0; i < g.oh(); ++i)
        for (int64_t j = 0; j < g.ow(); ++j) {
          double s = b[o];
          for (int64_t c = 0; c < g.c; ++c)
            for (int64_t ki = 0; ki < g.kh; ++ki)
              for (int64_t kj = 0; kj < g.kw; ++kj) {
                const int64_t yy = i * g.stride - g.pad + ki, xx = j * g.stride - g.pad + kj;
                if (yy < 0 || yy >= g.h || xx < 0 || xx >= g.w) continue;
                s += x[((n * g.c + c) * g.h + yy) * g.w + xx] * w[((o * g.c + c) * g.kh + ki) * g.kw + kj];
              }
          y[((n * g.oc + o) * g.oh() + i) * g.ow() + j] = static_cast<float>(s);
        }
  return y;
}

// The backend's forward against NaiveConv on one [n, c, h, w] geometry.
void ExpectConvMatchesDirectLoops(CpuBackend& backend, ConvGeometry g) {
  SCOPED_TRACE(::testing::Message() << g.h << "x" << g.w << " stride " << g.stride << " pad " << g.pad);
  auto x = RandomVector(g.n * g.c * g.h * g.w, 40), w = RandomVector(g.oc * g.c * g.kh * g.kw, 41);
  auto b = RandomVector(g.oc, 42);
  std::vector<float> y(g.n * g.oc * g.oh() * g.ow());
  backend.Conv2dForward(g, FusedActivation::kNone, x.data(), w.data(), b.data(), y.data());
  const auto want = NaiveConv(g, x, w, b);
  for (size_t k = 0; k < y.size(); ++k) ASSERT_NEAR(y[k], want[k], 1e-4) << "at " << k;
}

TEST(ConvForwardTest, MatchesDirectLoopsAcrossStridesAndPads) {
  CpuBackend backend(/*num_threads=*/2);
  for (int64_t stride : {1, 2, 3}) {
    for (int64_t pad : {0, 1, 2}) {
      ExpectConvMatchesDirectLoops(
          backend, {.n = 3, .c = 2, .h = 9, .w = 8, .oc = 4, .kh = 3, .kw = 3, .stride = stride, .pad = pad});
    }
  }
}

TEST(ConvForwardTest, MatchesDirectLoopsOnImagesOfSeveralBlocks) {
  // Large enough that the kernels work in several blocks of output rows,
  // the last one partial.
  CpuBackend backend(/*num_threads=*/2);
  for (int64_t stride : {1, 2}) {
    ExpectConvMatchesDirectLoops(
        backend, {.n = 2, .c = 3, .h = 61, .w = 57, .oc = 4, .kh = 3, .kw = 3, .stride = stride, .pad = 1});
  }
}

TEST(ConvBackwardTest, GradientsSatisfyTheAdjointIdentitiesOnImagesOfSeveralBlocks) {
  // conv is linear in x and in w, so with dy = z: <dx, x> = <dw, w> =
  // <conv(x, w), z> (no bias), exactly; this checks both dx paths and dw
  // over several row blocks, with gradients accumulated onto zeros.
  CpuBackend backend(/*num_threads=*/2);
  for (auto [stride, pad] : {std::pair{1, 0}, std::pair{1, 1}, std::pair{2, 0}}) {
    SCOPED_TRACE(::testing::Message() << "stride " << stride << " pad " << pad);
    ConvGeometry g;
    g.n = 2, g.c = 3, g.h = 61, g.w = 57, g.oc = 4, g.kh = 3, g.kw = 3, g.stride = stride, g.pad = pad;
    auto x = RandomVector(g.n * g.c * g.h * g.w, 49), w = RandomVector(g.oc * g.c * 9, 50);
    auto z = RandomVector(g.n * g.oc * g.oh() * g.ow(), 51);
    std::vector<float> y(z.size()), dx(x.size(), 0.0f), dw(w.size(), 0.0f);
    backend.Conv2dForward(g, FusedActivation::kNone, x.data(), w.data(), nullptr, y.data());
    backend.Conv2dBackward(g, FusedActivation::kNone, x.data(), w.data(), y.data(), z.data(), dx.data(), dw.data(),
                           nullptr);
    double yz = 0, dxx = 0, dww = 0;
    for (size_t k = 0; k < y.size(); ++k) yz += double(y[k]) * z[k];
    for (size_t k = 0; k < x.size(); ++k) dxx += double(dx[k]) * x[k];
    for (size_t k = 0; k < w.size(); ++k) dww += double(dw[k]) * w[k];
    EXPECT_NEAR(dxx, yz, 1e-4 * std::fabs(yz) + 1e-3);
    EXPECT_NEAR(dww, yz, 1e-4 * std::fabs(yz) + 1e-3);
  }
}

TEST(ConvForwardTest, TransposedConvIsTheAdjointOfConv) {
  // <conv(x), z> == <x, conv_transpose(z)> for every x, z (no bias).
  CpuBackend backend(/*num_threads=*/2);
  ConvGeometry g;
  g.n = 2, g.c = 3, g.h = 7, g.w = 7, g.oc = 4, g.kh = 4, g.kw = 4, g.stride = 2, g.pad = 1;
  auto x = RandomVector(g.n * g.c * g.h * g.w, 43), w = RandomVector(g.oc * g.c * 16, 44);
  auto z = RandomVector(g.n * g.oc * g.oh() * g.ow(), 45);
  std::vector<float> y(z.size()), xt(x.size());
  backend.Conv2dForward(g, FusedActivation::kNone, x.data(), w.data(), nullptr, y.data());
  backend.ConvTranspose2dForward(g, z.data(), w.data(), nullptr, xt.data());
  double lhs = 0, rhs = 0;
  for (size_t k = 0; k < y.size(); ++k) lhs += y[k] * z[k];
  for (size_t k = 0; k < x.size(); ++k) rhs += x[k] * xt[k];
  EXPECT_NEAR(lhs, rhs, 1e-3 * std::fabs(lhs) + 1e-4);
}

TEST(GemmTest, AllTransposeCasesMatchNaiveProductOnOneAndTwoThreads) {
  for (int threads : {1, 2}) {
    CpuBackend backend(threads);
    const int64_t m = 70, n = 90, k = 300;  // big enough to be split across threads
    auto a = RandomVector(m * k, 46), b = RandomVector(k * n, 47);
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        std::vector<float> c(m * n, 1.0f);
        backend.Gemm(ta, tb, m, n, k, /*alpha=*/2.0f, a.data(), b.data(), /*beta=*/0.5f, c.data());
        for (int64_t i = 0; i < m; i += 7) {
          for (int64_t j = 0; j < n; j += 5) {
            double s = 0;
            for (int64_t q = 0; q < k; ++q) s += a[ta ? q * m + i : i * k + q] * b[tb ? j * k + q : q * n + j];
            ASSERT_NEAR(c[i * n + j], 2.0 * s + 0.5, 1e-3) << "ta " << ta << " tb " << tb << " threads " << threads;
          }
        }
      }
    }
  }
}

TEST(ActivationForwardTest, MatchesFormulas) {
  CpuBackend backend(1);
  const std::vector<float> x = {-2.0f, -0.5f, 0.5f, 3.0f};
  std::vector<float> y(4);
  backend.ActivationForward(Activation::kLeakyRelu, 0.1f, x.data(), y.data(), 4);
  EXPECT_FLOAT_EQ(y[0], -0.2f);
  EXPECT_FLOAT_EQ(y[3], 3.0f);
  backend.ActivationForward(Activation::kElu, 1.0f, x.data(), y.data(), 4);
  EXPECT_NEAR(y[0], std::exp(-2.0) - 1.0, 1e-6);
  backend.ActivationForward(Activation::kSoftplus, 0.0f, x.data(), y.data(), 4);
  EXPECT_NEAR(y[3], std::log1p(std::exp(3.0)), 1e-6);
}

// uint8 interleaved images to scaled float planes: the layout by hand on the
// CPU, and every backend against it (no gradient: an input op).
TEST(ImagesToFloatTest, InterleavedBytesBecomeScaledPlanesOnEveryBackend) {
  // Two 1x2 RGB images: pixel p of image i has channels (10i + p, 100 + p, 200 + i).
  const std::vector<uint8_t> bytes = {0, 100, 200, 1, 101, 200, 10, 100, 201, 11, 101, 201};
  CpuBackend cpu(1);
  Tape tape(&cpu);
  const Var y = ImagesToFloat(tape, bytes.data(), /*images=*/2, /*height=*/1, /*width=*/2, /*channels=*/3, 0.5f);
  EXPECT_EQ(tape.value(y).shape, (Shape{2, 3, 1, 2}));
  const std::vector<float> want = {0, 0.5, 50, 50.5, 100, 100, 5, 5.5, 50, 50.5, 100.5, 100.5};
  EXPECT_EQ(std::vector<float>(tape.data(y).data, tape.data(y).data + 12), want);
  std::vector<uint8_t> big(3 * 5 * 7 * 3);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 37 % 256);
  ExpectBackendsAgree({}, [&](Tape& t, std::vector<Var>&) {
    return ImagesToFloat(t, big.data(), /*images=*/3, /*height=*/5, /*width=*/7, /*channels=*/3, 1.0f / 255.0f);
  });
}

TEST(RandomShiftTest, ShiftOfPadIsIdentityAndShiftsReplicateTheBorder) {
  CpuBackend backend(1);
  std::vector<float> x(16);
  for (int i = 0; i < 16; ++i) x[i] = static_cast<float>(i);
  std::vector<float> y(16);
  const int32_t identity[2] = {4, 4};  // offset pad = no shift
  backend.RandomShiftForward(1, 1, 4, 4, /*pad=*/4, identity, x.data(), y.data());
  EXPECT_EQ(y, x);
  const int32_t up_left[2] = {0, 0};  // shifted by -4: every pixel is the top-left one
  backend.RandomShiftForward(1, 1, 4, 4, /*pad=*/4, up_left, x.data(), y.data());
  for (float v : y) EXPECT_EQ(v, 0.0f);
}

#endif

}  // namespace
}  // namespace troupe::nn
