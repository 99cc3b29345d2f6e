// Every composed kernel (Backend's default bodies, composed_kernels.cc),
// run on CoreOnlyBackend (the core and nothing else), against the CPU
// backend's fused kernel on the same inputs (against formulas on the host
// where the CPU runs the default too: activations, binary forwards): values and gradients within
// float tolerance, with the edge cases each one has (labels 0 and cols-1, a
// clipped and an unclipped norm, trust ratios with a zero norm); row
// gathers and scatters bit for bit. (An algorithm's kernels are held
// against their owners' host loops the same way, in agents/ and gan/.)
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
#include "engine/nn/kernel_testing.h"
#include "engine/nn/testing.h"
#include "gtest/gtest.h"

namespace troupe::nn {
namespace {

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

// --- Images and row tables --------------------------------------------------------------------------

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

// --- Optimizers ------------------------------------------------------------

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
  const int64_t rows = 8, cols = 21;
  std::vector<float*> p;
  for (int64_t size : {rows * cols, rows, rows * cols, int64_t{1}}) p.push_back(core.AllocateFloats(size));
  core.Fill(p[0], rows * cols, 1.0f / cols);
  core.Fill(p[1], rows, 0.0f);  // labels: int32 zeros
  const int64_t before = core.allocations();
  // Two kernels sharing the pool's blocks.
  core.CrossEntropyForward(rows, cols, p[0], AsInts(p[1]), p[2], p[3]);
  core.ClipByNorm(p[2], rows * cols, 0.1f, nullptr);
  const int64_t after_first = core.allocations();
  EXPECT_GT(after_first, before);
  for (int i = 0; i < 3; ++i) {
    core.CrossEntropyForward(rows, cols, p[0], AsInts(p[1]), p[2], p[3]);
    core.ClipByNorm(p[2], rows * cols, 0.1f, nullptr);
  }
  // A smaller geometry fits in the blocks too.
  core.CrossEntropyForward(rows / 2, cols, p[0], AsInts(p[1]), p[2], p[3]);
  EXPECT_EQ(core.allocations(), after_first);
  for (float* q : p) core.Free(q);
}

}  // namespace
}  // namespace troupe::nn
