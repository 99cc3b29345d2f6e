#include "engine/nn/ops.h"

#include <algorithm>
#include <cmath>

#include "common/status_macros.h"

namespace troupe::nn {
namespace {

bool RequiresGrad(Tape& t, Var v) { return v.valid() && t.value(v).requires_grad; }
float* GradOrNull(Tape& t, int id) { return id >= 0 && t.value(id).requires_grad ? t.value(id).grad : nullptr; }

// --- Dense ------------------------------------------------------------------

void MatMulBackward(Tape& t, const Node& n) {
  const int64_t m = n.i[0], k = n.i[1], cols = n.i[2];
  const Value& y = t.value(n.out);
  const Value& a = t.value(n.in[0]);
  const Value& b = t.value(n.in[1]);
  // da[m, k] += dy[m, n] b^T; db[k, n] += a^T dy.
  if (a.requires_grad) t.backend().Gemm(false, true, m, k, cols, 1.0f, y.grad, b.data, 1.0f, a.grad);
  if (b.requires_grad) t.backend().Gemm(true, false, k, cols, m, 1.0f, a.data, y.grad, 1.0f, b.grad);
  if (n.in[2] >= 0 && t.value(n.in[2]).requires_grad) {
    t.backend().RowBiasBackward(m, cols, y.grad, t.value(n.in[2]).grad);
  }
}

// --- Convolution ----------------------------------------------------------

ConvGeometry GeometryFromNode(const Node& n) {
  ConvGeometry g;
  g.n = n.i[0], g.c = n.i[1], g.h = n.i[2], g.w = n.i[3];
  g.oc = n.i[4], g.kh = n.i[5], g.kw = n.i[6], g.stride = n.i[7], g.pad = n.i[8];
  return g;
}

void StoreGeometry(const ConvGeometry& g, Node& n) {
  n.i[0] = g.n, n.i[1] = g.c, n.i[2] = g.h, n.i[3] = g.w;
  n.i[4] = g.oc, n.i[5] = g.kh, n.i[6] = g.kw, n.i[7] = g.stride, n.i[8] = g.pad;
}

// The weight gradient a conv kernel accumulates into: the weight's own, or
// zeroed scratch on the device for a frozen weight (the kernels need one).
float* WeightGradOrScratch(Tape& t, int weight) {
  if (float* dw = GradOrNull(t, weight)) return dw;
  const int64_t size = t.value(weight).shape.size();
  float* scratch = t.AllocateFloats(size);
  t.backend().Fill(scratch, size, 0.0f);
  return scratch;
}

void Conv2dBackwardNode(Tape& t, const Node& n) {
  const ConvGeometry g = GeometryFromNode(n);
  const Value& x = t.value(n.in[0]);
  const Value& w = t.value(n.in[1]);
  float* dw = WeightGradOrScratch(t, n.in[1]);
  const Value& y = t.value(n.out);
  t.backend().Conv2dBackward(g, static_cast<FusedActivation>(n.i[9]), x.data, w.data, y.data, y.grad,
                             GradOrNull(t, n.in[0]), dw, GradOrNull(t, n.in[2]));
}

void ConvTranspose2dBackwardNode(Tape& t, const Node& n) {
  const ConvGeometry g = GeometryFromNode(n);
  const Value& x = t.value(n.in[0]);
  const Value& w = t.value(n.in[1]);
  float* dw = WeightGradOrScratch(t, n.in[1]);
  t.backend().ConvTranspose2dBackward(g, x.data, w.data, t.value(n.out).grad, GradOrNull(t, n.in[0]), dw,
                                      GradOrNull(t, n.in[2]));
}

// Records the node of a convolution or a transposed one, y of x, w and b
// (b may be invalid), with its geometry and fused activation.
void RecordConvNode(Tape& t, BackwardFn backward, Var y, Var x, Var w, Var b, const ConvGeometry& g,
                    FusedActivation act) {
  Node n;
  n.backward = backward;
  n.out = y.id;
  n.in = {x.id, w.id, b.valid() ? b.id : -1, -1};
  StoreGeometry(g, n);
  n.i[9] = static_cast<int64_t>(act);
  t.Record(n);
}

// --- Elementwise ------------------------------------------------------------

void ActivationBackwardNode(Tape& t, const Node& n) {
  const Value& x = t.value(n.in[0]);
  const Value& y = t.value(n.out);
  t.backend().ActivationBackward(static_cast<Activation>(n.i[0]), n.f[0], x.data, y.data, y.grad, x.grad,
                                 y.shape.size());
}

Var ActivationOp(Var x, Activation f, float alpha) {
  Tape& t = *x.tape;
  Var y = t.NewValue(t.value(x).shape, RequiresGrad(t, x));
  t.backend().ActivationForward(f, alpha, t.value(x).data, t.value(y).data, t.value(x).shape.size());
  Node n;
  n.backward = ActivationBackwardNode;
  n.out = y.id;
  n.in[0] = x.id;
  n.i[0] = static_cast<int64_t>(f);
  n.f[0] = alpha;
  t.Record(n);
  return y;
}

void BinaryBackwardNode(Tape& t, const Node& n) {
  const Value& y = t.value(n.out);
  t.backend().BinaryBackward(static_cast<Binary>(n.i[0]), t.value(n.in[0]).data, t.value(n.in[1]).data, y.grad,
                             GradOrNull(t, n.in[0]), GradOrNull(t, n.in[1]), y.shape.size());
}

Var BinaryOp(Var a, Var b, Binary op) {
  Tape& t = *a.tape;
  TROUPE_CHECK(t.value(a).shape == t.value(b).shape);
  Var y = t.NewValue(t.value(a).shape, RequiresGrad(t, a) || RequiresGrad(t, b));
  t.backend().BinaryForward(op, t.value(a).data, t.value(b).data, t.value(y).data, t.value(a).shape.size());
  Node n;
  n.backward = BinaryBackwardNode;
  n.out = y.id;
  n.in[0] = a.id;
  n.in[1] = b.id;
  n.i[0] = static_cast<int64_t>(op);
  t.Record(n);
  return y;
}

void UnaryBackwardNode(Tape& t, const Node& n) {
  const Value& x = t.value(n.in[0]);
  const Value& y = t.value(n.out);
  t.backend().UnaryBackward(static_cast<UnaryOp>(n.i[0]), n.f[0], n.f[1], x.data, y.data, y.grad, x.grad,
                            y.shape.size());
}

Var UnaryVar(Var x, UnaryOp op, float alpha = 0.0f, float beta = 0.0f) {
  Tape& t = *x.tape;
  Var y = t.NewValue(t.value(x).shape, RequiresGrad(t, x));
  t.backend().Unary(op, alpha, beta, t.value(x).data, t.value(y).data, t.value(x).shape.size());
  Node n;
  n.backward = UnaryBackwardNode;
  n.out = y.id;
  n.in[0] = x.id;
  n.i[0] = static_cast<int64_t>(op);
  n.f[0] = alpha;
  n.f[1] = beta;
  t.Record(n);
  return y;
}

void MinimumBackwardNode(Tape& t, const Node& n) {
  // b_smaller = step(a - b): dy goes to b there, to a elsewhere.
  const Value& y = t.value(n.out);
  const int64_t count = y.shape.size();
  const View3 flat{1, count, 1};
  float* b_smaller = t.AllocateFloats(count);
  float* to_b = t.AllocateFloats(count);
  Backend& backend = t.backend();
  backend.BinaryBroadcast(Binary::kSub, flat, t.value(n.in[0]).data, kAllAxes, t.value(n.in[1]).data, kAllAxes,
                          b_smaller);
  backend.Unary(UnaryOp::kStep, 0.0f, 0.0f, b_smaller, b_smaller, count);
  backend.BinaryBroadcast(Binary::kMul, flat, b_smaller, kAllAxes, y.grad, kAllAxes, to_b);
  if (float* da = GradOrNull(t, n.in[0])) {
    backend.Axpy(1.0f, y.grad, da, count);
    backend.Axpy(-1.0f, to_b, da, count);
  }
  if (float* db = GradOrNull(t, n.in[1])) backend.Axpy(1.0f, to_b, db, count);
}

void ScaleBackwardNode(Tape& t, const Node& n) {
  const Value& y = t.value(n.out);
  t.backend().Axpy(n.f[0], y.grad, t.value(n.in[0]).grad, y.shape.size());
}

// --- Reductions ---------------------------------------------------------------

void SumBackwardNode(Tape& t, const Node& n) {
  // dx += scale * dy (a scalar broadcast).
  const Value& x = t.value(n.in[0]);
  t.backend().AddScalar(n.f[0], t.value(n.out).grad, x.grad, x.shape.size());
}

void SumAxisBackwardNode(Tape& t, const Node& n) {
  t.backend().SumAxisBackward(n.i[0], n.i[1], n.i[2], t.value(n.out).grad, t.value(n.in[0]).grad);
}

// --- Shape ---------------------------------------------------------------------

void CopyBlocksBackwardNode(Tape& t, const Node& n) {
  // Forward copied x's blocks into y at an offset: route dy's blocks back.
  // i: outer, len, x_stride, x_offset, y_stride, y_offset.
  t.backend().CopyBlocks(n.i[0], n.i[1], t.value(n.out).grad, n.i[4], n.i[5], t.value(n.in[0]).grad, n.i[2], n.i[3],
                         /*accumulate=*/true);
}

// --- Normalisation -------------------------------------------------------------

void LayerNormBackwardNode(Tape& t, const Node& n) {
  const Value& x = t.value(n.in[0]);
  t.backend().LayerNormBackward(n.i[0], n.i[1], x.data, t.value(n.in[1]).data, n.saved[0], n.saved[1],
                                t.value(n.out).grad, GradOrNull(t, n.in[0]), GradOrNull(t, n.in[1]),
                                GradOrNull(t, n.in[2]));
}

void BatchNormBackwardNode(Tape& t, const Node& n) {
  const int64_t batch = n.i[0], c = n.i[1], hw = n.i[2];
  const Value& x = t.value(n.in[0]);
  const Value& y = t.value(n.out);
  const float* gamma = t.value(n.in[1]).data;
  float* sums = n.saved[2];
  t.backend().BatchNormBackwardStats(batch, c, hw, x.data, n.saved[0], n.saved[1], y.grad, sums);
  // Parameter gradients use this replica's sums (the optimizer averages them);
  // dx needs the global ones.
  if (float* dbeta = GradOrNull(t, n.in[2])) t.backend().Axpy(1.0f, sums, dbeta, c);
  if (float* dgamma = GradOrNull(t, n.in[1])) t.backend().Axpy(1.0f, sums + c, dgamma, c);
  if (float* dx = GradOrNull(t, n.in[0])) {
    // The sums and their element count, summed across replicas together.
    if (auto* reducer = static_cast<CrossReplicaSum*>(n.mutable_ptr)) reducer->SumOnDevice(t.backend(), sums, 2 * c + 1);
    t.backend().BatchNormBackwardApply(batch, c, hw, x.data, n.saved[0], n.saved[1], gamma, sums, y.grad, dx);
  }
}

// --- Softmax family ---------------------------------------------------------------

void SoftmaxBackwardNode(Tape& t, const Node& n) {
  const Value& y = t.value(n.out);
  t.backend().SoftmaxBackward(n.i[0], n.i[1], y.data, y.grad, t.value(n.in[0]).grad, n.i[2] != 0);
}

void CrossEntropyBackwardNode(Tape& t, const Node& n) {
  t.backend().CrossEntropyBackward(n.i[0], n.i[1], n.saved[0], static_cast<const int32_t*>(n.ptr),
                                   t.value(n.out).grad, t.value(n.in[0]).grad);
}

}  // namespace

Var MatMul(Var a, Var b) { return Linear(a, b, Var{}); }

Var Linear(Var x, Var w, Var b) {
  Tape& t = *x.tape;
  const Shape& xs = t.value(x).shape;
  const Shape& ws = t.value(w).shape;
  TROUPE_CHECK(xs.rank() == 2 && ws.rank() == 2 && xs[1] == ws[0]);
  const int64_t m = xs[0], k = xs[1], cols = ws[1];
  if (b.valid()) TROUPE_CHECK(t.value(b).shape.size() == cols);
  Var y = t.NewValue({m, cols}, RequiresGrad(t, x) || RequiresGrad(t, w) || RequiresGrad(t, b));
  float* yd = t.value(y).data;
  t.backend().Gemm(false, false, m, cols, k, 1.0f, t.value(x).data, t.value(w).data, 0.0f, yd);
  if (b.valid()) t.backend().AddRowBias(m, cols, t.value(b).data, yd);
  Node n;
  n.backward = MatMulBackward;
  n.out = y.id;
  n.in = {x.id, w.id, b.valid() ? b.id : -1, -1};
  n.i[0] = m, n.i[1] = k, n.i[2] = cols;
  t.Record(n);
  return y;
}

Var Conv2d(Var x, Var w, Var b, int64_t stride, int64_t pad, FusedActivation act) {
  Tape& t = *x.tape;
  const Shape& xs = t.value(x).shape;
  const Shape& ws = t.value(w).shape;
  TROUPE_CHECK(xs.rank() == 4 && ws.rank() == 4 && xs[1] == ws[1] && stride >= 1 && pad >= 0);
  ConvGeometry g;
  g.n = xs[0], g.c = xs[1], g.h = xs[2], g.w = xs[3];
  g.oc = ws[0], g.kh = ws[2], g.kw = ws[3], g.stride = stride, g.pad = pad;
  TROUPE_CHECK(g.oh() > 0 && g.ow() > 0);
  if (b.valid()) TROUPE_CHECK(t.value(b).shape.size() == g.oc);
  Var y = t.NewValue({g.n, g.oc, g.oh(), g.ow()}, RequiresGrad(t, x) || RequiresGrad(t, w) || RequiresGrad(t, b));
  t.backend().Conv2dForward(g, act, t.value(x).data, t.value(w).data, b.valid() ? t.value(b).data : nullptr,
                            t.value(y).data);
  RecordConvNode(t, Conv2dBackwardNode, y, x, w, b, g, act);
  return y;
}

Var ConvTranspose2d(Var x, Var w, Var b, int64_t stride, int64_t pad, int64_t output_pad) {
  Tape& t = *x.tape;
  const Shape& xs = t.value(x).shape;
  const Shape& ws = t.value(w).shape;
  TROUPE_CHECK(xs.rank() == 4 && ws.rank() == 4 && xs[1] == ws[0] && stride >= 1 && pad >= 0);
  TROUPE_CHECK(output_pad >= 0 && output_pad < stride);
  // Describe the convolution this is the adjoint of: its input is our output.
  ConvGeometry g;
  g.n = xs[0], g.oc = ws[0], g.c = ws[1], g.kh = ws[2], g.kw = ws[3], g.stride = stride, g.pad = pad;
  g.h = (xs[2] - 1) * stride - 2 * pad + g.kh + output_pad;
  g.w = (xs[3] - 1) * stride - 2 * pad + g.kw + output_pad;
  TROUPE_CHECK(g.h > 0 && g.w > 0 && g.oh() == xs[2] && g.ow() == xs[3]);
  if (b.valid()) TROUPE_CHECK(t.value(b).shape.size() == g.c);
  Var y = t.NewValue({g.n, g.c, g.h, g.w}, RequiresGrad(t, x) || RequiresGrad(t, w) || RequiresGrad(t, b));
  t.backend().ConvTranspose2dForward(g, t.value(x).data, t.value(w).data, b.valid() ? t.value(b).data : nullptr,
                                     t.value(y).data);
  RecordConvNode(t, ConvTranspose2dBackwardNode, y, x, w, b, g, FusedActivation::kNone);
  return y;
}

Var Relu(Var x) { return ActivationOp(x, Activation::kRelu, 0.0f); }
Var LeakyRelu(Var x, float negative_slope) { return ActivationOp(x, Activation::kLeakyRelu, negative_slope); }
Var Elu(Var x, float alpha) { return ActivationOp(x, Activation::kElu, alpha); }
Var Tanh(Var x) { return ActivationOp(x, Activation::kTanh, 0.0f); }
Var Sigmoid(Var x) { return ActivationOp(x, Activation::kSigmoid, 0.0f); }
Var Softplus(Var x) { return ActivationOp(x, Activation::kSoftplus, 0.0f); }

Var Add(Var a, Var b) { return BinaryOp(a, b, Binary::kAdd); }
Var Sub(Var a, Var b) { return BinaryOp(a, b, Binary::kSub); }
Var Mul(Var a, Var b) { return BinaryOp(a, b, Binary::kMul); }

Var Exp(Var x) { return UnaryVar(x, UnaryOp::kExp); }
Var Square(Var x) { return UnaryVar(x, UnaryOp::kSquare); }
Var Clamp(Var x, float lo, float hi) {
  TROUPE_CHECK(lo <= hi);
  return UnaryVar(x, UnaryOp::kClamp, lo, hi);
}

Var Minimum(Var a, Var b) {
  Tape& t = *a.tape;
  TROUPE_CHECK(t.value(a).shape == t.value(b).shape);
  Var y = t.NewValue(t.value(a).shape, RequiresGrad(t, a) || RequiresGrad(t, b));
  t.backend().BinaryForward(Binary::kMin, t.value(a).data, t.value(b).data, t.value(y).data, t.value(a).shape.size());
  Node n;
  n.backward = MinimumBackwardNode;
  n.out = y.id;
  n.in[0] = a.id;
  n.in[1] = b.id;
  t.Record(n);
  return y;
}

namespace {
void CopyToModelParallelBackward(Tape& t, const Node& n) {
  // y's gradient is final here (every node that read y has run): summed in
  // place, then added to x's.
  const Value& y = t.value(n.out);
  const int64_t count = y.shape.size();
  static_cast<CrossReplicaSum*>(n.mutable_ptr)->SumOnDevice(t.backend(), y.grad, count);
  t.backend().Axpy(1.0f, y.grad, t.value(n.in[0]).grad, count);
}
void ReduceFromModelParallelBackward(Tape& t, const Node& n) {
  const Value& y = t.value(n.out);
  t.backend().Axpy(1.0f, y.grad, t.value(n.in[0]).grad, y.shape.size());
}
Var ModelParallelOp(Var x, CrossReplicaSum* group, bool reduce) {
  Tape& t = *x.tape;
  Var y = t.NewValue(t.value(x).shape, RequiresGrad(t, x));
  const int64_t count = t.value(x).shape.size();
  t.backend().Copy(t.value(x).data, t.value(y).data, count);
  if (reduce) group->SumOnDevice(t.backend(), t.value(y).data, count);
  Node n;
  n.backward = reduce ? ReduceFromModelParallelBackward : CopyToModelParallelBackward;
  n.out = y.id;
  n.in[0] = x.id;
  n.mutable_ptr = group;
  t.Record(n);
  return y;
}
}  // namespace

Var CopyToModelParallel(Var x, CrossReplicaSum* group) { return ModelParallelOp(x, group, /*reduce=*/false); }
Var ReduceFromModelParallel(Var x, CrossReplicaSum* group) { return ModelParallelOp(x, group, /*reduce=*/true); }

Var Scale(Var x, float alpha) {
  Tape& t = *x.tape;
  Var y = t.NewValue(t.value(x).shape, RequiresGrad(t, x));
  t.backend().Scale(alpha, t.value(x).data, t.value(y).data, t.value(x).shape.size());
  Node n;
  n.backward = ScaleBackwardNode;
  n.out = y.id;
  n.in[0] = x.id;
  n.f[0] = alpha;
  t.Record(n);
  return y;
}

namespace {
Var SumScaled(Var x, float scale) {
  Tape& t = *x.tape;
  Var y = t.NewValue(Shape{}, RequiresGrad(t, x));
  t.backend().Sum(t.value(x).data, t.value(x).shape.size(), scale, t.value(y).data);
  Node n;
  n.backward = SumBackwardNode;
  n.out = y.id;
  n.in[0] = x.id;
  n.f[0] = scale;
  t.Record(n);
  return y;
}
}  // namespace

Var Sum(Var x) { return SumScaled(x, 1.0f); }
Var Mean(Var x) { return SumScaled(x, 1.0f / static_cast<float>(x.tape->value(x).shape.size())); }

Var SumAxis(Var x, int axis) {
  Tape& t = *x.tape;
  const Shape& s = t.value(x).shape;
  TROUPE_CHECK(axis >= 0 && axis < s.rank());
  const int64_t outer = s.Product(0, axis), reduce = s[axis], inner = s.Product(axis + 1, s.rank());
  std::array<int64_t, kMaxRank> dims{};
  int r = 0;
  for (int i = 0; i < s.rank(); ++i) {
    if (i != axis) dims[r++] = s[i];
  }
  Shape out;
  switch (r) {
    case 0: out = Shape{}; break;
    case 1: out = Shape{dims[0]}; break;
    case 2: out = Shape{dims[0], dims[1]}; break;
    default: out = Shape{dims[0], dims[1], dims[2]}; break;
  }
  Var y = t.NewValue(out, RequiresGrad(t, x));
  t.backend().SumAxis(outer, reduce, inner, t.value(x).data, t.value(y).data);
  Node n;
  n.backward = SumAxisBackwardNode;
  n.out = y.id;
  n.in[0] = x.id;
  n.i[0] = outer, n.i[1] = reduce, n.i[2] = inner;
  t.Record(n);
  return y;
}

Var MeanSquaredError(Var prediction, Var target) {
  Var d = Sub(prediction, target);
  return Mean(Mul(d, d));
}

Var Reshape(Var x, Shape shape) { return x.tape->Alias(x, shape); }

Var Flatten(Var x) {
  const Shape& s = x.tape->value(x).shape;
  return Reshape(x, {s[0], s.Product(1, s.rank())});
}

Var Concat(std::span<const Var> parts, int axis) {
  TROUPE_CHECK(!parts.empty());
  Tape& t = *parts[0].tape;
  const Shape first = t.value(parts[0]).shape;
  TROUPE_CHECK(axis >= 0 && axis < first.rank());
  int64_t total = 0;
  bool requires_grad = false;
  for (Var p : parts) {
    const Shape& s = t.value(p).shape;
    TROUPE_CHECK(s.rank() == first.rank());
    for (int i = 0; i < s.rank(); ++i) TROUPE_CHECK(i == axis || s[i] == first[i]);
    total += s[axis];
    requires_grad |= RequiresGrad(t, p);
  }
  std::array<int64_t, kMaxRank> dims{};
  for (int i = 0; i < first.rank(); ++i) dims[i] = i == axis ? total : first[i];
  Shape out;
  switch (first.rank()) {
    case 1: out = Shape{dims[0]}; break;
    case 2: out = Shape{dims[0], dims[1]}; break;
    case 3: out = Shape{dims[0], dims[1], dims[2]}; break;
    default: out = Shape{dims[0], dims[1], dims[2], dims[3]}; break;
  }
  Var y = t.NewValue(out, requires_grad);
  const int64_t outer = first.Product(0, axis), inner = first.Product(axis + 1, first.rank());
  int64_t offset = 0;
  for (Var p : parts) {
    const int64_t len = t.value(p).shape[axis] * inner;
    t.backend().CopyBlocks(outer, len, t.value(p).data, len, 0, t.value(y).data, total * inner, offset, false);
    // One node per part routes its slice of dy back.
    Node n;
    n.backward = CopyBlocksBackwardNode;
    n.out = y.id;
    n.in[0] = p.id;
    n.i[0] = outer, n.i[1] = len, n.i[2] = len, n.i[3] = 0, n.i[4] = total * inner, n.i[5] = offset;
    if (RequiresGrad(t, p)) t.Record(n);
    offset += len;
  }
  return y;
}

Var Slice(Var x, int axis, int64_t begin, int64_t end) {
  Tape& t = *x.tape;
  const Shape s = t.value(x).shape;
  TROUPE_CHECK(axis >= 0 && axis < s.rank() && 0 <= begin && begin < end && end <= s[axis]);
  std::array<int64_t, kMaxRank> dims{};
  for (int i = 0; i < s.rank(); ++i) dims[i] = i == axis ? end - begin : s[i];
  Shape out;
  switch (s.rank()) {
    case 1: out = Shape{dims[0]}; break;
    case 2: out = Shape{dims[0], dims[1]}; break;
    case 3: out = Shape{dims[0], dims[1], dims[2]}; break;
    default: out = Shape{dims[0], dims[1], dims[2], dims[3]}; break;
  }
  Var y = t.NewValue(out, RequiresGrad(t, x));
  const int64_t outer = s.Product(0, axis), inner = s.Product(axis + 1, s.rank());
  const int64_t len = (end - begin) * inner, x_stride = s[axis] * inner, x_offset = begin * inner;
  t.backend().CopyBlocks(outer, len, t.value(x).data, x_stride, x_offset, t.value(y).data, len, 0, false);
  Node n;
  n.backward = CopyBlocksBackwardNode;
  n.out = y.id;
  n.in[0] = x.id;
  n.i[0] = outer, n.i[1] = len, n.i[2] = x_stride, n.i[3] = x_offset, n.i[4] = len, n.i[5] = 0;
  t.Record(n);
  return y;
}

Var LayerNorm(Var x, Var gamma, Var beta, float eps) {
  Tape& t = *x.tape;
  const Shape& s = t.value(x).shape;
  const int64_t cols = s[s.rank() - 1], rows = s.size() / cols;
  TROUPE_CHECK(t.value(gamma).shape.size() == cols && t.value(beta).shape.size() == cols);
  Var y = t.NewValue(s, RequiresGrad(t, x) || RequiresGrad(t, gamma) || RequiresGrad(t, beta));
  Node n;
  n.saved[0] = t.AllocateFloats(rows);
  n.saved[1] = t.AllocateFloats(rows);
  t.backend().LayerNormForward(rows, cols, eps, t.value(x).data, t.value(gamma).data, t.value(beta).data,
                               t.value(y).data, n.saved[0], n.saved[1]);
  n.backward = LayerNormBackwardNode;
  n.out = y.id;
  n.in = {x.id, gamma.id, beta.id, -1};
  n.i[0] = rows, n.i[1] = cols;
  t.Record(n);
  return y;
}

Var BatchNorm(Var x, Var gamma, Var beta, BatchNormState state, bool training, float eps,
              CrossReplicaSum* cross_replica) {
  Tape& t = *x.tape;
  const Shape& s = t.value(x).shape;
  TROUPE_CHECK(s.rank() == 2 || s.rank() == 4);
  const int64_t batch = s[0], c = s[1], hw = s.Product(2, s.rank());
  TROUPE_CHECK(t.value(gamma).shape.size() == c && t.value(beta).shape.size() == c);
  Var y = t.NewValue(s, RequiresGrad(t, x) || RequiresGrad(t, gamma) || RequiresGrad(t, beta));
  Node n;
  float* mean = n.saved[0] = t.AllocateFloats(c);
  float* rstd = n.saved[1] = t.AllocateFloats(c);
  n.saved[2] = t.AllocateFloats(2 * c + 1);
  // Mean and rstd per channel, finished on the device.
  if (training) {
    // Batch statistics, summed across replicas with the element count.
    float* sums = t.AllocateFloats(2 * c + 1);
    t.backend().BatchNormStats(batch, c, hw, t.value(x).data, sums);
    if (cross_replica != nullptr) cross_replica->SumOnDevice(t.backend(), sums, 2 * c + 1);
    t.backend().BatchNormMoments(c, eps, state.momentum, sums, state.running_mean, state.running_var, mean, rstd);
  } else {
    TROUPE_CHECK(state.running_mean != nullptr && state.running_var != nullptr);
    t.backend().BatchNormMoments(c, eps, state.momentum, /*sums=*/nullptr, state.running_mean, state.running_var, mean,
                                 rstd);
  }
  t.backend().BatchNormApply(batch, c, hw, t.value(x).data, mean, rstd, t.value(gamma).data, t.value(beta).data,
                             t.value(y).data);
  n.backward = training ? BatchNormBackwardNode : nullptr;
  n.out = y.id;
  n.in = {x.id, gamma.id, beta.id, -1};
  n.i[0] = batch, n.i[1] = c, n.i[2] = hw;
  n.mutable_ptr = cross_replica;
  // Evaluation mode is not differentiated (it is not used for training).
  if (training) t.Record(n);
  return y;
}

namespace {
Var SoftmaxOp(Var x, bool log) {
  Tape& t = *x.tape;
  const Shape& s = t.value(x).shape;
  const int64_t cols = s[s.rank() - 1], rows = s.size() / cols;
  Var y = t.NewValue(s, RequiresGrad(t, x));
  t.backend().SoftmaxForward(rows, cols, t.value(x).data, t.value(y).data, log);
  Node n;
  n.backward = SoftmaxBackwardNode;
  n.out = y.id;
  n.in[0] = x.id;
  n.i[0] = rows, n.i[1] = cols, n.i[2] = log ? 1 : 0;
  t.Record(n);
  return y;
}
}  // namespace

Var Softmax(Var x) { return SoftmaxOp(x, false); }
Var LogSoftmax(Var x) { return SoftmaxOp(x, true); }

Var SoftmaxCrossEntropy(Var logits, std::span<const int32_t> labels) {
  Tape& t = *logits.tape;
  const Shape& s = t.value(logits).shape;
  TROUPE_CHECK(s.rank() == 2 && static_cast<int64_t>(labels.size()) == s[0]);
  Var y = t.NewValue(Shape{}, RequiresGrad(t, logits));
  Node n;
  n.saved[0] = t.AllocateFloats(s.size());
  // Keep a copy of the labels on the device: the caller's buffer may change before Backward.
  int32_t* kept = t.AllocateInts(s[0]);
  t.backend().Upload(labels.data(), kept, sizeof(int32_t) * s[0]);
  t.backend().CrossEntropyForward(s[0], s[1], t.value(logits).data, kept, n.saved[0], t.value(y).data);
  n.backward = CrossEntropyBackwardNode;
  n.out = y.id;
  n.in[0] = logits.id;
  n.i[0] = s[0], n.i[1] = s[1];
  n.ptr = kept;
  t.Record(n);
  return y;
}

Var ImagesToFloat(Tape& t, const uint8_t* host, int64_t images, int64_t height, int64_t width, int64_t channels,
                  float scale) {
  const uint8_t* bytes = t.InputBytes(host, images * height * width * channels);
  return DeviceImagesToFloat(t, bytes, images, height, width, channels, scale);
}

Var DeviceImagesToFloat(Tape& t, const uint8_t* device, int64_t images, int64_t height, int64_t width,
                        int64_t channels, float scale) {
  Var y = t.NewValue({images, channels, height, width}, /*requires_grad=*/false);
  t.backend().BytesToFloatPlanar(images, height * width, channels, scale, device, t.value(y).data);
  return y;
}

}  // namespace troupe::nn
