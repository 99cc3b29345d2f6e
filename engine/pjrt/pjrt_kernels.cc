// The core kernels of PjrtBackend (pjrt_backend.h): each call one Launch
// (launch.h) that writes its StableHLO ops into the step's program, or a
// program of its own; every composed kernel runs as nn::Backend's default
// over these. Holds the kernels' ops and nothing else: memory, recording,
// programs and steps are the backend's parts (pjrt_backend.h names them).
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "engine/pjrt/launch.h"
#include "engine/pjrt/pjrt_backend.h"
#include "engine/pjrt/stablehlo.h"

namespace troupe::pjrt {

using nn::ConvGeometry;
using nn::FusedActivation;

// --- Memory kernels -------------------------------------------------------------

void PjrtBackend::Fill(float* x, int64_t n, float value, float step) {
  KeepForFallback([=, this] { Fill(x, n, value, step); });
  if (n == 0) return;
  Launch l(*this);
  Function& f = l.f;
  // Zero (a gradient buffer's reset) as a constant, so XLA folds what adds
  // to it (a run-time zero it cannot); other values at run time.
  Value v = value == 0.0f ? f.Constant(0.0, "f32", {n}) : f.Splat(l.Scalar(value), {n});
  if (step != 0.0f) v = f.Add(v, f.Mul(f.Iota({n}, 0, "f32"), l.Scalar(step)));
  l.Write(x, v);
  l.Run();
}

void PjrtBackend::CopyBlocks(int64_t outer, int64_t len, const float* src, int64_t src_stride, int64_t src_offset,
                             float* dst, int64_t dst_stride, int64_t dst_offset, bool accumulate) {
  KeepForFallback([=, this] { CopyBlocks(outer, len, src, src_stride, src_offset, dst, dst_stride, dst_offset, accumulate); });
  if (outer == 0 || len == 0) return;
  Launch l(*this);
  Function& f = l.f;
  // The span from the first block's start to the last one's end, padded to
  // whole strides and viewed as [outer, stride].
  auto span = [&](const float* base, int64_t stride) {
    const int64_t count = (outer - 1) * stride + len;
    return f.Reshape(f.Pad(l.F32(base, {count}), l.Const(0.0), {0}, {outer * stride - count}), {outer, stride});
  };
  Value blocks = f.Slice(span(src + src_offset, src_stride), {0, 0}, {outer, len});
  float* out = dst + dst_offset;
  Value region = span(out, dst_stride);
  if (accumulate) blocks = f.Add(blocks, f.Slice(region, {0, 0}, {outer, len}));
  Value updated = f.UpdateSlice(region, blocks, {0, 0});
  const int64_t count = (outer - 1) * dst_stride + len;
  l.Write(out, f.Slice(f.Reshape(updated, {outer * dst_stride}), {0}, {count}));
  l.Run();
}

// --- Dense ------------------------------------------------------------------------

namespace {

// Matrix-multiply and convolution inputs in the backend's precision.
Value MatmulInput(Function& f, const Value& x, bool bfloat16) { return bfloat16 ? f.Convert(x, "bf16") : x; }

// A linear layer on a flattened image. XLA lays a convolution's output
// [n, c, h, w] out channels-last, so flattening it in (c, h, w) order, the
// engine's, is a transpose of the whole activation (and another of its
// gradient). The same products with the image flattened in (h, w, c) order
// and the weight's rows permuted to match move the weight instead, which is
// smaller than the activation at any batch worth a compiled step, and which
// XLA fuses with its slice out of the parameter buffer; the image's
// flattening is then free. The sums run over k in another order: the same
// math, not the same rounding.

// {c, h, w} of an image the program wrote as `d` = [rows, c, h, w] with
// c * h * w = k (a convolution's output read as the matrix [rows, k]);
// empty otherwise, or where there is nothing to reorder (one channel, or one
// pixel).
Dims ImageOf(const Dims& d, int64_t rows, int64_t k) {
  if (d.size() != 4 || d[0] != rows || d[1] * d[2] * d[3] != k || d[1] == 1 || d[2] * d[3] == 1) return {};
  return {d[1], d[2], d[3]};
}

// x [rows, c, h, w] -> [rows, h * w * c].
Value FlattenChannelsLast(Function& f, const Value& x) {
  return f.Reshape(f.Transpose(x, {0, 2, 3, 1}), {x.dims[0], x.dims[1] * x.dims[2] * x.dims[3]});
}

// A matrix whose rows are in (c, h, w) order -> the same rows in (h, w, c) order, and back.
Value RowsChannelsLast(Function& f, const Value& m, const Dims& chw) {
  const int64_t c = chw[0], h = chw[1], w = chw[2], cols = m.dims[1];
  return f.Reshape(f.Transpose(f.Reshape(m, {c, h, w, cols}), {1, 2, 0, 3}), {c * h * w, cols});
}
Value RowsChannelsFirst(Function& f, const Value& m, const Dims& chw) {
  const int64_t c = chw[0], h = chw[1], w = chw[2], cols = m.dims[1];
  return f.Reshape(f.Transpose(f.Reshape(m, {h, w, c, cols}), {2, 0, 1, 3}), {c * h * w, cols});
}

// A matrix whose columns are in (h, w, c) order -> the same columns in (c, h, w) order.
Value ColumnsChannelsFirst(Function& f, const Value& m, const Dims& chw) {
  const int64_t c = chw[0], h = chw[1], w = chw[2], rows = m.dims[0];
  return f.Reshape(f.Transpose(f.Reshape(m, {rows, h, w, c}), {0, 3, 1, 2}), {rows, c * h * w});
}

}  // namespace

void PjrtBackend::Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                       const float* b, float beta, float* c) {
  KeepForFallback([=, this] { Gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c); });
  if (m == 0 || n == 0) return;
  Launch l(*this);
  Function& f = l.f;
  Value product;
  if (k == 0) {
    product = f.Constant(0.0, "f32", {m, n});
  } else {
    // A linear layer's three products on a flattened image, channels-last
    // (above): y = x w (x the image), dx = dy w^T (w's rows noted by the
    // first as an image's), dw = x^T dy (x the image).
    Dims image;  // {c, h, w} of the image the product is on; empty: a plain product
    if (!trans_b) {
      image = trans_a ? ImageOf(l.WrittenDims(a, k * m), k, m) : ImageOf(l.WrittenDims(a, m * k), m, k);
    } else if (!trans_a) {
      image = l.ImageRows(b);
      if (image.size() != 3 || image[0] * image[1] * image[2] != n) image.clear();
    }
    // x w or x^T dy: x the image, flattened channels-last.
    Value av = !image.empty() && !trans_b
                   ? FlattenChannelsLast(f, l.F32(a, {trans_a ? k : m, image[0], image[1], image[2]}))
                   : l.F32(a, trans_a ? Dims{k, m} : Dims{m, k});
    Value bv = l.F32(b, trans_b ? Dims{n, k} : Dims{k, n});
    if (!image.empty() && !trans_a) {  // x w or dy w^T: w's rows permuted to match
      bv = RowsChannelsLast(f, bv, image);
      if (!trans_b) l.NoteImageRows(b, image);
    }
    product = f.Dot(MatmulInput(f, av, bfloat16_), MatmulInput(f, bv, bfloat16_), {trans_a ? 0 : 1},
                    {trans_b ? 1 : 0}, {}, {}, !bfloat16_);
    if (!image.empty() && trans_b) product = ColumnsChannelsFirst(f, product, image);
    if (!image.empty() && trans_a) product = RowsChannelsFirst(f, product, image);
  }
  if (alpha != 1.0f) product = f.Mul(l.Scalar(alpha), product);
  // beta == 0 never reads c (it may hold anything, NaN included).
  // beta 1 (accumulating into a gradient) adds c as it is.
  if (beta == 1.0f) {
    product = f.Add(product, l.F32(c, {m, n}));
  } else if (beta != 0.0f) {
    product = f.Add(product, f.Mul(l.Scalar(beta), l.F32(c, {m, n})));
  }
  l.Write(c, product);
  l.Run();
}

// --- Convolution --------------------------------------------------------------------
// XLA's convolution with explicit dimension numbers; the backward kernels are
// convolutions too (as JAX derives them): the input gradient a convolution of
// the stride-dilated output gradient with the flipped kernel, the weight
// gradient one of the input with the output gradient as a dilated kernel.

namespace {

constexpr std::string_view kNchw = "[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]";

// conv(x, w) for x [n, c, h, w], w [oc, c, kh, kw] -> [n, oc, oh, ow].
Value ConvForward(Function& f, const ConvGeometry& g, const Value& x, const Value& w, bool bf16) {
  return f.Convolution(MatmulInput(f, x, bf16), MatmulInput(f, w, bf16), kNchw, {g.n, g.oc, g.oh(), g.ow()},
                       {g.stride, g.stride}, {{g.pad, g.pad}, {g.pad, g.pad}}, {1, 1}, {1, 1}, !bf16);
}

// The adjoint of ConvForward in x: dy [n, oc, oh, ow] -> [n, c, h, w].
Value ConvInputGrad(Function& f, const ConvGeometry& g, const Value& dy, const Value& w, bool bf16) {
  const int64_t lo_h = g.kh - 1 - g.pad, lo_w = g.kw - 1 - g.pad;
  const int64_t hi_h = g.h + g.kh - 1 - lo_h - ((g.oh() - 1) * g.stride + 1);
  const int64_t hi_w = g.w + g.kw - 1 - lo_w - ((g.ow() - 1) * g.stride + 1);
  return f.Convolution(MatmulInput(f, dy, bf16), MatmulInput(f, f.Reverse(w, {2, 3}), bf16),
                       "[b, f, 0, 1]x[i, o, 0, 1]->[b, f, 0, 1]", {g.n, g.c, g.h, g.w}, {1, 1},
                       {{lo_h, hi_h}, {lo_w, hi_w}}, {g.stride, g.stride}, {1, 1}, !bf16);
}

// The adjoint of ConvForward in w: x [n, c, h, w], dy [n, oc, oh, ow] -> [oc, c, kh, kw].
Value ConvWeightGradOnce(Function& f, const ConvGeometry& g, const Value& x, const Value& dy, bool bf16) {
  const int64_t hi_h = g.kh + (g.oh() - 1) * g.stride - g.h - g.pad;
  const int64_t hi_w = g.kw + (g.ow() - 1) * g.stride - g.w - g.pad;
  return f.Convolution(MatmulInput(f, x, bf16), MatmulInput(f, dy, bf16), "[f, b, 0, 1]x[i, o, 0, 1]->[f, b, 0, 1]",
                       {g.oc, g.c, g.kh, g.kw}, {1, 1}, {{g.pad, hi_h}, {g.pad, hi_w}}, {1, 1},
                       {g.stride, g.stride}, !bf16);
}

}  // namespace

// Samples a chunk of the split weight gradient: the largest power of two
// whose contraction (samples * oh * ow) stays within 8,192 and whose input
// patches (samples * oh * ow * c * kh * kw floats) within 2^21, at least
// one; the whole batch (no split) where a chunk would be under 16 MFLOP.
// Measured on XLA's CPU plugin (2 cores): chunks of 4-8 samples ran the 3x3
// layers of 32 channels at 25x25 to 41x41 2-4x faster than one convolution,
// the fastest chunk's contraction 3,000-8,000 long at each size; a 4x4
// layer of 64 to 128 channels at 7x7 fastest in chunks of 16-32 samples
// (patches of 0.8-1.6 million floats, 2.9x); a network of 4 channels ran
// no faster split, and 8 updates of it in one program 8% slower
// (docs/benchmarks/learner.md).
int64_t ConvWeightGradSamples(const ConvGeometry& g) {
  const int64_t positions = std::max<int64_t>(1, g.oh() * g.ow());
  const int64_t patch = std::max<int64_t>(1, g.c * g.kh * g.kw);
  const int64_t most = std::min<int64_t>(8192 / positions, (int64_t{1} << 21) / (positions * patch));
  const auto samples = static_cast<int64_t>(std::bit_floor(static_cast<uint64_t>(std::max<int64_t>(1, most))));
  const double chunk_flops =
      2.0 * static_cast<double>(samples * positions) * static_cast<double>(g.c * g.oc * g.kh * g.kw);
  return samples >= g.n || chunk_flops < 16e6 ? g.n : samples;
}

namespace {

// The weight gradient as ConvWeightGradOnce, or (`split`) the sum of it over
// chunks of ConvWeightGradSamples(g) samples (the last one what is left).
Value ConvWeightGrad(Function& f, const ConvGeometry& g, const Value& x, const Value& dy, bool bf16, bool split) {
  const int64_t samples = split ? ConvWeightGradSamples(g) : g.n;
  if (samples >= g.n) return ConvWeightGradOnce(f, g, x, dy, bf16);
  Value sum;
  for (int64_t begin = 0; begin < g.n; begin += samples) {
    ConvGeometry chunk = g;
    chunk.n = std::min(samples, g.n - begin);
    const int64_t end = begin + chunk.n;
    const Value part = ConvWeightGradOnce(f, chunk, f.Slice(x, {begin, 0, 0, 0}, {end, g.c, g.h, g.w}),
                                          f.Slice(dy, {begin, 0, 0, 0}, {end, g.oc, g.oh(), g.ow()}), bf16);
    sum = begin == 0 ? part : f.Add(sum, part);
  }
  return sum;
}

Value AddChannelBias(Function& f, const Value& y, const Value& bias) {
  return f.Add(y, f.Broadcast(bias, y.dims, {1}));
}

}  // namespace

void PjrtBackend::Conv2dForward(const ConvGeometry& g, FusedActivation act, const float* x, const float* w,
                                const float* b, float* y) {
  KeepForFallback([=, this] { Conv2dForward(g, act, x, w, b, y); });
  Launch l(*this);
  Function& f = l.f;
  Value out = ConvForward(f, g, l.F32(x, {g.n, g.c, g.h, g.w}), l.F32(w, {g.oc, g.c, g.kh, g.kw}), bfloat16_);
  if (b != nullptr) out = AddChannelBias(f, out, l.F32(b, {g.oc}));
  if (act == FusedActivation::kRelu) out = f.Max(out, l.Const(0.0));
  l.Write(y, out);
  l.Run();
}

void PjrtBackend::Conv2dBackward(const ConvGeometry& g, FusedActivation act, const float* x, const float* w,
                                 const float* y, const float* dy, float* dx, float* dw, float* db) {
  KeepForFallback([=, this] { Conv2dBackward(g, act, x, w, y, dy, dx, dw, db); });
  Launch l(*this);
  Function& f = l.f;
  const Dims out_dims = {g.n, g.oc, g.oh(), g.ow()};
  Value d = l.F32(dy, out_dims);
  if (act == FusedActivation::kRelu) d = f.Select(f.Compare(l.F32(y, out_dims), l.Const(0.0), "GT"), d, l.Const(0.0));
  if (db != nullptr) l.Accumulate(db, f.Reduce(d, {0, 2, 3}));
  if (dx != nullptr) l.Accumulate(dx, ConvInputGrad(f, g, d, l.F32(w, {g.oc, g.c, g.kh, g.kw}), bfloat16_));
  if (dw != nullptr) {
    l.Accumulate(dw, ConvWeightGrad(f, g, l.F32(x, {g.n, g.c, g.h, g.w}), d, bfloat16_, split_weight_gradients_));
  }
  l.Run();
}

// --- Elementwise, reductions, gathers and conversions (the core) -------------------
// The composed kernels (nn::Backend's defaults) are chains of these; inside a
// compiled step XLA fuses the chain as it fused the single emitters they
// replaced.

namespace {

// The axes of the view [outer, mid, inner] an operand holds (nn::Axes), as
// its dimensions and where they go in the view.
void HeldAxes(const nn::View3& v, int axes, Dims* dims, std::vector<int64_t>* map) {
  const int64_t sizes[] = {v.outer, v.mid, v.inner};
  const int bits[] = {nn::kOuterAxis, nn::kMidAxis, nn::kInnerAxis};
  for (int a = 0; a < 3; ++a) {
    if ((axes & bits[a]) != 0) {
      dims->push_back(sizes[a]);
      map->push_back(a);
    }
  }
}

}  // namespace

Value PjrtBackend::ViewOperand(Launch& l, const float* p, const nn::View3& v, int axes) {
  Dims dims;
  std::vector<int64_t> map;
  HeldAxes(v, axes, &dims, &map);
  Value x = dims.empty() ? l.f.Reshape(l.F32(p, {1}), {}) : l.F32(p, dims);
  return l.f.Broadcast(x, {v.outer, v.mid, v.inner}, map);
}

void PjrtBackend::Unary(nn::UnaryOp op, float alpha, float beta, const float* x, float* y, int64_t n,
                        bool accumulate) {
  KeepForFallback([=, this] { Unary(op, alpha, beta, x, y, n, accumulate); });
  if (n == 0) return;
  Launch l(*this);
  Function& f = l.f;
  Value v = l.F32(x, {n});
  // Constants only where an op uses them (a kernel's text is its program).
  auto zero = [&] { return l.Const(0.0); };
  auto positive = [&] { return f.Compare(v, zero(), "GT"); };
  Value out;
  switch (op) {
    case nn::UnaryOp::kRelu:
      out = f.Select(positive(), v, zero());
      break;
    case nn::UnaryOp::kLeakyRelu:
      out = f.Select(positive(), v, f.Mul(l.Scalar(alpha), v));
      break;
    case nn::UnaryOp::kElu:
      out = f.Select(positive(), v, f.Mul(l.Scalar(alpha), f.Unary("exponential_minus_one", v)));
      break;
    case nn::UnaryOp::kTanh:
      out = f.Unary("tanh", v);
      break;
    case nn::UnaryOp::kSigmoid:
      out = f.Unary("logistic", v);
      break;
    case nn::UnaryOp::kSoftplus: {
      // log(1 + e^x), x itself above 20 (as the CPU backend).
      Value big = f.Compare(v, l.Const(20.0), "GT");
      out = f.Select(big, v, f.Unary("log_plus_one", f.Unary("exponential", f.Min(v, l.Const(20.0)))));
      break;
    }
    case nn::UnaryOp::kAffine:
      out = f.Mul(l.Scalar(alpha), v);
      if (beta != 0.0f) out = f.Add(out, l.Scalar(beta));
      break;
    case nn::UnaryOp::kClamp:
      out = f.Clamp(f.Splat(l.Scalar(alpha), {n}), v, f.Splat(l.Scalar(beta), {n}));
      break;
    case nn::UnaryOp::kExp:
      out = f.Unary("exponential", v);
      break;
    case nn::UnaryOp::kLog:
      out = f.Unary("log", v);
      break;
    case nn::UnaryOp::kSqrt:
      out = f.Unary("sqrt", v);
      break;
    case nn::UnaryOp::kRsqrt:
      out = f.Unary("rsqrt", v);
      break;
    case nn::UnaryOp::kReciprocal:
      out = f.Div(l.Const(1.0), v);
      break;
    case nn::UnaryOp::kSquare:
      out = f.Mul(v, v);
      break;
    case nn::UnaryOp::kAbs:
      out = f.Unary("abs", v);
      break;
    case nn::UnaryOp::kFloor:
      out = f.Unary("floor", v);
      break;
    case nn::UnaryOp::kStep:
      out = f.Select(positive(), l.Const(1.0), zero());
      break;
  }
  l.Store(y, out, accumulate);
  l.Run();
}

void PjrtBackend::UnaryBackward(nn::UnaryOp op, float alpha, float beta, const float* x, const float* y,
                                const float* dy, float* dx, int64_t n) {
  KeepForFallback([=, this] { UnaryBackward(op, alpha, beta, x, y, dy, dx, n); });
  // Floor and step: zero almost everywhere.
  if (n == 0 || dx == nullptr || op == nn::UnaryOp::kFloor || op == nn::UnaryOp::kStep) return;
  Launch l(*this);
  Function& f = l.f;
  Value d = l.F32(dy, {n}), zero = l.Const(0.0), one = l.Const(1.0);
  auto in = [&] { return l.F32(x, {n}); };
  auto out = [&] { return l.F32(y, {n}); };
  auto positive = [&] { return f.Compare(in(), zero, "GT"); };
  Value grad;
  switch (op) {
    case nn::UnaryOp::kRelu:
      grad = f.Select(positive(), d, zero);
      break;
    case nn::UnaryOp::kLeakyRelu:
      grad = f.Select(positive(), d, f.Mul(l.Scalar(alpha), d));
      break;
    case nn::UnaryOp::kElu:
      // d/dx alpha * (e^x - 1) = y + alpha.
      grad = f.Select(positive(), d, f.Mul(f.Add(out(), l.Scalar(alpha)), d));
      break;
    case nn::UnaryOp::kTanh: {
      Value o = out();
      grad = f.Mul(f.Sub(one, f.Mul(o, o)), d);
      break;
    }
    case nn::UnaryOp::kSigmoid: {
      Value o = out();
      grad = f.Mul(f.Mul(o, f.Sub(one, o)), d);
      break;
    }
    case nn::UnaryOp::kSoftplus:
      grad = f.Mul(f.Unary("logistic", in()), d);
      break;
    case nn::UnaryOp::kAffine:
      grad = f.Mul(l.Scalar(alpha), d);
      break;
    case nn::UnaryOp::kClamp: {
      Value v = in();
      Value inside = f.Binary("and", f.Compare(v, f.Splat(l.Scalar(alpha), {n}), "GE"),
                              f.Compare(v, f.Splat(l.Scalar(beta), {n}), "LE"));
      grad = f.Select(inside, d, zero);
      break;
    }
    case nn::UnaryOp::kExp:
      grad = f.Mul(out(), d);
      break;
    case nn::UnaryOp::kLog:
      grad = f.Div(d, in());
      break;
    case nn::UnaryOp::kSqrt:
      grad = f.Div(f.Mul(l.Const(0.5), d), out());
      break;
    case nn::UnaryOp::kRsqrt: {
      Value o = out();
      grad = f.Mul(f.Mul(l.Const(-0.5), f.Mul(o, f.Mul(o, o))), d);
      break;
    }
    case nn::UnaryOp::kReciprocal: {
      Value o = out();
      grad = f.Mul(f.Unary("negate", f.Mul(o, o)), d);
      break;
    }
    case nn::UnaryOp::kSquare:
      grad = f.Mul(f.Mul(l.Const(2.0), in()), d);
      break;
    case nn::UnaryOp::kAbs:
      grad = f.Mul(f.Unary("sign", in()), d);
      break;
    case nn::UnaryOp::kFloor:
    case nn::UnaryOp::kStep:
      return;  // (returned above)
  }
  l.Accumulate(dx, grad);
  l.Run();
}

void PjrtBackend::BinaryBroadcast(nn::Binary op, const nn::View3& v, const float* a, int a_axes, const float* b,
                                  int b_axes, float* y, bool accumulate) {
  KeepForFallback([=, this] { BinaryBroadcast(op, v, a, a_axes, b, b_axes, y, accumulate); });
  if (v.size() == 0) return;
  Launch l(*this);
  Function& f = l.f;
  Value p = ViewOperand(l, a, v, a_axes), q = ViewOperand(l, b, v, b_axes);
  static constexpr std::string_view kOps[] = {"add", "subtract", "multiply", "divide", "maximum", "minimum"};
  Value out = f.Binary(kOps[static_cast<int>(op)], p, q);
  l.Store(y, out, accumulate);
  l.Run();
}

void PjrtBackend::Reduce(nn::Reduction op, const nn::View3& v, float scale, const float* x, float* y,
                         bool accumulate) {
  KeepForFallback([=, this] { Reduce(op, v, scale, x, y, accumulate); });
  if (v.outer * v.inner == 0) return;
  Launch l(*this);
  Function& f = l.f;
  const bool max = op == nn::Reduction::kMax;
  Value out = v.mid == 0 ? f.Constant(max ? -3.4028234663852886e38 : 0.0, "f32", {v.outer, v.inner})
                         : f.Reduce(l.F32(x, {v.outer, v.mid, v.inner}), {1}, max ? "maximum" : "add");
  if (scale != 1.0f) out = f.Mul(l.Scalar(scale), out);
  l.Store(y, out, accumulate);
  l.Run();
}

namespace {

// The index vectors (o, indices[o, j]) [outer, out, 2] of a gather or
// scatter along the middle axis of [outer, in, inner].
Value MiddleAxisPlaces(Function& f, const Value& indices, int64_t outer, int64_t out) {
  return f.Concatenate({f.Iota({outer, out, 1}, 0, "i32"), f.Reshape(indices, {outer, out, 1})}, 2);
}

}  // namespace

// Gathers move i32 bits (no float op may touch a frame's bytes); a
// replacing scatter stores its f32 updates as they are (a store, no float
// op: bit for bit, PjrtKernelTest) straight into x, so that XLA updates x in
// place: a bitcast of x to i32 first made it copy the whole of x (the 2 GiB
// device frame table) per scatter. The indices are run-time data, so a
// step's program does not change with the rows it picks.
void PjrtBackend::Gather(int64_t outer, int64_t in, int64_t inner, int64_t out, const float* x,
                         const int32_t* indices, float* y) {
  KeepForFallback([=, this] { Gather(outer, in, inner, out, x, indices, y); });
  if (outer * out * inner == 0) return;
  Launch l(*this);
  Function& f = l.f;
  const Dims dims = {outer, in, inner};
  Value bits = f.BitcastConvert(l.F32(x, dims), dims, "i32");
  Value places = MiddleAxisPlaces(f, l.I32(indices, {outer, out}), outer, out);
  Value picked = f.Gather(bits, places, /*offset_dims=*/{2}, /*collapsed=*/{0, 1}, /*start_index_map=*/{0, 1},
                          /*slice_sizes=*/{1, 1, inner});
  l.Write(y, f.BitcastConvert(picked, {outer, out, inner}, "f32"));
  l.Run();
}

void PjrtBackend::Scatter(int64_t outer, int64_t in, int64_t inner, int64_t out, const int32_t* indices,
                          const float* values, float* x, bool add) {
  KeepForFallback([=, this] { Scatter(outer, in, inner, out, indices, values, x, add); });
  if (outer * out * inner == 0) return;
  Launch l(*this);
  Function& f = l.f;
  const Dims dims = {outer, in, inner}, update_dims = {outer, out, inner};
  Value places = MiddleAxisPlaces(f, l.I32(indices, {outer, out}), outer, out);
  if (add) {
    l.Write(x, f.ScatterAdd(l.F32(x, dims), places, l.F32(values, update_dims), /*window_dims=*/{2},
                            /*inserted=*/{0, 1}, /*index_map=*/{0, 1}));
  } else {
    l.Write(x, f.ScatterReplace(l.F32(x, dims), places, l.F32(values, update_dims), {2}, {0, 1}, {0, 1}));
  }
  l.Run();
}

void PjrtBackend::Convert(nn::DType from, const void* x, nn::DType to, void* y, int64_t n, float scale) {
  KeepForFallback([=, this] { Convert(from, x, to, y, n, scale); });
  if (n == 0) return;
  if (to == nn::DType::kU8) {
    std::fprintf(stderr, "PJRT backend: Convert to uint8 is not offered\n");
    std::abort();
  }
  Launch l(*this);
  Function& f = l.f;
  Value v = from == nn::DType::kU8    ? f.Convert(l.Read(x, {n}, "ui8"), "f32")
            : from == nn::DType::kI32 ? f.Convert(l.Read(x, {n}, "i32"), "f32")
                                      : l.Read(x, {n}, "f32");
  if (scale != 1.0f) v = f.Mul(l.Scalar(scale), v);
  if (to == nn::DType::kI32) v = f.BitcastConvert(f.Convert(v, "i32"), {n}, "f32");
  l.Write(y, v);
  l.Run();
}

// --- Fused kernels kept (measured or plainly better than the composed default) ---

// uint8 frames to float planes: a convert and a transpose. The composed
// default transposes with a gather whose index table is as large as the
// batch (one index per element); XLA lowers a transpose to a copy loop.
void PjrtBackend::BytesToFloatPlanar(int64_t images, int64_t pixels, int64_t channels, float scale,
                                     const uint8_t* in, float* out) {
  KeepForFallback([=, this] { BytesToFloatPlanar(images, pixels, channels, scale, in, out); });
  if (images * pixels * channels == 0) return;
  Launch l(*this);
  l.Write(out, Planes(l, l.Read(in, {images, pixels * channels}, "ui8"), pixels, channels, scale));
  l.Run();
}

// The same inside the gather of the frame table's rows (a learner step's
// first layer): the rows as i32 words, their bytes, then as above.
void PjrtBackend::GatherBytesToFloatPlanar(int64_t rows, int64_t row_words, const float* table, int64_t images,
                                           const int32_t* indices, int64_t pixels, int64_t channels, float scale,
                                           float* out) {
  KeepForFallback([=, this] { GatherBytesToFloatPlanar(rows, row_words, table, images, indices, pixels, channels, scale, out); });
  if (images * pixels * channels == 0) return;
  Launch l(*this);
  Function& f = l.f;
  Value bits = f.BitcastConvert(l.F32(table, {rows, row_words}), {rows, row_words}, "i32");
  Value at = f.Reshape(l.I32(indices, {images}), {images, 1});
  Value picked = f.Gather(bits, at, /*offset_dims=*/{1}, /*collapsed=*/{0}, /*start_index_map=*/{0}, {1, row_words});
  // Words to their bytes (little-endian, as the host wrote them), the image's first pixels * channels.
  Value bytes = f.Reshape(f.BitcastConvert(picked, {images, row_words, 4}, "ui8"), {images, 4 * row_words});
  if (4 * row_words != pixels * channels) bytes = f.Slice(bytes, {0, 0}, {images, pixels * channels});
  l.Write(out, Planes(l, bytes, pixels, channels, scale));
  l.Run();
}

Value PjrtBackend::Planes(Launch& l, const Value& bytes, int64_t pixels, int64_t channels, float scale) {
  Function& f = l.f;
  const int64_t images = bytes.dims[0];
  Value values = f.Convert(f.Reshape(bytes, {images, pixels, channels}), "f32");
  return f.Mul(l.Scalar(scale), f.Transpose(values, {0, 2, 1}));
}

}  // namespace troupe::pjrt
