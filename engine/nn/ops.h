// Differentiable ops on a Tape. Each computes its output now through the
// tape's Backend and records a node whose backward calls the matching
// backward kernel. Shapes are checked (a mismatch is a programmer error and
// fails fast with file and line). Images are NCHW.
#ifndef TROUPE_ENGINE_NN_OPS_H_
#define TROUPE_ENGINE_NN_OPS_H_

#include <cstdint>
#include <span>

#include "engine/nn/tape.h"

namespace troupe::nn {

// Sums a small buffer of device memory across replicas in place
// (cross-replica batch norm's statistics). Implemented by the Replicator; a
// failure is remembered by the implementation and reported by the replica's
// next collective.
class CrossReplicaSum {
 public:
  virtual ~CrossReplicaSum() = default;
  // values (`count` floats of `backend`'s memory) = their sum over replicas.
  virtual void SumOnDevice(Backend& backend, float* values, int64_t count) = 0;
};

// --- Tensor parallelism (Megatron-LM, Shoeybi et al. 2019) -------------------
// Across the replicas of a model-parallel group, which `group` sums over:
// y = x forward and dx = the group's sum of dy backward, where a replicated
// input enters a column-parallel layer (each replica's dy is of its own
// columns' part).
Var CopyToModelParallel(Var x, CrossReplicaSum* group);
// y = the group's sum of x forward and dx = dy backward, where a
// row-parallel layer's partial products join.
Var ReduceFromModelParallel(Var x, CrossReplicaSum* group);

// --- Dense -------------------------------------------------------------------
// [m, k] x [k, n] -> [m, n].
Var MatMul(Var a, Var b);
// x [batch, in] * w [in, out] + b [out] -> [batch, out]; b may be invalid (Var{}).
Var Linear(Var x, Var w, Var b);

// --- Convolutions ------------------------------------------------------------
// x [n, c, h, w], w [oc, c, kh, kw], b [oc] (or Var{}) -> [n, oc, oh, ow];
// `act` is applied inside the kernel (Conv2d(..., kRelu) == Relu(Conv2d(...))
// in value and gradient, one memory pass less each way).
Var Conv2d(Var x, Var w, Var b, int64_t stride, int64_t pad, FusedActivation act = FusedActivation::kNone);
// x [n, ic, h, w], w [ic, oc, kh, kw] (PyTorch's ConvTranspose2d layout),
// b [oc] -> [n, oc, (h-1)*stride - 2*pad + kh + output_pad, ...].
Var ConvTranspose2d(Var x, Var w, Var b, int64_t stride, int64_t pad, int64_t output_pad = 0);

// --- Activations -------------------------------------------------------------
Var Relu(Var x);
Var LeakyRelu(Var x, float negative_slope);
Var Elu(Var x, float alpha = 1.0f);
Var Tanh(Var x);
Var Sigmoid(Var x);
Var Softplus(Var x);

// --- Elementwise (same shapes) ----------------------------------------------
Var Add(Var a, Var b);
Var Sub(Var a, Var b);
Var Mul(Var a, Var b);
Var Scale(Var x, float alpha);
// e^x; x * x; x clamped to [lo, hi] (gradient 1 inside, 0 outside).
Var Exp(Var x);
Var Square(Var x);
Var Clamp(Var x, float lo, float hi);
// The smaller of a and b, elementwise; its gradient goes to the operand
// that was smaller (to a on a tie), as PPO's clipped objective needs.
Var Minimum(Var a, Var b);

// --- Reductions --------------------------------------------------------------
// Sum / mean of all elements -> a scalar (shape []).
Var Sum(Var x);
Var Mean(Var x);
// Sum over one axis; the axis is removed.
Var SumAxis(Var x, int axis);
// Mean of squared differences -> scalar.
Var MeanSquaredError(Var prediction, Var target);

// --- Shape -------------------------------------------------------------------
// Same data, new shape (no copy).
Var Reshape(Var x, Shape shape);
// [n, ...] -> [n, prod(...)].
Var Flatten(Var x);
// Concatenation along `axis` (shapes equal elsewhere).
Var Concat(std::span<const Var> parts, int axis);
// Elements [begin, end) along `axis`.
Var Slice(Var x, int axis, int64_t begin, int64_t end);

// --- Normalisation -----------------------------------------------------------
// Over the last axis; gamma, beta have the last axis's size.
Var LayerNorm(Var x, Var gamma, Var beta, float eps = 1e-5f);

// Running statistics for batch norm (owned by the layer, per replica).
struct BatchNormState {
  float* running_mean = nullptr;  // c floats of the backend's memory (the statistics are finished on the device)
  float* running_var = nullptr;   // c floats of the backend's memory
  float momentum = 0.1f;          // PyTorch's convention
};
// Batch norm over [n, c] or [n, c, h, w]. In training, batch statistics are
// used (summed across replicas first when `cross_replica` is given, making it
// cross-replica batch norm) and the running statistics updated; otherwise the
// running statistics are used.
Var BatchNorm(Var x, Var gamma, Var beta, BatchNormState state, bool training, float eps = 1e-5f,
              CrossReplicaSum* cross_replica = nullptr);

// --- Softmax family (last axis) ------------------------------------------------
Var Softmax(Var x);
Var LogSoftmax(Var x);
// Mean over rows of -log softmax(logits)[label]; labels has rows entries.
Var SoftmaxCrossEntropy(Var logits, std::span<const int32_t> labels);

// --- Images --------------------------------------------------------------------
// uint8 images on the host, [images, height, width, channels] (interleaved, as
// cameras and replay keep them), uploaded and turned into float planes
// [images, channels, height, width] times `scale` on the device. No gradient.
Var ImagesToFloat(Tape& t, const uint8_t* host, int64_t images, int64_t height, int64_t width, int64_t channels,
                  float scale);
// The same from images already in device memory (uploaded before a step
// that RunStep may replay).
Var DeviceImagesToFloat(Tape& t, const uint8_t* device, int64_t images, int64_t height, int64_t width,
                        int64_t channels, float scale);

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_OPS_H_
