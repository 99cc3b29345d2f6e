// Spectral norm (gan/spectral_norm.h), the GAN's own op: the CPU's host
// loops against the composed forms (CoreOnlyBackend: the core and nothing
// else), the op's value and gradient on the strict device and by finite
// differences with the power-iteration vectors held, and on the PJRT CPU
// plugin against the CPU.
#include <cstdint>
#include <vector>

#include "engine/nn/cpu_backend.h"
#include "engine/nn/kernel_testing.h"
#include "engine/nn/op_testing.h"
#include "engine/nn/testing.h"
#include "gan/spectral_norm.h"
#include "gtest/gtest.h"
#ifdef TROUPE_HAVE_PJRT
#include "engine/pjrt/pjrt_testing.h"
#endif

namespace troupe::gan {
namespace {

using nn::Backend;
using nn::RandomVector;

TEST(SpectralNormTest, ComposedEqualsTheHostLoop) {
  const int64_t rows = 5, cols = 8;
  nn::ExpectComposedMatchesFused(
      "SpectralNorm",
      {RandomVector(rows * cols, 1), RandomVector(rows, 2), RandomVector(cols, 3), std::vector<float>(rows * cols),
       {0.0f}, RandomVector(rows * cols, 4), RandomVector(rows * cols, 5)},
      [&](Backend& b, const std::vector<float*>& p) {
        SpectralNormPowerIteration(b, rows, cols, p[0], p[1], p[2], 3);
        SpectralNormForward(b, rows, cols, p[0], p[1], p[2], p[3], p[4]);
        SpectralNormBackward(b, rows, cols, p[0], p[1], p[2], p[4], p[5], p[6]);
      },
      1e-4);
}

// u, v converged first, then held fixed (iterations = 0) as in training's
// backward, so finite differences see the same function.
struct HeldPowerVectors {
  HeldPowerVectors() {
    nn::CpuBackend backend(1);
    std::vector<float> w = RandomVector(24, 35);
    SpectralNormPowerIteration(backend, 3, 8, w.data(), u.data(), v.data(), /*iterations=*/30);
  }
  nn::Var operator()(nn::Tape& t, std::vector<nn::Var>& in) const {
    // u and v in the backend's memory, as a ParameterSet keeps them.
    return SpectralNorm(in[0], t.data(t.Input(u.data(), {3})).data, t.data(t.Input(v.data(), {8})).data,
                        /*iterations=*/0);
  }
  std::vector<float> u = RandomVector(3, 33), v = RandomVector(8, 34);
};

TEST(SpectralNormTest, TheOpOnEveryBackendAndItsGradientOnTheStrictDevice) {
  const HeldPowerVectors op;
  const nn::Input w{RandomVector(24, 35), nn::Shape{3, 2, 2, 2}, true};
  nn::ExpectBackendsConform({w}, op);
  EXPECT_LE(nn::GradientError({w}, op, /*step=*/1e-3, nn::kRtol, nn::kAtol), 1.0);
}

#ifdef TROUPE_HAVE_PJRT
class PjrtSpectralNormTest : public pjrt::PjrtKernelTest {};

TEST_F(PjrtSpectralNormTest, ThePowerIterationConvergesAsOnTheCpu) {
  const int64_t rows = 4, cols = 6;
  Pair w = Put(RandomVector(rows * cols, 16)), u = Put(RandomVector(rows, 17)), v = Put(std::vector<float>(cols));
  SpectralNormPowerIteration(cpu_, rows, cols, w.cpu, u.cpu, v.cpu, 5);
  SpectralNormPowerIteration(*pjrt_, rows, cols, w.pjrt, u.pjrt, v.pjrt, 5);
  ExpectSame(u, rows, 1e-5, "u");
  ExpectSame(v, cols, 1e-5, "v");
  Pair y = Put(std::vector<float>(rows * cols)), sigma = Put({0.0f});
  SpectralNormForward(*pjrt_, rows, cols, w.pjrt, u.pjrt, v.pjrt, y.pjrt, sigma.pjrt);
  SpectralNormForward(cpu_, rows, cols, w.cpu, u.cpu, v.cpu, y.cpu, sigma.cpu);
  ExpectSame(sigma, 1, 1e-5, "sigma");
  ExpectSame(y, rows * cols, 1e-5, "w / sigma");
}

TEST(PjrtSpectralNormOpTest, TheOpAndItsGradientEqualTheCpu) {
  nn::ExpectAgreesOnPjrt({{RandomVector(24, 35), nn::Shape{3, 2, 2, 2}, true}}, HeldPowerVectors());
}
#endif  // TROUPE_HAVE_PJRT

}  // namespace
}  // namespace troupe::gan
