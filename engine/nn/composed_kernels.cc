// Backend's composed kernels: the default body of every kernel beyond the
// core (backend.h), written once over the core's generic kernels. A backend
// that implements only the core runs these; one with a fused kernel
// overrides it (composed_kernels_test.cc checks every body here against the
// CPU backend's fused one). Temporaries come from the backend's scratch
// pool (Backend::Temporaries).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "common/status_macros.h"
#include "engine/nn/backend.h"

namespace troupe::nn {
namespace {

constexpr float kInfinity = std::numeric_limits<float>::infinity();

UnaryOp OfActivation(Activation f) {
  static_assert(static_cast<int>(UnaryOp::kSoftplus) == static_cast<int>(Activation::kSoftplus));
  return static_cast<UnaryOp>(f);
}

// out[ch] (+)= sum over i < n, j < hw of x[i, ch, j]: a batch norm's
// per-channel sum, as two reductions of the middle axis.
void ChannelSums(Backend& b, int64_t n, int64_t c, int64_t hw, const float* x, float* out, bool accumulate = false) {
  Backend::Temporaries t(b);
  float* per_position = t.Floats(c * hw);
  b.Reduce(Reduction::kSum, {1, n, c * hw}, 1.0f, x, per_position);
  b.Reduce(Reduction::kSum, {c, hw, 1}, 1.0f, per_position, out, accumulate);
}

// y[0] = condition[0] > 0 ? value[0] : otherwise, exactly (value * step +
// (1 - step), no rounding of the value), for scalars on the device.
void SelectScalar(Backend& b, const float* condition, const float* value, float otherwise, float* y) {
  Backend::Temporaries t(b);
  float* on = t.Floats(1);
  float* off = t.Floats(1);
  b.Unary(UnaryOp::kStep, 0, 0, condition, on, 1);
  b.Unary(UnaryOp::kAffine, -otherwise, otherwise, on, off, 1);
  b.BinaryBroadcast(Binary::kMul, Flat(1), value, kAllAxes, on, kAllAxes, y);
  b.BinaryBroadcast(Binary::kAdd, Flat(1), y, kAllAxes, off, kAllAxes, y);
}

// Interleaved uint8 images [images, pixels, channels], image i starting at
// byte i * image_bytes, to float planes [images, channels, pixels] * scale:
// the bytes to floats, then a gather that transposes each image.
void BytesToPlanes(Backend& b, int64_t images, int64_t image_bytes, int64_t pixels, int64_t channels, float scale,
                   const uint8_t* in, float* out) {
  TROUPE_CHECK(pixels * channels <= image_bytes);
  Backend::Temporaries t(b);
  if (channels == 1 && image_bytes == pixels) {
    b.Convert(DType::kU8, in, DType::kF32, out, images * pixels, scale);
    return;
  }
  float* values = t.Floats(images * image_bytes);
  b.Convert(DType::kU8, in, DType::kF32, values, images * image_bytes, scale);
  // index[i, ch, p] = p * channels + ch: where plane ch's pixel p sits.
  float* pixel_starts = t.Floats(pixels);
  float* channel_offsets = t.Floats(channels);
  float* index = t.Floats(images * channels * pixels);
  int32_t* indices = t.Ints(images * channels * pixels);
  b.Fill(pixel_starts, pixels, 0.0f, static_cast<float>(channels));
  b.Fill(channel_offsets, channels, 0.0f, 1.0f);
  b.BinaryBroadcast(Binary::kAdd, {images, channels, pixels}, channel_offsets, kMidAxis, pixel_starts, kInnerAxis,
                    index);
  b.Convert(DType::kF32, index, DType::kI32, indices, images * channels * pixels);
  b.Gather(images, image_bytes, 1, channels * pixels, values, indices, out);
}

}  // namespace

// --- Memory and dense ------------------------------------------------------------

void Backend::Copy(const float* x, float* y, int64_t n) { CopyBlocks(1, n, x, n, 0, y, n, 0, false); }

void Backend::Axpy(float alpha, const float* x, float* y, int64_t n) {
  Unary(UnaryOp::kAffine, alpha, 0.0f, x, y, n, /*accumulate=*/true);
}

void Backend::AddScalar(float alpha, const float* scalar, float* y, int64_t n) {
  Temporaries t(*this);
  float* add = t.Floats(1);
  Unary(UnaryOp::kAffine, alpha, 0.0f, scalar, add, 1);
  BinaryBroadcast(Binary::kAdd, Flat(n), y, kAllAxes, add, kScalarAxes, y);
}

void Backend::AddRowBias(int64_t rows, int64_t cols, const float* bias, float* y) {
  BinaryBroadcast(Binary::kAdd, {1, rows, cols}, y, kAllAxes, bias, kInnerAxis, y);
}

void Backend::RowBiasBackward(int64_t rows, int64_t cols, const float* dy, float* dbias) {
  Reduce(Reduction::kSum, {1, rows, cols}, 1.0f, dy, dbias, /*accumulate=*/true);
}

void Backend::ConvTranspose2dForward(const ConvGeometry& g, const float* x, const float* w, const float* b,
                                     float* y) {
  // The transposed convolution is the convolution's input gradient.
  Fill(y, g.n * g.c * g.h * g.w, 0.0f);
  Conv2dBackward(g, FusedActivation::kNone, nullptr, w, nullptr, x, y, nullptr, nullptr);
  if (b != nullptr) BinaryBroadcast(Binary::kAdd, {g.n, g.c, g.h * g.w}, y, kAllAxes, b, kMidAxis, y);
}

void Backend::ConvTranspose2dBackward(const ConvGeometry& g, const float* x, const float* w, const float* dy,
                                      float* dx, float* dw, float* db) {
  if (db != nullptr) ChannelSums(*this, g.n, g.c, g.h * g.w, dy, db, /*accumulate=*/true);
  if (dx != nullptr) {
    // dx: the convolution of dy.
    Temporaries t(*this);
    const int64_t count = g.n * g.oc * g.oh() * g.ow();
    float* conv = t.Floats(count);
    Conv2dForward(g, FusedActivation::kNone, dy, w, nullptr, conv);
    BinaryBroadcast(Binary::kAdd, Flat(count), dx, kAllAxes, conv, kAllAxes, dx);
  }
  // dw: the convolution's weight gradient with dy as its input and x as its output's gradient.
  if (dw != nullptr) Conv2dBackward(g, FusedActivation::kNone, dy, w, nullptr, x, nullptr, dw, nullptr);
}

// --- Elementwise -------------------------------------------------------------------

void Backend::ActivationForward(Activation f, float alpha, const float* x, float* y, int64_t n) {
  Unary(OfActivation(f), alpha, 0.0f, x, y, n);
}

void Backend::ActivationBackward(Activation f, float alpha, const float* x, const float* y, const float* dy,
                                 float* dx, int64_t n) {
  UnaryBackward(OfActivation(f), alpha, 0.0f, x, y, dy, dx, n);
}

void Backend::BinaryForward(Binary op, const float* a, const float* b, float* y, int64_t n) {
  BinaryBroadcast(op, Flat(n), a, kAllAxes, b, kAllAxes, y);
}

void Backend::BinaryBackward(Binary op, const float* a, const float* b, const float* dy, float* da, float* db,
                             int64_t n) {
  switch (op) {
    case Binary::kAdd:
    case Binary::kSub:
      if (da != nullptr) Unary(UnaryOp::kAffine, 1.0f, 0.0f, dy, da, n, true);
      if (db != nullptr) Unary(UnaryOp::kAffine, op == Binary::kAdd ? 1.0f : -1.0f, 0.0f, dy, db, n, true);
      return;
    case Binary::kMul:
      if (da != nullptr) BinaryBroadcast(Binary::kMul, Flat(n), b, kAllAxes, dy, kAllAxes, da, true);
      if (db != nullptr) BinaryBroadcast(Binary::kMul, Flat(n), a, kAllAxes, dy, kAllAxes, db, true);
      return;
    default:
      std::fprintf(stderr, "%s backend: BinaryBackward of op %d (only add, sub and mul have one)\n",
                   name().c_str(), static_cast<int>(op));
      std::abort();
  }
}

void Backend::Scale(float alpha, const float* x, float* y, int64_t n) { Unary(UnaryOp::kAffine, alpha, 0.0f, x, y, n); }

// --- Reductions ----------------------------------------------------------------------

void Backend::Sum(const float* x, int64_t n, float scale, float* y) {
  Reduce(Reduction::kSum, {1, n, 1}, scale, x, y);
}

void Backend::SquaredNorm(const float* x, int64_t n, float* y) {
  Temporaries t(*this);
  float* squares = t.Floats(n);
  Unary(UnaryOp::kSquare, 0, 0, x, squares, n);
  Reduce(Reduction::kSum, {1, n, 1}, 1.0f, squares, y);
}

void Backend::SumAxis(int64_t outer, int64_t reduce, int64_t inner, const float* x, float* y) {
  Reduce(Reduction::kSum, {outer, reduce, inner}, 1.0f, x, y);
}

void Backend::SumAxisBackward(int64_t outer, int64_t reduce, int64_t inner, const float* dy, float* dx) {
  BinaryBroadcast(Binary::kAdd, {outer, reduce, inner}, dx, kAllAxes, dy, kOuterAxis | kInnerAxis, dx);
}

// --- Normalisation ---------------------------------------------------------------------

void Backend::LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x, const float* gamma,
                               const float* beta, float* y, float* mean, float* rstd) {
  const View3 v{rows, cols, 1};
  const int64_t n = rows * cols;
  Temporaries t(*this);
  float* centred = t.Floats(n);
  float* squares = t.Floats(n);
  Reduce(Reduction::kSum, v, 1.0f / cols, x, mean);
  BinaryBroadcast(Binary::kSub, v, x, kAllAxes, mean, kOuterAxis, centred);
  Unary(UnaryOp::kSquare, 0, 0, centred, squares, n);
  Reduce(Reduction::kSum, v, 1.0f / cols, squares, rstd);
  Unary(UnaryOp::kAffine, 1.0f, eps, rstd, rstd, rows);
  Unary(UnaryOp::kRsqrt, 0, 0, rstd, rstd, rows);
  BinaryBroadcast(Binary::kMul, v, centred, kAllAxes, rstd, kOuterAxis, y);
  BinaryBroadcast(Binary::kMul, v, y, kAllAxes, gamma, kMidAxis, y);
  BinaryBroadcast(Binary::kAdd, v, y, kAllAxes, beta, kMidAxis, y);
}

void Backend::LayerNormBackward(int64_t rows, int64_t cols, const float* x, const float* gamma, const float* mean,
                                const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta) {
  const View3 v{rows, cols, 1};
  const int64_t n = rows * cols;
  Temporaries t(*this);
  float* xhat = t.Floats(n);
  float* product = t.Floats(n);
  BinaryBroadcast(Binary::kSub, v, x, kAllAxes, mean, kOuterAxis, xhat);
  BinaryBroadcast(Binary::kMul, v, xhat, kAllAxes, rstd, kOuterAxis, xhat);
  if (dgamma != nullptr) {
    BinaryBroadcast(Binary::kMul, v, dy, kAllAxes, xhat, kAllAxes, product);
    Reduce(Reduction::kSum, {1, rows, cols}, 1.0f, product, dgamma, true);
  }
  if (dbeta != nullptr) Reduce(Reduction::kSum, {1, rows, cols}, 1.0f, dy, dbeta, true);
  if (dx == nullptr) return;
  // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma.
  float* g = t.Floats(n);
  float* mean_g = t.Floats(rows);
  float* mean_gx = t.Floats(rows);
  BinaryBroadcast(Binary::kMul, v, dy, kAllAxes, gamma, kMidAxis, g);
  Reduce(Reduction::kSum, v, 1.0f / cols, g, mean_g);
  BinaryBroadcast(Binary::kMul, v, g, kAllAxes, xhat, kAllAxes, product);
  Reduce(Reduction::kSum, v, 1.0f / cols, product, mean_gx);
  BinaryBroadcast(Binary::kMul, v, xhat, kAllAxes, mean_gx, kOuterAxis, product);
  BinaryBroadcast(Binary::kSub, v, g, kAllAxes, product, kAllAxes, g);
  BinaryBroadcast(Binary::kSub, v, g, kAllAxes, mean_g, kOuterAxis, g);
  BinaryBroadcast(Binary::kMul, v, g, kAllAxes, rstd, kOuterAxis, dx, true);
}

void Backend::BatchNormStats(int64_t n, int64_t c, int64_t hw, const float* x, float* sums) {
  Temporaries t(*this);
  float* squares = t.Floats(n * c * hw);
  ChannelSums(*this, n, c, hw, x, sums);
  Unary(UnaryOp::kSquare, 0, 0, x, squares, n * c * hw);
  ChannelSums(*this, n, c, hw, squares, sums + c);
  Fill(sums + 2 * c, 1, static_cast<float>(n * hw));
}

void Backend::BatchNormMoments(int64_t c, float eps, float momentum, const float* sums, float* running_mean,
                               float* running_var, float* mean, float* rstd) {
  if (sums == nullptr) {
    Copy(running_mean, mean, c);
    Unary(UnaryOp::kAffine, 1.0f, eps, running_var, rstd, c);
    Unary(UnaryOp::kRsqrt, 0, 0, rstd, rstd, c);
    return;
  }
  const float* count = sums + 2 * c;
  Temporaries t(*this);
  float* var = t.Floats(c);
  float* other = t.Floats(c);
  BinaryBroadcast(Binary::kDiv, Flat(c), sums, kAllAxes, count, kScalarAxes, mean);
  BinaryBroadcast(Binary::kDiv, Flat(c), sums + c, kAllAxes, count, kScalarAxes, var);
  Unary(UnaryOp::kSquare, 0, 0, mean, other, c);
  BinaryBroadcast(Binary::kSub, Flat(c), var, kAllAxes, other, kAllAxes, var);
  Unary(UnaryOp::kRelu, 0, 0, var, var, c);
  Unary(UnaryOp::kAffine, 1.0f, eps, var, rstd, c);
  Unary(UnaryOp::kRsqrt, 0, 0, rstd, rstd, c);
  if (running_mean == nullptr) return;
  // running += momentum * (batch - running); the unbiased variance is var *
  // count / (count - 1) where count > 1, else var.
  BinaryBroadcast(Binary::kSub, Flat(c), mean, kAllAxes, running_mean, kAllAxes, other);
  Unary(UnaryOp::kAffine, momentum, 0.0f, other, running_mean, c, true);
  float* less_one = t.Floats(1);
  float* ratio = t.Floats(1);
  Unary(UnaryOp::kAffine, 1.0f, -1.0f, count, less_one, 1);
  Unary(UnaryOp::kClamp, FLT_MIN, kInfinity, less_one, ratio, 1);
  BinaryBroadcast(Binary::kDiv, Flat(1), count, kAllAxes, ratio, kAllAxes, ratio);
  SelectScalar(*this, less_one, ratio, 1.0f, ratio);
  BinaryBroadcast(Binary::kMul, Flat(c), var, kAllAxes, ratio, kScalarAxes, var);
  BinaryBroadcast(Binary::kSub, Flat(c), var, kAllAxes, running_var, kAllAxes, other);
  Unary(UnaryOp::kAffine, momentum, 0.0f, other, running_var, c, true);
}

void Backend::BatchNormApply(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean, const float* rstd,
                             const float* gamma, const float* beta, float* y) {
  // y = x * scale + shift, scale = gamma * rstd, shift = beta - mean * scale.
  Temporaries t(*this);
  float* scale = t.Floats(c);
  float* shift = t.Floats(c);
  BinaryBroadcast(Binary::kMul, Flat(c), gamma, kAllAxes, rstd, kAllAxes, scale);
  BinaryBroadcast(Binary::kMul, Flat(c), mean, kAllAxes, scale, kAllAxes, shift);
  BinaryBroadcast(Binary::kSub, Flat(c), beta, kAllAxes, shift, kAllAxes, shift);
  const View3 v{n, c, hw};
  BinaryBroadcast(Binary::kMul, v, x, kAllAxes, scale, kMidAxis, y);
  BinaryBroadcast(Binary::kAdd, v, y, kAllAxes, shift, kMidAxis, y);
}

namespace {

// xhat = (x - mean) * rstd over [n, c, hw], mean and rstd per channel.
void BatchNormXhat(Backend& b, int64_t n, int64_t c, int64_t hw, const float* x, const float* mean,
                   const float* rstd, float* xhat) {
  const View3 v{n, c, hw};
  b.BinaryBroadcast(Binary::kSub, v, x, kAllAxes, mean, kMidAxis, xhat);
  b.BinaryBroadcast(Binary::kMul, v, xhat, kAllAxes, rstd, kMidAxis, xhat);
}

}  // namespace

void Backend::BatchNormBackwardStats(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean,
                                     const float* rstd, const float* dy, float* sums) {
  Temporaries t(*this);
  float* xhat = t.Floats(n * c * hw);
  ChannelSums(*this, n, c, hw, dy, sums);
  BatchNormXhat(*this, n, c, hw, x, mean, rstd, xhat);
  BinaryBroadcast(Binary::kMul, Flat(n * c * hw), xhat, kAllAxes, dy, kAllAxes, xhat);
  ChannelSums(*this, n, c, hw, xhat, sums + c);
  Fill(sums + 2 * c, 1, static_cast<float>(n * hw));
}

void Backend::BatchNormBackwardApply(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean,
                                     const float* rstd, const float* gamma, const float* sums, const float* dy,
                                     float* dx) {
  const View3 v{n, c, hw};
  Temporaries t(*this);
  float* mean_dy = t.Floats(c);
  float* mean_dy_xhat = t.Floats(c);
  float* k = t.Floats(c);
  float* term = t.Floats(n * c * hw);
  BinaryBroadcast(Binary::kDiv, Flat(c), sums, kAllAxes, sums + 2 * c, kScalarAxes, mean_dy);
  BinaryBroadcast(Binary::kDiv, Flat(c), sums + c, kAllAxes, sums + 2 * c, kScalarAxes, mean_dy_xhat);
  BinaryBroadcast(Binary::kMul, Flat(c), gamma, kAllAxes, rstd, kAllAxes, k);
  // dx += k * (dy - mean_dy - xhat * mean_dy_xhat).
  BatchNormXhat(*this, n, c, hw, x, mean, rstd, term);
  BinaryBroadcast(Binary::kMul, v, term, kAllAxes, mean_dy_xhat, kMidAxis, term);
  BinaryBroadcast(Binary::kSub, v, dy, kAllAxes, term, kAllAxes, term);
  BinaryBroadcast(Binary::kSub, v, term, kAllAxes, mean_dy, kMidAxis, term);
  BinaryBroadcast(Binary::kMul, v, term, kAllAxes, k, kMidAxis, dx, true);
}

// --- Softmax family ------------------------------------------------------------------

void Backend::SoftmaxForward(int64_t rows, int64_t cols, const float* x, float* y, bool log) {
  const View3 v{rows, cols, 1};
  Temporaries t(*this);
  float* shifted = t.Floats(rows * cols);
  float* max = t.Floats(rows);
  float* lse = t.Floats(rows);
  // lse = max + log(sum exp(x - max)).
  Reduce(Reduction::kMax, v, 1.0f, x, max);
  BinaryBroadcast(Binary::kSub, v, x, kAllAxes, max, kOuterAxis, shifted);
  Unary(UnaryOp::kExp, 0, 0, shifted, shifted, rows * cols);
  Reduce(Reduction::kSum, v, 1.0f, shifted, lse);
  Unary(UnaryOp::kLog, 0, 0, lse, lse, rows);
  BinaryBroadcast(Binary::kAdd, Flat(rows), max, kAllAxes, lse, kAllAxes, lse);
  BinaryBroadcast(Binary::kSub, v, x, kAllAxes, lse, kOuterAxis, y);
  if (!log) Unary(UnaryOp::kExp, 0, 0, y, y, rows * cols);
}

void Backend::SoftmaxBackward(int64_t rows, int64_t cols, const float* y, const float* dy, float* dx, bool log) {
  const View3 v{rows, cols, 1};
  Temporaries t(*this);
  float* term = t.Floats(rows * cols);
  float* sum = t.Floats(rows);
  if (log) {
    // dx += dy - softmax * sum(dy).
    Reduce(Reduction::kSum, v, 1.0f, dy, sum);
    Unary(UnaryOp::kExp, 0, 0, y, term, rows * cols);
    BinaryBroadcast(Binary::kMul, v, term, kAllAxes, sum, kOuterAxis, term);
    BinaryBroadcast(Binary::kSub, v, dy, kAllAxes, term, kAllAxes, dx, true);
  } else {
    // dx += y * (dy - sum(dy * y)).
    BinaryBroadcast(Binary::kMul, v, dy, kAllAxes, y, kAllAxes, term);
    Reduce(Reduction::kSum, v, 1.0f, term, sum);
    BinaryBroadcast(Binary::kSub, v, dy, kAllAxes, sum, kOuterAxis, term);
    BinaryBroadcast(Binary::kMul, v, y, kAllAxes, term, kAllAxes, dx, true);
  }
}

void Backend::CrossEntropyForward(int64_t rows, int64_t cols, const float* x, const int32_t* labels, float* logp,
                                  float* loss) {
  SoftmaxForward(rows, cols, x, logp, /*log=*/true);
  Temporaries t(*this);
  float* picked = t.Floats(rows);
  Gather(rows, cols, 1, 1, logp, labels, picked);
  Reduce(Reduction::kSum, {1, rows, 1}, -1.0f / static_cast<float>(rows), picked, loss);
}

void Backend::CrossEntropyBackward(int64_t rows, int64_t cols, const float* logp, const int32_t* labels,
                                   const float* dloss, float* dx) {
  Temporaries t(*this);
  float* term = t.Floats(rows * cols);
  float* minus_one = t.Floats(rows);
  float* k = t.Floats(1);
  // dx += dloss / rows * (softmax - onehot).
  Unary(UnaryOp::kExp, 0, 0, logp, term, rows * cols);
  Fill(minus_one, rows, -1.0f);
  Scatter(rows, cols, 1, 1, labels, minus_one, term, /*add=*/true);
  Unary(UnaryOp::kAffine, 1.0f / static_cast<float>(rows), 0.0f, dloss, k, 1);
  BinaryBroadcast(Binary::kMul, Flat(rows * cols), term, kAllAxes, k, kScalarAxes, dx, true);
}

// --- Images --------------------------------------------------------------------------

void Backend::BytesToFloatPlanar(int64_t images, int64_t pixels, int64_t channels, float scale, const uint8_t* in,
                                 float* out) {
  BytesToPlanes(*this, images, pixels * channels, pixels, channels, scale, in, out);
}

// --- Row tables ------------------------------------------------------------------------

void Backend::GatherRows(int64_t rows, int64_t row_words, const float* table, int64_t count, const int32_t* indices,
                         float* out) {
  Gather(1, rows, row_words, count, table, indices, out);
}

void Backend::ScatterRows(int64_t rows, int64_t row_words, float* table, int64_t count, const int32_t* indices,
                          const float* values) {
  Scatter(1, rows, row_words, count, indices, values, table, /*add=*/false);
}

void Backend::GatherBytesToFloatPlanar(int64_t rows, int64_t row_words, const float* table, int64_t images,
                                       const int32_t* indices, int64_t pixels, int64_t channels, float scale,
                                       float* out) {
  Temporaries t(*this);
  float* picked = t.Floats(images * row_words);
  GatherRows(rows, row_words, table, images, indices, picked);
  BytesToPlanes(*this, images, 4 * row_words, pixels, channels, scale, reinterpret_cast<const uint8_t*>(picked), out);
}


// --- Optimizer kernels ---------------------------------------------------------------------

void Backend::ClipByNorm(float* x, int64_t n, float max_norm, float* norm) {
  Temporaries t(*this);
  float* value = t.Floats(1);
  float* factor = t.Floats(1);
  float* limit = t.Floats(1);
  SquaredNorm(x, n, value);
  Unary(UnaryOp::kSqrt, 0, 0, value, value, 1);
  if (norm != nullptr) Copy(value, norm, 1);
  // factor = max_norm / max(||x||, max_norm): 1 unless the norm exceeds it.
  Unary(UnaryOp::kClamp, std::max(max_norm, FLT_MIN), kInfinity, value, factor, 1);
  Fill(limit, 1, max_norm);
  BinaryBroadcast(Binary::kDiv, Flat(1), limit, kAllAxes, factor, kAllAxes, factor);
  BinaryBroadcast(Binary::kMul, Flat(n), x, kAllAxes, factor, kScalarAxes, x);
}

namespace {

// Adam's moments: m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2; then
// term = sqrt(v).
void AdamMoments(Backend& b, int64_t n, float beta1, float beta2, const float* grad, float* m, float* v,
                 float* term) {
  b.Unary(UnaryOp::kAffine, beta1, 0.0f, m, m, n);
  b.Unary(UnaryOp::kAffine, 1.0f - beta1, 0.0f, grad, m, n, true);
  b.Unary(UnaryOp::kSquare, 0, 0, grad, term, n);
  b.Unary(UnaryOp::kAffine, beta2, 0.0f, v, v, n);
  b.Unary(UnaryOp::kAffine, 1.0f - beta2, 0.0f, term, v, n, true);
  b.Unary(UnaryOp::kSqrt, 0, 0, v, term, n);
}

}  // namespace

void Backend::AdamUpdate(int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float c1,
                         float c2, const float* grad, float* param, float* m, float* v) {
  Temporaries t(*this);
  float* term = t.Floats(n);
  AdamMoments(*this, n, beta1, beta2, grad, m, v, term);
  // param -= lr * weight_decay * param + lr / c1 * m / (sqrt(v) / sqrt(c2) + eps).
  Unary(UnaryOp::kAffine, 1.0f / std::sqrt(c2), eps, term, term, n);
  BinaryBroadcast(Binary::kDiv, Flat(n), m, kAllAxes, term, kAllAxes, term);
  if (weight_decay != 0.0f) Unary(UnaryOp::kAffine, -lr * weight_decay, 0.0f, param, param, n, true);
  Unary(UnaryOp::kAffine, -lr / c1, 0.0f, term, param, n, true);
}

void Backend::AdamUpdateFromDevice(int64_t n, const float* hyper, float beta1, float beta2, float eps,
                                   float weight_decay, const float* grad, float* param, float* m, float* v) {
  Temporaries t(*this);
  float* term = t.Floats(n);
  // The per-step factors from hyper = {lr, c1, c2}, on the device:
  // k[0] = 1 / sqrt(c2), k[1] = -lr / c1, k[2] = -lr * weight_decay.
  float* k = t.Floats(3);
  Unary(UnaryOp::kSqrt, 0, 0, hyper + 2, k, 1);
  Unary(UnaryOp::kReciprocal, 0, 0, k, k, 1);
  BinaryBroadcast(Binary::kDiv, Flat(1), hyper, kAllAxes, hyper + 1, kAllAxes, k + 1);
  Unary(UnaryOp::kAffine, -1.0f, 0.0f, k + 1, k + 1, 1);
  Unary(UnaryOp::kAffine, -weight_decay, 0.0f, hyper, k + 2, 1);
  AdamMoments(*this, n, beta1, beta2, grad, m, v, term);
  // param -= lr * weight_decay * param + lr / c1 * m / (sqrt(v) / sqrt(c2) + eps), as AdamUpdate.
  BinaryBroadcast(Binary::kMul, Flat(n), term, kAllAxes, k, kScalarAxes, term);
  Unary(UnaryOp::kAffine, 1.0f, eps, term, term, n);
  BinaryBroadcast(Binary::kDiv, Flat(n), m, kAllAxes, term, kAllAxes, term);
  if (weight_decay != 0.0f) BinaryBroadcast(Binary::kMul, Flat(n), param, kAllAxes, k + 2, kScalarAxes, param, true);
  BinaryBroadcast(Binary::kMul, Flat(n), term, kAllAxes, k + 1, kScalarAxes, param, true);
}

void Backend::SgdUpdate(int64_t n, float lr, float momentum, float weight_decay, const float* grad, float* param,
                        float* buf) {
  Temporaries t(*this);
  float* g = t.Floats(n);
  // g = grad + weight_decay * param; buf = momentum * buf + g; param -= lr * buf.
  Unary(UnaryOp::kAffine, weight_decay, 0.0f, param, g, n);
  BinaryBroadcast(Binary::kAdd, Flat(n), grad, kAllAxes, g, kAllAxes, g);
  Unary(UnaryOp::kAffine, momentum, 0.0f, buf, buf, n);
  Unary(UnaryOp::kAffine, 1.0f, 0.0f, g, buf, n, true);
  Unary(UnaryOp::kAffine, -lr, 0.0f, buf, param, n, true);
}

void Backend::Polyak(int64_t n, float tau, const float* online, float* target) {
  Temporaries t(*this);
  float* difference = t.Floats(n);
  BinaryBroadcast(Binary::kSub, Flat(n), online, kAllAxes, target, kAllAxes, difference);
  Unary(UnaryOp::kAffine, tau, 0.0f, difference, target, n, true);
}

void Backend::TrustRatio(const float* w_squared, const float* u_squared, float coefficient, float weight_decay,
                         float* ratio) {
  Temporaries t(*this);
  float* w = t.Floats(1);
  float* u = t.Floats(1);
  float* denominator = t.Floats(1);
  float* both_positive = t.Floats(1);
  Unary(UnaryOp::kSqrt, 0, 0, w_squared, w, 1);
  Unary(UnaryOp::kSqrt, 0, 0, u_squared, u, 1);
  // coefficient * w / (u + weight_decay * w), or 1 unless w > 0 and u > 0.
  Unary(UnaryOp::kAffine, weight_decay, 0.0f, w, denominator, 1);
  BinaryBroadcast(Binary::kAdd, Flat(1), denominator, kAllAxes, u, kAllAxes, denominator);
  Unary(UnaryOp::kClamp, FLT_MIN, kInfinity, denominator, denominator, 1);
  BinaryBroadcast(Binary::kDiv, Flat(1), w, kAllAxes, denominator, kAllAxes, denominator);
  Unary(UnaryOp::kAffine, coefficient, 0.0f, denominator, denominator, 1);
  BinaryBroadcast(Binary::kMin, Flat(1), w, kAllAxes, u, kAllAxes, both_positive);
  SelectScalar(*this, both_positive, denominator, 1.0f, ratio);
}

void Backend::ScaleByScalar(float alpha, const float* scalar, float* x, int64_t n) {
  Temporaries t(*this);
  float* factor = t.Floats(1);
  Unary(UnaryOp::kAffine, alpha, 0.0f, scalar, factor, 1);
  BinaryBroadcast(Binary::kMul, Flat(n), x, kAllAxes, factor, kScalarAxes, x);
}

}  // namespace troupe::nn
