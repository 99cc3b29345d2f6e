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
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/nn/cpu_backend.h"
#include "engine/nn/op_testing.h"
#include "engine/nn/testing.h"
#include "gtest/gtest.h"

namespace troupe::nn {
namespace {

#ifdef TROUPE_CONFORMANCE_PJRT
// This binary (nn_ops_pjrt_test): the PJRT backend on the XLA CPU plugin the
// ctest fixture fetched, against the CPU backend; the finite-difference
// checks are nn_ops_test's.
void ExpectGradientsMatch(std::vector<Input> inputs, const BuildFn& build, double /*step*/ = kStep) {
  ExpectAgreesOnPjrt(inputs, build);
}
#else
void ExpectGradientsMatch(std::vector<Input> inputs, const BuildFn& build, double step = kStep) {
  ExpectBackendsConform(inputs, build);
  EXPECT_LE(GradientError(std::move(inputs), build, step, kRtol, kAtol), 1.0);
}
#endif

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

TEST(OpsGradientTest, SoftmaxAndLogSoftmax) {
  ExpectGradientsMatch({Random({3, 5}, 36)}, [](Tape&, std::vector<Var>& v) { return Softmax(Scale(v[0], 2.0f)); });
  ExpectGradientsMatch({Random({3, 5}, 37)}, [](Tape&, std::vector<Var>& v) { return LogSoftmax(Scale(v[0], 2.0f)); });
}

TEST(OpsGradientTest, SoftmaxCrossEntropy) {
  const std::vector<int32_t> labels = {0, 4, 2};
  ExpectGradientsMatch({Random({3, 5}, 38)},
                       [&](Tape&, std::vector<Var>& v) { return SoftmaxCrossEntropy(Scale(v[0], 3.0f), labels); });
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
  ExpectBackendsConform({}, [&](Tape& t, std::vector<Var>&) {
    return ImagesToFloat(t, big.data(), /*images=*/3, /*height=*/5, /*width=*/7, /*channels=*/3, 1.0f / 255.0f);
  });
}

#endif

}  // namespace
}  // namespace troupe::nn
