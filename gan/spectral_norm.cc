#include "gan/spectral_norm.h"

#include <cmath>

namespace troupe::gan {
namespace {

using nn::Backend;
using nn::Binary;
using nn::Flat;
using nn::Reduction;
using nn::UnaryOp;
using nn::View3;

// x[i] *= 1 / (||x|| + 1e-12) (a power iteration's normalisation), composed.
void Normalize(Backend& b, float* x, int64_t n) {
  Backend::Temporaries t(b);
  float* inverse = t.Floats(1);
  b.SquaredNorm(x, n, inverse);
  b.Unary(UnaryOp::kSqrt, 0, 0, inverse, inverse, 1);
  b.Unary(UnaryOp::kAffine, 1.0f, 1e-12f, inverse, inverse, 1);
  b.Unary(UnaryOp::kReciprocal, 0, 0, inverse, inverse, 1);
  b.BinaryBroadcast(Binary::kMul, Flat(n), x, nn::kAllAxes, inverse, nn::kScalarAxes, x);
}

// The same on the host, the sum in double.
void NormalizeOnHost(float* a, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * a[i];
  const float inv = static_cast<float>(1.0 / (std::sqrt(s) + 1e-12));
  for (int64_t i = 0; i < n; ++i) a[i] *= inv;
}

void SpectralNormBackwardNode(nn::Tape& t, const nn::Node& n) {
  const nn::Value& w = t.value(n.in[0]);
  SpectralNormBackward(t.backend(), n.i[0], n.i[1], w.data, n.saved[0], n.saved[1], n.saved[2], t.value(n.out).grad,
                       w.grad);
}

}  // namespace

void SpectralNormPowerIteration(Backend& b, int64_t rows, int64_t cols, const float* w, float* u, float* v,
                                int iterations) {
  const bool on_host = b.HostKernel("SpectralNormPowerIteration", {w, u, v}, [&](const Backend::HostParallelFor&) {
    for (int it = 0; it < iterations; ++it) {
      for (int64_t j = 0; j < cols; ++j) v[j] = 0.0f;
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t j = 0; j < cols; ++j) v[j] += w[i * cols + j] * u[i];
      }
      NormalizeOnHost(v, cols);
      for (int64_t i = 0; i < rows; ++i) {
        double s = 0.0;
        for (int64_t j = 0; j < cols; ++j) s += w[i * cols + j] * v[j];
        u[i] = static_cast<float>(s);
      }
      NormalizeOnHost(u, rows);
    }
  });
  if (!on_host) ComposedSpectralNormPowerIteration(b, rows, cols, w, u, v, iterations);
}

void SpectralNormForward(Backend& b, int64_t rows, int64_t cols, const float* w, const float* u, const float* v,
                         float* y, float* sigma_out) {
  const bool on_host =
      b.HostKernel("SpectralNormForward", {w, u, v, y, sigma_out}, [&](const Backend::HostParallelFor&) {
        double sigma = 0.0;
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t j = 0; j < cols; ++j) sigma += static_cast<double>(u[i]) * w[i * cols + j] * v[j];
        }
        const float inv = static_cast<float>(1.0 / sigma);
        for (int64_t k = 0; k < rows * cols; ++k) y[k] = w[k] * inv;
        sigma_out[0] = static_cast<float>(sigma);
      });
  if (!on_host) ComposedSpectralNormForward(b, rows, cols, w, u, v, y, sigma_out);
}

void SpectralNormBackward(Backend& b, int64_t rows, int64_t cols, const float* w, const float* u, const float* v,
                          const float* sigma_in, const float* dy, float* dw) {
  const bool on_host =
      b.HostKernel("SpectralNormBackward", {w, u, v, sigma_in, dy, dw}, [&](const Backend::HostParallelFor&) {
        const float sigma = sigma_in[0];
        double dot = 0.0;
        for (int64_t k = 0; k < rows * cols; ++k) dot += static_cast<double>(dy[k]) * w[k];
        const float inv = 1.0f / sigma;
        const float k2 = static_cast<float>(dot / (static_cast<double>(sigma) * sigma));
        for (int64_t i = 0; i < rows; ++i) {
          for (int64_t j = 0; j < cols; ++j) dw[i * cols + j] += dy[i * cols + j] * inv - k2 * u[i] * v[j];
        }
      });
  if (!on_host) ComposedSpectralNormBackward(b, rows, cols, w, u, v, sigma_in, dy, dw);
}

void ComposedSpectralNormPowerIteration(Backend& b, int64_t rows, int64_t cols, const float* w, float* u, float* v,
                                        int iterations) {
  for (int it = 0; it < iterations; ++it) {
    b.Gemm(true, false, cols, 1, rows, 1.0f, w, u, 0.0f, v);
    Normalize(b, v, cols);
    b.Gemm(false, false, rows, 1, cols, 1.0f, w, v, 0.0f, u);
    Normalize(b, u, rows);
  }
}

void ComposedSpectralNormForward(Backend& b, int64_t rows, int64_t cols, const float* w, const float* u,
                                 const float* v, float* y, float* sigma) {
  Backend::Temporaries t(b);
  float* wv = t.Floats(rows);
  b.Gemm(false, false, rows, 1, cols, 1.0f, w, v, 0.0f, wv);
  b.BinaryBroadcast(Binary::kMul, Flat(rows), wv, nn::kAllAxes, u, nn::kAllAxes, wv);
  b.Reduce(Reduction::kSum, {1, rows, 1}, 1.0f, wv, sigma);
  b.BinaryBroadcast(Binary::kDiv, Flat(rows * cols), w, nn::kAllAxes, sigma, nn::kScalarAxes, y);
}

void ComposedSpectralNormBackward(Backend& b, int64_t rows, int64_t cols, const float* w, const float* u,
                                  const float* v, const float* sigma, const float* dy, float* dw) {
  Backend::Temporaries t(b);
  float* product = t.Floats(rows * cols);
  float* k = t.Floats(1);
  float* sigma_squared = t.Floats(1);
  float* scaled_u = t.Floats(rows);
  // k = sum(dy * w) / sigma^2; dw += dy / sigma - k u v^T.
  b.BinaryBroadcast(Binary::kMul, Flat(rows * cols), dy, nn::kAllAxes, w, nn::kAllAxes, product);
  b.Reduce(Reduction::kSum, {1, rows * cols, 1}, 1.0f, product, k);
  b.Unary(UnaryOp::kSquare, 0, 0, sigma, sigma_squared, 1);
  b.BinaryBroadcast(Binary::kDiv, Flat(1), k, nn::kAllAxes, sigma_squared, nn::kAllAxes, k);
  b.BinaryBroadcast(Binary::kMul, Flat(rows), u, nn::kAllAxes, k, nn::kScalarAxes, scaled_u);
  b.BinaryBroadcast(Binary::kDiv, Flat(rows * cols), dy, nn::kAllAxes, sigma, nn::kScalarAxes, dw, true);
  b.Gemm(false, false, rows, cols, 1, -1.0f, scaled_u, v, 1.0f, dw);
}

nn::Var SpectralNorm(nn::Var w, float* u, float* v, int iterations) {
  nn::Tape& t = *w.tape;
  const nn::Shape& s = t.value(w).shape;
  const int64_t rows = s[0], cols = s.size() / rows;
  if (iterations > 0) SpectralNormPowerIteration(t.backend(), rows, cols, t.value(w).data, u, v, iterations);
  nn::Var y = t.NewValue(s, t.value(w).requires_grad);
  nn::Node n;
  // Save u, v as they were used (the caller may iterate them again): device
  // copies, u and v being the backend's memory (an Upload from them worked
  // on the CPU devices only; the PJRT backend caught it). sigma stays on the
  // device for the backward pass.
  n.saved[0] = t.AllocateFloats(rows);
  n.saved[1] = t.AllocateFloats(cols);
  n.saved[2] = t.AllocateFloats(1);
  t.backend().Copy(u, n.saved[0], rows);
  t.backend().Copy(v, n.saved[1], cols);
  SpectralNormForward(t.backend(), rows, cols, t.value(w).data, u, v, t.value(y).data, n.saved[2]);
  n.backward = SpectralNormBackwardNode;
  n.out = y.id;
  n.in[0] = w.id;
  n.i[0] = rows, n.i[1] = cols;
  t.Record(n);
  return y;
}

}  // namespace troupe::gan
