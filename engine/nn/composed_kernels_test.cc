// Every composed kernel (Backend's default bodies, composed_kernels.cc),
// run on CoreOnlyBackend (the core and nothing else), against the CPU
// backend's fused kernel on the same inputs (against formulas on the host
// where the CPU runs the default too: activations, binary forwards): values and gradients within
// float tolerance, with the edge cases each one has (C51 atoms exactly on a
// support point and at v_min/v_max, random shifts of 0 and 2*pad, labels 0
// and cols-1, a clipped and an unclipped norm, trust ratios with a zero
// norm); row gathers and scatters bit for bit.
#include <bit>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "engine/nn/backend.h"
#include "engine/nn/cpu_backend.h"
#include "engine/nn/testing.h"
#include "gtest/gtest.h"

namespace troupe::nn {
namespace {

using Buffers = std::vector<std::vector<float>>;
using Kernel = std::function<void(Backend&, const std::vector<float*>&)>;

// The buffers after `kernel` ran on a backend, each uploaded to its memory first.
Buffers RunOn(Backend& backend, const Buffers& buffers, const Kernel& kernel) {
  std::vector<float*> device;
  for (const auto& host : buffers) {
    float* p = backend.AllocateFloats(std::max<int64_t>(1, static_cast<int64_t>(host.size())));
    backend.Upload(host.data(), p, sizeof(float) * host.size());
    device.push_back(p);
  }
  kernel(backend, device);
  Buffers out;
  for (size_t i = 0; i < buffers.size(); ++i) {
    out.emplace_back(buffers[i].size());
    backend.Download(device[i], out.back().data(), sizeof(float) * buffers[i].size());
    backend.Free(device[i]);
  }
  return out;
}

// Every buffer of `got` within `tolerance` relative of `want` (0: bit for bit).
void ExpectBuffersMatch(const std::string& what, const Buffers& want, const Buffers& got, double tolerance) {
  for (size_t i = 0; i < want.size(); ++i) {
    if (tolerance == 0.0) {
      // Bit for bit (NaN payloads included).
      ASSERT_EQ(std::memcmp(got[i].data(), want[i].data(), sizeof(float) * want[i].size()), 0)
          << what << ": buffer " << i;
      continue;
    }
    for (size_t k = 0; k < want[i].size(); ++k) {
      ASSERT_NEAR(got[i][k], want[i][k], tolerance * (1.0 + std::fabs(want[i][k])))
          << what << ": buffer " << i << "[" << k << "]";
    }
  }
}

// The kernel on the CPU's fused kernels and on the composed defaults: every
// buffer (inputs unchanged, outputs computed) within `tolerance` relative.
// `host_outputs` replaces the CPU's value of the buffers it names: those of
// kernels the CPU runs as the defaults too (compared with themselves
// otherwise), computed on the host instead.
void ExpectComposedMatchesFused(const std::string& what, const Buffers& buffers, const Kernel& kernel,
                                double tolerance = 2e-5, const std::map<size_t, std::vector<float>>& host_outputs = {}) {
  CpuBackend cpu(1);
  CoreOnlyBackend core(1);
  Buffers want = RunOn(cpu, buffers, kernel);
  for (const auto& [i, values] : host_outputs) want[i] = values;
  ExpectBuffersMatch(what, want, RunOn(core, buffers, kernel), tolerance);
}

// int32 values carried in float words (a kernel's index arguments).
std::vector<float> Ints(const std::vector<int32_t>& values) {
  std::vector<float> words(values.size());
  std::memcpy(words.data(), values.data(), sizeof(int32_t) * values.size());
  return words;
}

const int32_t* AsInts(const float* p) { return reinterpret_cast<const int32_t*>(p); }

// --- Memory and dense ------------------------------------------------------------------

TEST(ComposedKernelsTest, CopyAxpyScaleAndScalars) {
  const int64_t n = 37;
  ExpectComposedMatchesFused("Copy, Axpy, Scale, AddScalar, ScaleByScalar",
                             {RandomVector(n, 1), RandomVector(n, 2), {0.75f}, RandomVector(n, 3)},
                             [&](Backend& b, const std::vector<float*>& p) {
                               b.Copy(p[0], p[3], n);
                               b.Axpy(-0.5f, p[0], p[1], n);
                               b.Scale(3.0f, p[1], p[0], n);
                               b.AddScalar(2.0f, p[2], p[1], n);
                               b.ScaleByScalar(-1.5f, p[2], p[3], n);
                             });
}

TEST(ComposedKernelsTest, RowBiasAndSums) {
  const int64_t rows = 5, cols = 7;
  ExpectComposedMatchesFused(
      "AddRowBias, RowBiasBackward, Sum, SquaredNorm, SumAxis, SumAxisBackward",
      {RandomVector(rows * cols, 1), RandomVector(cols, 2), RandomVector(cols, 3), {0.0f}, {0.0f},
       std::vector<float>(rows), RandomVector(rows * cols, 4)},
      [&](Backend& b, const std::vector<float*>& p) {
        b.AddRowBias(rows, cols, p[1], p[0]);
        b.RowBiasBackward(rows, cols, p[0], p[2]);
        b.Sum(p[0], rows * cols, 0.25f, p[3]);
        b.SquaredNorm(p[0], rows * cols, p[4]);
        b.SumAxis(rows, cols, 1, p[0], p[5]);
        b.SumAxisBackward(rows, cols, 1, p[5], p[6]);
      });
}

TEST(ComposedKernelsTest, TransposedConvolutionForwardAndBackward) {
  ConvGeometry g;
  g.n = 2, g.c = 3, g.h = 7, g.w = 6, g.oc = 4, g.kh = 3, g.kw = 2, g.stride = 2, g.pad = 1;
  const int64_t in = g.n * g.oc * g.oh() * g.ow(), out = g.n * g.c * g.h * g.w, weights = g.oc * g.c * g.kh * g.kw;
  ExpectComposedMatchesFused(
      "ConvTranspose2dForward/Backward",
      {RandomVector(in, 1), RandomVector(weights, 2), RandomVector(g.c, 3), std::vector<float>(out),
       RandomVector(out, 4), RandomVector(in, 5), RandomVector(weights, 6), RandomVector(g.c, 7)},
      [&](Backend& b, const std::vector<float*>& p) {
        b.ConvTranspose2dForward(g, p[0], p[1], p[2], p[3]);
        b.ConvTranspose2dBackward(g, p[0], p[1], p[4], p[5], p[6], p[7]);
      },
      1e-4);
}

// --- Elementwise -------------------------------------------------------------------------

// The CPU runs activations and binary forwards as these defaults too (over
// its Unary and BinaryBroadcast): their values are the formulas, on the host.
TEST(ComposedKernelsTest, EveryActivationForwardAndBackward) {
  const int64_t n = 64;
  const float alpha = 0.2f;
  for (Activation f : {Activation::kRelu, Activation::kLeakyRelu, Activation::kElu, Activation::kTanh,
                       Activation::kSigmoid, Activation::kSoftplus}) {
    std::vector<float> x = RandomVector(n, 1, -4.0f, 4.0f);
    x[0] = 0.0f;
    x[1] = 25.0f;  // softplus's linear branch
    const std::vector<float> dy = RandomVector(n, 2), dx = RandomVector(n, 3);
    // y = f(x), dx + f'(x) dy, in double.
    std::vector<float> y(n), dx_after(n);
    for (int64_t i = 0; i < n; ++i) {
      const double v = x[i], sigmoid = 1.0 / (1.0 + std::exp(-v));
      double value = 0, slope = 0;
      switch (f) {
        case Activation::kRelu: value = v > 0 ? v : 0, slope = v > 0 ? 1 : 0; break;
        case Activation::kLeakyRelu: value = v > 0 ? v : alpha * v, slope = v > 0 ? 1 : alpha; break;
        case Activation::kElu: value = v > 0 ? v : alpha * std::expm1(v), slope = v > 0 ? 1 : alpha * std::exp(v); break;
        case Activation::kTanh: value = std::tanh(v), slope = 1 - value * value; break;
        case Activation::kSigmoid: value = sigmoid, slope = sigmoid * (1 - sigmoid); break;
        case Activation::kSoftplus: value = v > 20 ? v : std::log1p(std::exp(v)), slope = sigmoid; break;
      }
      y[i] = static_cast<float>(value);
      dx_after[i] = static_cast<float>(dx[i] + slope * dy[i]);
    }
    ExpectComposedMatchesFused("activation " + std::to_string(static_cast<int>(f)), {x, std::vector<float>(n), dy, dx},
                               [&](Backend& b, const std::vector<float*>& p) {
                                 b.ActivationForward(f, alpha, p[0], p[1], n);
                                 b.ActivationBackward(f, alpha, p[0], p[1], p[2], p[3], n);
                               },
                               2e-5, {{1, y}, {3, dx_after}});
  }
}

TEST(ComposedKernelsTest, BinaryForwardAndBackward) {
  const int64_t n = 29;
  for (Binary op : {Binary::kAdd, Binary::kSub, Binary::kMul}) {
    const std::vector<float> lhs = RandomVector(n, 1), rhs = RandomVector(n, 2);
    std::vector<float> y(n);
    for (int64_t i = 0; i < n; ++i) {
      y[i] = op == Binary::kAdd ? lhs[i] + rhs[i] : op == Binary::kSub ? lhs[i] - rhs[i] : lhs[i] * rhs[i];
    }
    ExpectComposedMatchesFused("binary " + std::to_string(static_cast<int>(op)),
                               {lhs, rhs, std::vector<float>(n), RandomVector(n, 3), RandomVector(n, 4), RandomVector(n, 5)},
                               [&](Backend& b, const std::vector<float*>& p) {
                                 b.BinaryForward(op, p[0], p[1], p[2], n);
                                 b.BinaryBackward(op, p[0], p[1], p[3], p[4], p[5], n);
                               },
                               2e-5, {{2, y}});
  }
}

// --- Normalisation ---------------------------------------------------------------------------

TEST(ComposedKernelsTest, LayerNormForwardAndBackward) {
  const int64_t rows = 6, cols = 11;
  ExpectComposedMatchesFused(
      "LayerNorm",
      {RandomVector(rows * cols, 1, -2.0f, 3.0f), RandomVector(cols, 2), RandomVector(cols, 3),
       std::vector<float>(rows * cols), std::vector<float>(rows), std::vector<float>(rows),
       RandomVector(rows * cols, 4), RandomVector(rows * cols, 5), RandomVector(cols, 6), RandomVector(cols, 7)},
      [&](Backend& b, const std::vector<float*>& p) {
        b.LayerNormForward(rows, cols, 1e-5f, p[0], p[1], p[2], p[3], p[4], p[5]);
        b.LayerNormBackward(rows, cols, p[0], p[1], p[4], p[5], p[6], p[7], p[8], p[9]);
      },
      1e-4);
}

TEST(ComposedKernelsTest, BatchNormTrainingEvaluationAndBackward) {
  for (const int64_t n : {int64_t{3}, int64_t{1}}) {
    // n = 1 with hw = 1: a count of 1, where the running variance takes the
    // biased one (a variance of 0: a larger eps keeps rstd away from the
    // rounding of x^2 - mean^2).
    const int64_t c = 4, hw = n == 1 ? 1 : 5, size = n * c * hw;
    const float eps = n == 1 ? 0.1f : 1e-5f;
    ExpectComposedMatchesFused(
        "BatchNorm n=" + std::to_string(n),
        {RandomVector(size, 1, -1.0f, 2.0f), std::vector<float>(2 * c + 1), RandomVector(c, 2),
         RandomVector(c, 3, 0.5f, 1.5f), std::vector<float>(c), std::vector<float>(c), RandomVector(c, 4),
         RandomVector(c, 5), std::vector<float>(size), RandomVector(size, 6), std::vector<float>(2 * c + 1),
         RandomVector(size, 7), std::vector<float>(c), std::vector<float>(c)},
        [&](Backend& b, const std::vector<float*>& p) {
          b.BatchNormStats(n, c, hw, p[0], p[1]);
          b.BatchNormMoments(c, eps, 0.1f, p[1], p[2], p[3], p[4], p[5]);
          b.BatchNormApply(n, c, hw, p[0], p[4], p[5], p[6], p[7], p[8]);
          b.BatchNormBackwardStats(n, c, hw, p[0], p[4], p[5], p[9], p[10]);
          b.BatchNormBackwardApply(n, c, hw, p[0], p[4], p[5], p[6], p[10], p[9], p[11]);
          // Evaluation: from the running statistics.
          b.BatchNormMoments(c, eps, 0.1f, nullptr, p[2], p[3], p[12], p[13]);
        },
        1e-4);
  }
}

// --- Softmax family ----------------------------------------------------------------------------

TEST(ComposedKernelsTest, SoftmaxAndLogSoftmaxForwardAndBackward) {
  const int64_t rows = 4, cols = 9;
  for (const bool log : {false, true}) {
    ExpectComposedMatchesFused(log ? "log softmax" : "softmax",
                               {RandomVector(rows * cols, 1, -5.0f, 5.0f), std::vector<float>(rows * cols),
                                RandomVector(rows * cols, 2), RandomVector(rows * cols, 3)},
                               [&](Backend& b, const std::vector<float*>& p) {
                                 b.SoftmaxForward(rows, cols, p[0], p[1], log);
                                 b.SoftmaxBackward(rows, cols, p[1], p[2], p[3], log);
                               });
  }
}

TEST(ComposedKernelsTest, CrossEntropyWithLabelsAtBothEnds) {
  const int64_t rows = 4, cols = 6;
  ExpectComposedMatchesFused("CrossEntropy",
                             {RandomVector(rows * cols, 1, -3.0f, 3.0f), Ints({0, static_cast<int32_t>(cols - 1), 2, 0}),
                              std::vector<float>(rows * cols), {0.0f}, {1.5f}, RandomVector(rows * cols, 2)},
                             [&](Backend& b, const std::vector<float*>& p) {
                               b.CrossEntropyForward(rows, cols, p[0], AsInts(p[1]), p[2], p[3]);
                               b.CrossEntropyBackward(rows, cols, p[2], AsInts(p[1]), p[4], p[5]);
                             });
}

// --- Distributional RL ---------------------------------------------------------------------------

TEST(ComposedKernelsTest, CategoricalProjectionIncludingAtomsOnSupportPointsAndBounds) {
  const int64_t atoms = 11;
  const float v_min = -5.0f, v_max = 5.0f;  // dz = 1
  // Rows: a generic shift; reward 1 discount 1 (every atom on a support
  // point, the top one clipped to v_max); discount 0 (all mass at the
  // reward, itself on a point); far beyond both bounds (all at v_min, all
  // at v_max); reward 0.5 discount 0.5.
  const std::vector<float> reward = {0.37f, 1.0f, 2.0f, -40.0f, 40.0f, 0.5f};
  const std::vector<float> discount = {0.99f, 1.0f, 0.0f, 0.9f, 0.9f, 0.5f};
  const int64_t rows = static_cast<int64_t>(reward.size());
  std::vector<float> p = RandomVector(rows * atoms, 1, 0.0f, 1.0f);
  ExpectComposedMatchesFused("CategoricalProjection", {p, reward, discount, std::vector<float>(rows * atoms)},
                             [&](Backend& b, const std::vector<float*>& d) {
                               b.CategoricalProjection(rows, atoms, v_min, v_max, d[0], d[1], d[2], d[3]);
                             },
                             1e-5);
  // The exact cases by hand: discount 0 puts each row's whole mass on atom 7 (z = 2).
  CoreOnlyBackend core;
  const Buffers out = RunOn(core, {p, reward, discount, std::vector<float>(rows * atoms)},
                            [&](Backend& b, const std::vector<float*>& d) {
                              b.CategoricalProjection(rows, atoms, v_min, v_max, d[0], d[1], d[2], d[3]);
                            });
  float mass = 0.0f;
  for (int64_t j = 0; j < atoms; ++j) mass += p[2 * atoms + j];
  for (int64_t i = 0; i < atoms; ++i) EXPECT_FLOAT_EQ(out[3][2 * atoms + i], i == 7 ? mass : 0.0f) << i;
  mass = 0.0f;
  for (int64_t j = 0; j < atoms; ++j) mass += p[3 * atoms + j];
  EXPECT_FLOAT_EQ(out[3][3 * atoms], mass);  // all below v_min: on v_min
}

// --- Images and row tables --------------------------------------------------------------------------

TEST(ComposedKernelsTest, RandomShiftAtZeroAndTwicePadAndInBetween) {
  const int64_t n = 3, c = 2, h = 6, w = 5, pad = 2;
  const std::vector<int32_t> shifts = {0, 0, 2 * pad, 2 * pad, 1, 3};
  ExpectComposedMatchesFused("RandomShift",
                             {Ints(shifts), RandomVector(n * c * h * w, 1), std::vector<float>(n * c * h * w),
                              RandomVector(n * c * h * w, 2), RandomVector(n * c * h * w, 3)},
                             [&](Backend& b, const std::vector<float*>& p) {
                               b.RandomShiftForward(n, c, h, w, pad, AsInts(p[0]), p[1], p[2]);
                               b.RandomShiftBackward(n, c, h, w, pad, AsInts(p[0]), p[3], p[4]);
                             });
  // The forward copies values: bit for bit.
  ExpectComposedMatchesFused("RandomShiftForward",
                             {Ints(shifts), RandomVector(n * c * h * w, 1), std::vector<float>(n * c * h * w)},
                             [&](Backend& b, const std::vector<float*>& p) {
                               b.RandomShiftForward(n, c, h, w, pad, AsInts(p[0]), p[1], p[2]);
                             },
                             0.0);
}

// uint8 bytes packed into float words (zero padded to whole words).
std::vector<float> Bytes(const std::vector<uint8_t>& bytes) {
  std::vector<float> words((bytes.size() + 3) / 4, 0.0f);
  std::memcpy(words.data(), bytes.data(), bytes.size());
  return words;
}

TEST(ComposedKernelsTest, BytesToFloatPlanarAndTheRowTableKernelsBitForBit) {
  const int64_t images = 3, pixels = 10, channels = 3, rows = 5, row_words = 9;  // 36 bytes a row, 30 an image
  std::vector<uint8_t> bytes(images * pixels * channels);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 37 + 11);
  std::vector<float> table = RandomVector(rows * row_words, 1);
  table[4] = std::bit_cast<float>(uint32_t{0x7fc00123});  // a NaN payload: bits, not floats
  const std::vector<int32_t> picks = {4, 0, 4};
  for (const int64_t ch : {channels, int64_t{1}}) {
    ExpectComposedMatchesFused(
        "BytesToFloatPlanar, GatherRows, ScatterRows, GatherBytesToFloatPlanar channels=" + std::to_string(ch),
        {Bytes(bytes), std::vector<float>(images * pixels * ch), table, Ints(picks),
         std::vector<float>(images * row_words), RandomVector(2 * row_words, 2), Ints({1, 3}),
         std::vector<float>(images * pixels * ch)},
        [&](Backend& b, const std::vector<float*>& p) {
          b.BytesToFloatPlanar(images, pixels, ch, 1.0f / 255, reinterpret_cast<const uint8_t*>(p[0]), p[1]);
          b.GatherRows(rows, row_words, p[2], images, AsInts(p[3]), p[4]);
          b.ScatterRows(rows, row_words, p[2], 2, AsInts(p[6]), p[5]);
          b.GatherBytesToFloatPlanar(rows, row_words, p[2], images, AsInts(p[3]), pixels, ch, 0.5f, p[7]);
        },
        0.0);
  }
}

// --- Spectral normalisation and optimizers ------------------------------------------------------------

TEST(ComposedKernelsTest, SpectralNorm) {
  const int64_t rows = 5, cols = 8;
  ExpectComposedMatchesFused(
      "SpectralNorm",
      {RandomVector(rows * cols, 1), RandomVector(rows, 2), RandomVector(cols, 3), std::vector<float>(rows * cols),
       {0.0f}, RandomVector(rows * cols, 4), RandomVector(rows * cols, 5)},
      [&](Backend& b, const std::vector<float*>& p) {
        b.SpectralNormPowerIteration(rows, cols, p[0], p[1], p[2], 3);
        b.SpectralNormForward(rows, cols, p[0], p[1], p[2], p[3], p[4]);
        b.SpectralNormBackward(rows, cols, p[0], p[1], p[2], p[4], p[5], p[6]);
      },
      1e-4);
}

TEST(ComposedKernelsTest, ClipByNormClippedAndNot) {
  const int64_t n = 50;
  for (const float max_norm : {0.5f, 100.0f}) {
    ExpectComposedMatchesFused("ClipByNorm " + std::to_string(max_norm), {RandomVector(n, 1), {0.0f}},
                               [&](Backend& b, const std::vector<float*>& p) { b.ClipByNorm(p[0], n, max_norm, p[1]); });
  }
  ExpectComposedMatchesFused("ClipByNorm of zeros", {std::vector<float>(n)},
                             [&](Backend& b, const std::vector<float*>& p) { b.ClipByNorm(p[0], n, 1.0f, nullptr); });
}

TEST(ComposedKernelsTest, AdamSgdAndPolyak) {
  const int64_t n = 40;
  for (const float decay : {0.0f, 0.01f}) {
    ExpectComposedMatchesFused(
        "Adam, SGD, Polyak weight decay " + std::to_string(decay),
        {RandomVector(n, 1), RandomVector(n, 2), RandomVector(n, 3, -0.1f, 0.1f), RandomVector(n, 4, 0.0f, 0.1f),
         RandomVector(n, 5), RandomVector(n, 6), RandomVector(n, 7)},
        [&](Backend& b, const std::vector<float*>& p) {
          b.AdamUpdate(n, 1e-3f, 0.9f, 0.999f, 1e-8f, decay, 1.0f - 0.9f * 0.9f, 1.0f - 0.999f * 0.999f, p[0], p[1],
                       p[2], p[3]);
          b.SgdUpdate(n, 0.1f, 0.9f, decay, p[0], p[4], p[5]);
          b.Polyak(n, 0.005f, p[1], p[6]);
        });
  }
}

TEST(ComposedKernelsTest, TrustRatioIncludingZeroNorms) {
  for (const auto& [w, u] : {std::pair{4.0f, 9.0f}, std::pair{0.0f, 9.0f}, std::pair{4.0f, 0.0f},
                             std::pair{0.0f, 0.0f}}) {
    ExpectComposedMatchesFused("TrustRatio", {{w}, {u}, {0.0f}}, [&](Backend& b, const std::vector<float*>& p) {
      b.TrustRatio(p[0], p[1], 0.001f, 0.01f, p[2]);
    });
  }
}

// --- The scratch pool -------------------------------------------------------------------------------

// A composed kernel called again with a geometry it has seen allocates
// nothing: its temporaries are the scratch pool's blocks.
TEST(ComposedKernelsTest, AKernelCalledAgainWithTheSameGeometryAllocatesNothing) {
  CoreOnlyBackend core;
  const int64_t rows = 8, atoms = 21;
  std::vector<float*> p;
  for (int64_t size : {rows * atoms, rows, rows, rows * atoms}) p.push_back(core.AllocateFloats(size));
  core.Fill(p[0], rows * atoms, 1.0f / atoms);
  core.Fill(p[1], rows, 0.5f);
  core.Fill(p[2], rows, 0.9f);
  const int64_t before = core.allocations();
  // Two kernels sharing the pool's blocks.
  core.CategoricalProjection(rows, atoms, -10.0f, 10.0f, p[0], p[1], p[2], p[3]);
  core.ClipByNorm(p[3], rows * atoms, 0.1f, nullptr);
  const int64_t after_first = core.allocations();
  EXPECT_GT(after_first, before);
  for (int i = 0; i < 3; ++i) {
    core.CategoricalProjection(rows, atoms, -10.0f, 10.0f, p[0], p[1], p[2], p[3]);
    core.ClipByNorm(p[3], rows * atoms, 0.1f, nullptr);
  }
  // A smaller geometry fits in the blocks too.
  core.CategoricalProjection(rows / 2, atoms, -10.0f, 10.0f, p[0], p[1], p[2], p[3]);
  EXPECT_EQ(core.allocations(), after_first);
  for (float* q : p) core.Free(q);
}

}  // namespace
}  // namespace troupe::nn
