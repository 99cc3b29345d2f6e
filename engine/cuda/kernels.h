// Launchers for the CUDA backend's own kernels (kernels.cu, conv_kernels.cu).
// Internal to engine/cuda: plain C++ declarations so the host side
// (cuda_backend.cc, cuda_conv.cc) compiles without nvcc. Every launcher
// enqueues on `stream` and returns at once; pointers are device-addressable;
// semantics are those of the nn::Backend method of the same name.
#ifndef TROUPE_ENGINE_CUDA_KERNELS_H_
#define TROUPE_ENGINE_CUDA_KERNELS_H_

#include <cstdint>

#include <cuda_runtime_api.h>

namespace troupe::cuda::kernels {

// --- Memory and elementwise -------------------------------------------------------
// x[i] = value + i * step.
void Fill(cudaStream_t s, float* x, int64_t n, float value, float step);
// The core's generic kernels (nn::Backend): `op` is nn::UnaryOp's,
// nn::Binary's or nn::Reduction's value, the types nn::DType's.
void Unary(cudaStream_t s, int op, float alpha, float beta, const float* x, float* y, int64_t n, bool accumulate);
void UnaryBackward(cudaStream_t s, int op, float alpha, float beta, const float* x, const float* y, const float* dy,
                   float* dx, int64_t n);
// y[o, m, i] (+)= a op b over [outer, mid, inner]; each operand's strides
// over the three axes (0 where it does not hold one).
struct Strides3 {
  int64_t outer, mid, inner;
};
void BinaryBroadcast(cudaStream_t s, int op, int64_t outer, int64_t mid, int64_t inner, const float* a, Strides3 sa,
                     const float* b, Strides3 sb, float* y, bool accumulate);
void ReduceAxis(cudaStream_t s, int op, int64_t outer, int64_t mid, int64_t inner, float scale, const float* x,
                float* y, bool accumulate);
// Indices out of range are skipped.
void Gather(cudaStream_t s, int64_t outer, int64_t in, int64_t inner, int64_t out, const float* x,
            const int32_t* indices, float* y);
void Scatter(cudaStream_t s, int64_t outer, int64_t in, int64_t inner, int64_t out, const int32_t* indices,
             const float* values, float* x, bool add);
void Convert(cudaStream_t s, int from, const void* x, int to, void* y, int64_t n, float scale);
void Axpy(cudaStream_t s, float alpha, const float* x, float* y, int64_t n);
void AddScalar(cudaStream_t s, float alpha, const float* scalar, float* y, int64_t n);
void CopyBlocks(cudaStream_t s, int64_t outer, int64_t len, const float* src, int64_t src_stride, int64_t src_offset,
                float* dst, int64_t dst_stride, int64_t dst_offset, bool accumulate);
// `f` is nn::Activation's value.
void ActivationForward(cudaStream_t s, int f, float alpha, const float* x, float* y, int64_t n);
void ActivationBackward(cudaStream_t s, int f, float alpha, const float* x, const float* y, const float* dy, float* dx,
                        int64_t n);
// `op` is nn::Binary's value.
void BinaryForward(cudaStream_t s, int op, const float* a, const float* b, float* y, int64_t n);
void BinaryBackward(cudaStream_t s, int op, const float* a, const float* b, const float* dy, float* da, float* db,
                    int64_t n);
void Scale(cudaStream_t s, float alpha, const float* x, float* y, int64_t n);
// bf16[i] = round-to-nearest-even(x[i]) (__nv_bfloat16 storage as uint16_t).
void ToBfloat16(cudaStream_t s, const float* x, uint16_t* y, int64_t n);

// --- Reductions ---------------------------------------------------------------------
// result[0] = sum of x (or x^2 when `square`) in double; `partials` holds
// at least ReducePartials() doubles.
int ReducePartials();
void Reduce(cudaStream_t s, const float* x, int64_t n, bool square, double* partials, double* result);
// out[0] = scale * value[0] (a reduction's double result to a float32 on the device).
void StoreScalar(cudaStream_t s, const double* value, float scale, float* out);
void SumAxis(cudaStream_t s, int64_t outer, int64_t reduce, int64_t inner, const float* x, float* y, bool accumulate);
void SumAxisBackward(cudaStream_t s, int64_t outer, int64_t reduce, int64_t inner, const float* dy, float* dx);
// dbias[j] += sum_r dy[r, j].
void RowBiasBackward(cudaStream_t s, int64_t rows, int64_t cols, const float* dy, float* dbias);
void AddRowBias(cudaStream_t s, int64_t rows, int64_t cols, const float* bias, float* y);

// --- Normalisation ----------------------------------------------------------------
void LayerNormForward(cudaStream_t s, int64_t rows, int64_t cols, float eps, const float* x, const float* gamma,
                      const float* beta, float* y, float* mean, float* rstd);
// dx (may be null) accumulated per row; dgamma/dbeta (may be null) per column.
void LayerNormBackward(cudaStream_t s, int64_t rows, int64_t cols, const float* x, const float* gamma,
                       const float* mean, const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta);
// sums [2c + 1]: per channel sum x, sum x^2, then the count n * hw.
void BatchNormStats(cudaStream_t s, int64_t n, int64_t c, int64_t hw, const float* x, float* sums);
// nn::Backend::BatchNormMoments (sums null: from the running statistics).
void BatchNormMoments(cudaStream_t s, int64_t c, float eps, float momentum, const float* sums, float* running_mean,
                      float* running_var, float* mean, float* rstd);
void BatchNormApply(cudaStream_t s, int64_t n, int64_t c, int64_t hw, const float* x, const float* mean,
                    const float* rstd, const float* gamma, const float* beta, float* y);
void BatchNormBackwardStats(cudaStream_t s, int64_t n, int64_t c, int64_t hw, const float* x, const float* mean,
                            const float* rstd, const float* dy, float* sums);
// The count is sums[2c].
void BatchNormBackwardApply(cudaStream_t s, int64_t n, int64_t c, int64_t hw, const float* x, const float* mean,
                            const float* rstd, const float* gamma, const float* sums, const float* dy, float* dx);

// --- Softmax family ----------------------------------------------------------------
void SoftmaxForward(cudaStream_t s, int64_t rows, int64_t cols, const float* x, float* y, bool log);
void SoftmaxBackward(cudaStream_t s, int64_t rows, int64_t cols, const float* y, const float* dy, float* dx, bool log);
// logp = log_softmax(x); per_row[r] = -logp[r, labels[r]]; a label outside
// [0, cols) sets *bad_label to 1.
void CrossEntropyForward(cudaStream_t s, int64_t rows, int64_t cols, const float* x, const int32_t* labels, float* logp,
                         float* per_row, int* bad_label);
void CrossEntropyBackward(cudaStream_t s, int64_t rows, int64_t cols, const float* logp, const int32_t* labels,
                          const float* dloss, float* dx);

// --- Images --------------------------------------------------------------------------
void BytesToFloatPlanar(cudaStream_t s, int64_t images, int64_t pixels, int64_t channels, float scale,
                        const uint8_t* in, float* out);
// Rows of 32-bit words copied as bits (uint32), one thread per word.
void GatherRows(cudaStream_t s, int64_t rows, int64_t row_words, const float* table, int64_t count,
                const int32_t* indices, float* out);
void ScatterRows(cudaStream_t s, int64_t rows, int64_t row_words, float* table, int64_t count,
                 const int32_t* indices, const float* values);
void GatherBytesToFloatPlanar(cudaStream_t s, int64_t rows, int64_t row_words, const float* table, int64_t images,
                              const int32_t* indices, int64_t pixels, int64_t channels, float scale, float* out);

// --- Optimizers ------------------------------------------------------------------------
void AdamUpdate(cudaStream_t s, int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float c1,
                float c2, const float* grad, float* param, float* m, float* v);
void SgdUpdate(cudaStream_t s, int64_t n, float lr, float momentum, float weight_decay, const float* grad,
               float* param, float* buf);
// x *= max_norm / sqrt(sumsq[0]) when that norm exceeds max_norm; norm[0]
// (may be null) gets the norm. sumsq is a device double (Reduce's result).
void ClipByNorm(cudaStream_t s, float* x, int64_t n, float max_norm, const double* sumsq, float* norm);
void Polyak(cudaStream_t s, int64_t n, float tau, const float* online, float* target);
// nn::Backend::TrustRatio and ScaleByScalar.
void TrustRatio(cudaStream_t s, const float* w_squared, const float* u_squared, float coefficient, float weight_decay,
                float* ratio);
void ScaleByScalar(cudaStream_t s, float alpha, const float* scalar, float* x, int64_t n);

// --- Convolution helpers (conv_kernels.cu) ---------------------------------------------
// Geometry as nn::ConvGeometry, flattened so nvcc needs no troupe headers.
struct Conv {
  int64_t n, c, h, w, oc, kh, kw, stride, pad, oh, ow;
};
// col[(ch*kh + ki)*kw + kj, i*P + p] = x[i, ch, iy, ix] or 0 (P = oh*ow): the
// whole batch unrolled into one [c*kh*kw, n*P] matrix.
void Im2Col(cudaStream_t s, const Conv& g, const float* x, float* col);
// x[i, ch, iy, ix] (+)= sum of the col entries that read it (the adjoint).
void Col2Im(cudaStream_t s, const Conv& g, const float* col, float* x, bool accumulate);
// [n, oc, P] <-> [oc, n*P]; ToBatchMajor adds bias[oc] (may be null) and
// accumulates into y when `accumulate`.
void ToChannelMajor(cudaStream_t s, int64_t n, int64_t oc, int64_t p, const float* x, float* y);
void ToBatchMajor(cudaStream_t s, int64_t n, int64_t oc, int64_t p, const float* x, const float* bias, float* y,
                  bool accumulate);
// db[ch] += sum over i, hw of dy[i, ch, hw].
void ChannelSum(cudaStream_t s, int64_t n, int64_t c, int64_t hw, const float* dy, float* db);

// y[i, ch, :] = act(x[i, ch, :] + bias[ch]) for a [n, c, hw] tensor, x float32
// or bfloat16 (may be y itself when float32), bias may be null, act ReLU or
// none: a convolution's bias and activation in one pass.
void ChannelBiasActivation(cudaStream_t s, int64_t n, int64_t c, int64_t hw, const float* x, const float* bias,
                           bool relu, float* y);
void ChannelBiasActivation(cudaStream_t s, int64_t n, int64_t c, int64_t hw, const uint16_t* x, const float* bias,
                           bool relu, float* y);
// out = dy where y > 0, else 0 (no accumulation): the gradient through a
// fused ReLU, as the convolution's operand.
void ReluGradient(cudaStream_t s, int64_t n, const float* y, const float* dy, float* out);
// y (+)= x for a bfloat16 x: a bfloat16 cuDNN convolution's result into float32.
void AddBfloat16(cudaStream_t s, int64_t n, const uint16_t* x, float* y, bool accumulate);

}  // namespace troupe::cuda::kernels

#endif  // TROUPE_ENGINE_CUDA_KERNELS_H_
