// The CUDA backend's own kernels: elementwise, reductions, normalisation,
// softmax/cross-entropy, random shift, spectral-norm helpers, optimizers.
// Each mirrors the CPU reference (engine/nn/cpu_backend.cc) formula by
// formula; reductions accumulate in double where the reference does.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "engine/cuda/indexing.cuh"
#include "engine/cuda/kernels.h"

namespace troupe::cuda::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;
constexpr int kReduceBlocks = 512;

int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

// Grid-stride loop over [0, n).
#define FOR_EACH(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<int64_t>(blockDim.x) * gridDim.x)

__device__ inline float SigmoidF(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ inline float SoftplusF(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Block-wide sum of one double per thread (blockDim.x a multiple of 32, <= 1024).
__device__ double BlockSum(double v) {
  __shared__ double warp_sums[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();  // warp_sums may still be read by a previous call
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  double total = 0.0;
  if (warp == 0) {
    total = lane < warps ? warp_sums[lane] : 0.0;
    for (int o = 16; o > 0; o >>= 1) total += __shfl_down_sync(0xffffffffu, total, o);
    if (lane == 0) warp_sums[0] = total;
  }
  __syncthreads();
  return warp_sums[0];
}

__device__ float BlockMax(float v) {
  __shared__ float warp_max[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) warp_max[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  if (warp == 0) {
    float m = lane < warps ? warp_max[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_down_sync(0xffffffffu, m, o));
    if (lane == 0) warp_max[0] = m;
  }
  __syncthreads();
  return warp_max[0];
}

// --- Elementwise ------------------------------------------------------------------------

__global__ void FillKernel(float* x, int64_t n, float value, float step) {
  FOR_EACH(i, n) x[i] = step == 0.0f ? value : value + static_cast<float>(i) * step;
}

// --- The core's generic kernels (op values as nn::UnaryOp, nn::Binary, nn::Reduction, nn::DType) ---

__device__ float UnaryOf(int op, float alpha, float beta, float v) {
  switch (op) {
    case 0: return v > 0.0f ? v : 0.0f;                       // relu
    case 1: return v > 0.0f ? v : alpha * v;                  // leaky relu
    case 2: return v > 0.0f ? v : alpha * expm1f(v);          // elu
    case 3: return tanhf(v);
    case 4: return SigmoidF(v);
    case 5: return SoftplusF(v);
    case 6: return beta == 0.0f ? alpha * v : alpha * v + beta;  // affine
    case 7: return fminf(fmaxf(v, alpha), beta);              // clamp
    case 8: return expf(v);
    case 9: return logf(v);
    case 10: return sqrtf(v);
    case 11: return 1.0f / sqrtf(v);
    case 12: return 1.0f / v;
    case 13: return v * v;
    case 14: return fabsf(v);
    case 15: return floorf(v);
    default: return v > 0.0f ? 1.0f : 0.0f;                   // step
  }
}

// f'(x) from x and y = f(x).
__device__ float UnaryDerivative(int op, float alpha, float beta, float x, float y) {
  switch (op) {
    case 0: return x > 0.0f ? 1.0f : 0.0f;
    case 1: return x > 0.0f ? 1.0f : alpha;
    case 2: return x > 0.0f ? 1.0f : y + alpha;
    case 3: return 1.0f - y * y;
    case 4: return y * (1.0f - y);
    case 5: return SigmoidF(x);
    case 6: return alpha;
    case 7: return x >= alpha && x <= beta ? 1.0f : 0.0f;
    case 8: return y;
    case 9: return 1.0f / x;
    case 10: return 0.5f / y;
    case 11: return -0.5f * y * y * y;
    case 12: return -y * y;
    case 13: return 2.0f * x;
    case 14: return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
    default: return 0.0f;  // floor, step
  }
}

__global__ void UnaryKernel(int op, float alpha, float beta, const float* x, float* y, int64_t n, bool accumulate) {
  FOR_EACH(i, n) {
    const float v = UnaryOf(op, alpha, beta, x[i]);
    y[i] = accumulate ? y[i] + v : v;
  }
}

// Reads only the operands the op's derivative needs (x or y may be null otherwise).
__global__ void UnaryBackwardKernel(int op, float alpha, float beta, const float* x, const float* y, const float* dy,
                                    float* dx, int64_t n) {
  const bool reads_x = op <= 2 || op == 5 || op == 7 || op == 9 || op == 13 || op == 14;
  const bool reads_y = op == 2 || op == 3 || op == 4 || op == 8 || op == 10 || op == 11 || op == 12;
  FOR_EACH(i, n) {
    dx[i] += UnaryDerivative(op, alpha, beta, reads_x ? x[i] : 0.0f, reads_y ? y[i] : 0.0f) * dy[i];
  }
}

__device__ float BinaryOf(int op, float p, float q) {
  switch (op) {
    case 0: return p + q;
    case 1: return p - q;
    case 2: return p * q;
    case 3: return p / q;
    case 4: return fmaxf(p, q);
    default: return fminf(p, q);
  }
}

__global__ void BinaryBroadcastKernel(int op, int64_t outer, int64_t mid, int64_t inner, const float* a,
                                      Strides3 sa, const float* b, Strides3 sb, float* y, bool accumulate) {
  FOR_EACH(k, outer * mid * inner) {
    const int64_t i = k % inner, m = (k / inner) % mid, o = k / (inner * mid);
    const float v = BinaryOf(op, a[o * sa.outer + m * sa.mid + i * sa.inner], b[o * sb.outer + m * sb.mid + i * sb.inner]);
    y[k] = accumulate ? y[k] + v : v;
  }
}

// One thread per output; sums in double, as the CPU reference.
__global__ void ReduceAxisKernel(int op, int64_t outer, int64_t mid, int64_t inner, float scale, const float* x,
                                 float* y, bool accumulate) {
  FOR_EACH(k, outer * inner) {
    const int64_t i = k % inner, o = k / inner;
    const float* xo = x + o * mid * inner + i;
    float value;
    if (op == 1) {
      float most = -INFINITY;
      for (int64_t r = 0; r < mid; ++r) most = fmaxf(most, xo[r * inner]);
      value = most * scale;
    } else {
      double sum = 0.0;
      for (int64_t r = 0; r < mid; ++r) sum += xo[r * inner];
      value = static_cast<float>(sum * scale);
    }
    y[k] = accumulate ? y[k] + value : value;
  }
}

__global__ void GatherKernel(int64_t outer, int64_t in, int64_t inner, int64_t out, const uint32_t* x,
                             const int32_t* indices, uint32_t* y) {
  FOR_EACH(k, outer * out * inner) {
    const int64_t i = k % inner, oj = k / inner, o = oj / out;
    const int32_t at = indices[oj];
    if (at >= 0 && at < in) y[k] = x[(o * in + at) * inner + i];
  }
}

__global__ void ScatterKernel(int64_t outer, int64_t in, int64_t inner, int64_t out, const int32_t* indices,
                              const uint32_t* values, uint32_t* x, bool add) {
  FOR_EACH(k, outer * out * inner) {
    const int64_t i = k % inner, oj = k / inner, o = oj / out;
    const int32_t at = indices[oj];
    if (at < 0 || at >= in) continue;
    uint32_t* place = x + (o * in + at) * inner + i;
    if (add) {
      atomicAdd(reinterpret_cast<float*>(place), __uint_as_float(values[k]));
    } else {
      *place = values[k];
    }
  }
}

__global__ void ConvertKernel(int from, const void* x, int to, void* y, int64_t n, float scale) {
  FOR_EACH(i, n) {
    const float v = from == 0   ? static_cast<const uint8_t*>(x)[i] * scale
                    : from == 1 ? static_cast<float>(static_cast<const int32_t*>(x)[i]) * scale
                                : static_cast<const float*>(x)[i] * scale;
    if (to == 1) {
      static_cast<int32_t*>(y)[i] = static_cast<int32_t>(v);
    } else {
      static_cast<float*>(y)[i] = v;
    }
  }
}

__global__ void AxpyKernel(float alpha, const float* x, float* y, int64_t n) {
  FOR_EACH(i, n) y[i] += alpha * x[i];
}

__global__ void AddScalarKernel(float alpha, const float* scalar, float* y, int64_t n) {
  const float add = alpha * scalar[0];
  FOR_EACH(i, n) y[i] += add;
}

__global__ void CopyBlocksKernel(int64_t outer, int64_t len, const float* src, int64_t src_stride, int64_t src_offset,
                                 float* dst, int64_t dst_stride, int64_t dst_offset, bool accumulate) {
  FOR_EACH(k, outer * len) {
    const int64_t o = k / len, i = k % len;
    const float v = src[o * src_stride + src_offset + i];
    float* d = dst + o * dst_stride + dst_offset + i;
    *d = accumulate ? *d + v : v;
  }
}

// f: 0 relu, 1 leaky relu, 2 elu, 3 tanh, 4 sigmoid, 5 softplus (nn::Activation order).
__global__ void ActivationForwardKernel(int f, float alpha, const float* x, float* y, int64_t n) {
  FOR_EACH(i, n) {
    const float v = x[i];
    float r;
    switch (f) {
      case 0: r = v > 0.0f ? v : 0.0f; break;
      case 1: r = v > 0.0f ? v : alpha * v; break;
      case 2: r = v > 0.0f ? v : alpha * expm1f(v); break;
      case 3: r = tanhf(v); break;
      case 4: r = SigmoidF(v); break;
      default: r = SoftplusF(v); break;
    }
    y[i] = r;
  }
}

__global__ void ActivationBackwardKernel(int f, float alpha, const float* x, const float* y, const float* dy, float* dx,
                                         int64_t n) {
  FOR_EACH(i, n) {
    const float d = dy[i];
    float g;
    switch (f) {
      case 0: g = x[i] > 0.0f ? d : 0.0f; break;
      case 1: g = x[i] > 0.0f ? d : alpha * d; break;
      case 2: g = x[i] > 0.0f ? d : (y[i] + alpha) * d; break;
      case 3: g = (1.0f - y[i] * y[i]) * d; break;
      case 4: g = y[i] * (1.0f - y[i]) * d; break;
      default: g = SigmoidF(x[i]) * d; break;
    }
    dx[i] += g;
  }
}

// op: 0 add, 1 sub, 2 mul (nn::Binary order).
__global__ void BinaryForwardKernel(int op, const float* a, const float* b, float* y, int64_t n) {
  FOR_EACH(i, n) y[i] = op == 0 ? a[i] + b[i] : (op == 1 ? a[i] - b[i] : a[i] * b[i]);
}

__global__ void BinaryBackwardKernel(int op, const float* a, const float* b, const float* dy, float* da, float* db,
                                     int64_t n) {
  FOR_EACH(i, n) {
    const float d = dy[i];
    if (da) da[i] += op == 2 ? b[i] * d : d;
    if (db) db[i] += op == 0 ? d : (op == 1 ? -d : a[i] * d);
  }
}

__global__ void ScaleKernel(float alpha, const float* x, float* y, int64_t n) {
  FOR_EACH(i, n) y[i] = alpha * x[i];
}

__global__ void ToBfloat16Kernel(const float* x, __nv_bfloat16* y, int64_t n) {
  FOR_EACH(i, n) y[i] = __float2bfloat16_rn(x[i]);
}

// --- Reductions -----------------------------------------------------------------------------

// Stage 1: each block writes its partial; stage 2: one block sums the partials.
__global__ void ReducePartialKernel(const float* x, int64_t n, bool square, double* partials) {
  double s = 0.0;
  FOR_EACH(i, n) {
    const double v = x[i];
    s += square ? v * v : v;
  }
  s = BlockSum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void ReduceFinalKernel(const double* partials, int count, double* result) {
  double s = 0.0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) s += partials[i];
  s = BlockSum(s);
  if (threadIdx.x == 0) result[0] = s;
}


template <typename I>
__global__ void SumAxisKernel(int64_t outer64, int64_t reduce64, int64_t inner64, const float* x, float* y,
                              bool accumulate) {
  const I outer = outer64, reduce = reduce64, inner = inner64;
  FOR_EACH_INDEX(I, k, outer * inner) {
    const I o = k / inner, i = k % inner;
    float s = 0.0f;
    for (I r = 0; r < reduce; ++r) s += x[(o * reduce + r) * inner + i];
    y[k] = accumulate ? y[k] + s : s;
  }
}

template <typename I>
__global__ void SumAxisBackwardKernel(int64_t outer64, int64_t reduce64, int64_t inner64, const float* dy, float* dx) {
  const I outer = outer64, reduce = reduce64, inner = inner64;
  FOR_EACH_INDEX(I, k, outer * reduce * inner) {
    const I i = k % inner, o = k / (reduce * inner);
    dx[k] += dy[o * inner + i];
  }
}

template <typename I>
__global__ void AddRowBiasKernel(int64_t rows64, int64_t cols64, const float* bias, float* y) {
  const I rows = rows64, cols = cols64;
  FOR_EACH_INDEX(I, k, rows * cols) y[k] += bias[k % cols];
}

// --- Normalisation ------------------------------------------------------------------------

// One block per row.
__global__ void LayerNormForwardKernel(int64_t cols, float eps, const float* x, const float* gamma, const float* beta,
                                       float* y, float* mean, float* rstd) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * cols;
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += xr[j];
  const double mu = BlockSum(s) / cols;
  double ss = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) ss += (xr[j] - mu) * (xr[j] - mu);
  ss = BlockSum(ss);
  const float rs = static_cast<float>(1.0 / sqrt(ss / cols + eps));
  const float m = static_cast<float>(mu);
  if (threadIdx.x == 0) {
    mean[r] = m;
    rstd[r] = rs;
  }
  float* yr = y + r * cols;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = (xr[j] - m) * rs * gamma[j] + beta[j];
}

__global__ void LayerNormBackwardDxKernel(int64_t cols, const float* x, const float* gamma, const float* mean,
                                          const float* rstd, const float* dy, float* dx) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * cols;
  const float* dr = dy + r * cols;
  const float m = mean[r], rs = rstd[r];
  double sg = 0.0, sgx = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float g = dr[j] * gamma[j];
    sg += g;
    sgx += g * (xr[j] - m) * rs;
  }
  sg = BlockSum(sg);
  sgx = BlockSum(sgx);
  const float mg = static_cast<float>(sg / cols), mgx = static_cast<float>(sgx / cols);
  float* dxr = dx + r * cols;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    const float xhat = (xr[j] - m) * rs;
    dxr[j] += rs * (dr[j] * gamma[j] - mg - xhat * mgx);
  }
}

// One thread per column, looping over rows.
__global__ void LayerNormBackwardParamsKernel(int64_t rows, int64_t cols, const float* x, const float* mean,
                                              const float* rstd, const float* dy, float* dgamma, float* dbeta) {
  FOR_EACH(j, cols) {
    float sg = 0.0f, sb = 0.0f;
    for (int64_t r = 0; r < rows; ++r) {
      const float d = dy[r * cols + j];
      sg += d * (x[r * cols + j] - mean[r]) * rstd[r];
      sb += d;
    }
    if (dgamma) dgamma[j] += sg;
    if (dbeta) dbeta[j] += sb;
  }
}

// One block per channel, kChannelThreads wide: sums[ch] = sum x (or dy),
// sums[c + ch] = sum x^2 (or dy * xhat).
template <typename I>
__global__ void __launch_bounds__(kChannelThreads)
    BatchNormStatsKernel(int64_t n64, int64_t c64, int64_t hw64, const float* x, const float* mean, const float* rstd,
                         const float* dy, float* sums) {
  const I n = n64, c = c64, hw = hw64, ch = blockIdx.x;
  double s = 0.0, ss = 0.0;
  const float m = mean ? mean[ch] : 0.0f, rs = rstd ? rstd[ch] : 0.0f;
  for (I k = threadIdx.x; k < n * hw; k += blockDim.x) {
    const I i = k / hw, j = k % hw;
    const float v = x[(i * c + ch) * hw + j];
    if (dy == nullptr) {
      s += v;
      ss += static_cast<double>(v) * v;
    } else {
      const float d = dy[(i * c + ch) * hw + j];
      s += d;
      ss += d * (v - m) * rs;
    }
  }
  s = BlockSum(s);
  ss = BlockSum(ss);
  if (threadIdx.x == 0) {
    sums[ch] = static_cast<float>(s);
    sums[c + ch] = static_cast<float>(ss);
    if (ch == 0) sums[2 * c] = static_cast<float>(n * hw);
  }
}

__global__ void BatchNormMomentsKernel(int64_t c, float eps, float momentum, const float* sums, float* running_mean,
                                       float* running_var, float* mean, float* rstd) {
  FOR_EACH(ch, c) {
    if (sums == nullptr) {
      mean[ch] = running_mean[ch];
      rstd[ch] = rsqrtf(running_var[ch] + eps);
      continue;
    }
    const double count = sums[2 * c];
    const double mu = sums[ch] / count;
    const double var = fmax(0.0, sums[c + ch] / count - mu * mu);
    mean[ch] = static_cast<float>(mu);
    rstd[ch] = static_cast<float>(1.0 / sqrt(var + eps));
    if (running_mean != nullptr) {
      const double unbiased = count > 1 ? var * count / (count - 1) : var;
      running_mean[ch] += momentum * (static_cast<float>(mu) - running_mean[ch]);
      running_var[ch] += momentum * (static_cast<float>(unbiased) - running_var[ch]);
    }
  }
}

template <typename I>
__global__ void BatchNormApplyKernel(int64_t n64, int64_t c64, int64_t hw64, const float* x, const float* mean,
                                     const float* rstd, const float* gamma, const float* beta, float* y) {
  const I n = n64, c = c64, hw = hw64;
  FOR_EACH_INDEX(I, k, n * c * hw) {
    const I ch = (k / hw) % c;
    const float scale = gamma[ch] * rstd[ch], shift = beta[ch] - mean[ch] * scale;
    y[k] = x[k] * scale + shift;
  }
}

template <typename I>
__global__ void BatchNormBackwardApplyKernel(int64_t n64, int64_t c64, int64_t hw64, const float* x,
                                             const float* mean, const float* rstd, const float* gamma,
                                             const float* sums, const float* dy, float* dx) {
  const I n = n64, c = c64, hw = hw64;
  const double count = sums[2 * c];
  FOR_EACH_INDEX(I, k, n * c * hw) {
    const I ch = (k / hw) % c;
    const float md = static_cast<float>(sums[ch] / count), mdx = static_cast<float>(sums[c + ch] / count);
    const float xhat = (x[k] - mean[ch]) * rstd[ch];
    dx[k] += gamma[ch] * rstd[ch] * (dy[k] - md - xhat * mdx);
  }
}

// --- Softmax family ---------------------------------------------------------------------------

// One block per row.
__global__ void SoftmaxForwardKernel(int64_t cols, const float* x, float* y, bool log) {
  const int64_t r = blockIdx.x;
  const float* xr = x + r * cols;
  float* yr = y + r * cols;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) mx = fmaxf(mx, xr[j]);
  mx = BlockMax(mx);
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += expf(xr[j] - mx);
  s = BlockSum(s);
  const float lse = mx + static_cast<float>(::log(s));
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) yr[j] = log ? xr[j] - lse : expf(xr[j] - lse);
}

__global__ void SoftmaxBackwardKernel(int64_t cols, const float* y, const float* dy, float* dx, bool log) {
  const int64_t r = blockIdx.x;
  const float* yr = y + r * cols;
  const float* dr = dy + r * cols;
  float* xr = dx + r * cols;
  double s = 0.0;
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) s += log ? dr[j] : dr[j] * yr[j];
  const float total = static_cast<float>(BlockSum(s));
  for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
    xr[j] += log ? dr[j] - expf(yr[j]) * total : yr[j] * (dr[j] - total);
  }
}

__global__ void CrossEntropyPickKernel(int64_t rows, int64_t cols, const float* logp, const int32_t* labels,
                                       float* per_row, int* bad_label) {
  FOR_EACH(r, rows) {
    const int32_t label = labels[r];
    if (label < 0 || label >= cols) {
      *bad_label = 1;
      per_row[r] = 0.0f;
    } else {
      per_row[r] = -logp[r * cols + label];
    }
  }
}

__global__ void CrossEntropyBackwardKernel(int64_t rows, int64_t cols, const float* logp, const int32_t* labels,
                                           const float* dloss, float* dx) {
  const float k = dloss[0] / static_cast<float>(rows);
  FOR_EACH(idx, rows * cols) {
    const int64_t r = idx / cols, j = idx % cols;
    dx[idx] += k * (expf(logp[idx]) - (j == labels[r] ? 1.0f : 0.0f));
  }
}

// --- Images -------------------------------------------------------------------------------------

// One thread per output float: reads stride `channels`, writes contiguous planes.
template <typename I>
__global__ void BytesToFloatPlanarKernel(int64_t images64, int64_t pixels64, int64_t channels64, float scale,
                                         const uint8_t* in, float* out) {
  const I images = images64, pixels = pixels64, channels = channels64;
  FOR_EACH_INDEX(I, k, images * channels * pixels) {
    const I p = k % pixels, ch = (k / pixels) % channels, i = k / (pixels * channels);
    out[k] = in[(i * pixels + p) * channels + ch] * scale;
  }
}

// Row tables: words moved as uint32 (bits, never float arithmetic).
template <typename I>
__global__ void GatherRowsKernel(int64_t row_words64, int64_t count64, const int32_t* indices, const uint32_t* table,
                                 uint32_t* out) {
  const I row_words = row_words64, count = count64;
  FOR_EACH_INDEX(I, k, count * row_words) {
    const I i = k / row_words, w = k % row_words;
    out[k] = table[static_cast<int64_t>(indices[i]) * row_words + w];
  }
}

template <typename I>
__global__ void ScatterRowsKernel(int64_t row_words64, int64_t count64, const int32_t* indices,
                                  const uint32_t* values, uint32_t* table) {
  const I row_words = row_words64, count = count64;
  FOR_EACH_INDEX(I, k, count * row_words) {
    const I i = k / row_words, w = k % row_words;
    table[static_cast<int64_t>(indices[i]) * row_words + w] = values[k];
  }
}

// BytesToFloatPlanar with image i read from row indices[i] of the table.
template <typename I>
__global__ void GatherBytesToFloatPlanarKernel(int64_t row_words64, int64_t images64, const int32_t* indices,
                                               int64_t pixels64, int64_t channels64, float scale,
                                               const uint8_t* table, float* out) {
  const I images = images64, pixels = pixels64, channels = channels64;
  const int64_t row_bytes = 4 * row_words64;
  FOR_EACH_INDEX(I, k, images * channels * pixels) {
    const I p = k % pixels, ch = (k / pixels) % channels, i = k / (pixels * channels);
    out[k] = table[static_cast<int64_t>(indices[i]) * row_bytes + p * channels + ch] * scale;
  }
}

// --- Optimizers ----------------------------------------------------------------------------------

__global__ void AdamKernel(int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float step,
                           float inv_sqrt_c2, const float* grad, float* param, float* m, float* v) {
  FOR_EACH(i, n) {
    const float g = grad[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * g;
    const float vi = beta2 * v[i] + (1.0f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    param[i] -= lr * weight_decay * param[i] + step * mi / (sqrtf(vi) * inv_sqrt_c2 + eps);
  }
}

__global__ void SgdKernel(int64_t n, float lr, float momentum, float weight_decay, const float* grad, float* param,
                          float* buf) {
  FOR_EACH(i, n) {
    const float g = grad[i] + weight_decay * param[i];
    buf[i] = momentum * buf[i] + g;
    param[i] -= lr * buf[i];
  }
}

__global__ void PolyakKernel(int64_t n, float tau, const float* online, float* target) {
  FOR_EACH(i, n) target[i] += tau * (online[i] - target[i]);
}

}  // namespace

// --- Launchers -----------------------------------------------------------------------------------

void Fill(cudaStream_t s, float* x, int64_t n, float value, float step) {
  FillKernel<<<Blocks(n), kThreads, 0, s>>>(x, n, value, step);
}

void Unary(cudaStream_t s, int op, float alpha, float beta, const float* x, float* y, int64_t n, bool accumulate) {
  UnaryKernel<<<Blocks(n), kThreads, 0, s>>>(op, alpha, beta, x, y, n, accumulate);
}

void UnaryBackward(cudaStream_t s, int op, float alpha, float beta, const float* x, const float* y, const float* dy,
                   float* dx, int64_t n) {
  UnaryBackwardKernel<<<Blocks(n), kThreads, 0, s>>>(op, alpha, beta, x, y, dy, dx, n);
}

void BinaryBroadcast(cudaStream_t s, int op, int64_t outer, int64_t mid, int64_t inner, const float* a, Strides3 sa,
                     const float* b, Strides3 sb, float* y, bool accumulate) {
  BinaryBroadcastKernel<<<Blocks(outer * mid * inner), kThreads, 0, s>>>(op, outer, mid, inner, a, sa, b, sb, y,
                                                                          accumulate);
}

void ReduceAxis(cudaStream_t s, int op, int64_t outer, int64_t mid, int64_t inner, float scale, const float* x,
                float* y, bool accumulate) {
  ReduceAxisKernel<<<Blocks(outer * inner), kThreads, 0, s>>>(op, outer, mid, inner, scale, x, y, accumulate);
}

void Gather(cudaStream_t s, int64_t outer, int64_t in, int64_t inner, int64_t out, const float* x,
            const int32_t* indices, float* y) {
  GatherKernel<<<Blocks(outer * out * inner), kThreads, 0, s>>>(outer, in, inner, out,
                                                                 reinterpret_cast<const uint32_t*>(x), indices,
                                                                 reinterpret_cast<uint32_t*>(y));
}

void Scatter(cudaStream_t s, int64_t outer, int64_t in, int64_t inner, int64_t out, const int32_t* indices,
             const float* values, float* x, bool add) {
  ScatterKernel<<<Blocks(outer * out * inner), kThreads, 0, s>>>(outer, in, inner, out, indices,
                                                                  reinterpret_cast<const uint32_t*>(values),
                                                                  reinterpret_cast<uint32_t*>(x), add);
}

void Convert(cudaStream_t s, int from, const void* x, int to, void* y, int64_t n, float scale) {
  ConvertKernel<<<Blocks(n), kThreads, 0, s>>>(from, x, to, y, n, scale);
}

void Axpy(cudaStream_t s, float alpha, const float* x, float* y, int64_t n) {
  AxpyKernel<<<Blocks(n), kThreads, 0, s>>>(alpha, x, y, n);
}

void AddScalar(cudaStream_t s, float alpha, const float* scalar, float* y, int64_t n) {
  AddScalarKernel<<<Blocks(n), kThreads, 0, s>>>(alpha, scalar, y, n);
}

void CopyBlocks(cudaStream_t s, int64_t outer, int64_t len, const float* src, int64_t src_stride, int64_t src_offset,
                float* dst, int64_t dst_stride, int64_t dst_offset, bool accumulate) {
  CopyBlocksKernel<<<Blocks(outer * len), kThreads, 0, s>>>(outer, len, src, src_stride, src_offset, dst, dst_stride,
                                                            dst_offset, accumulate);
}

void ActivationForward(cudaStream_t s, int f, float alpha, const float* x, float* y, int64_t n) {
  ActivationForwardKernel<<<Blocks(n), kThreads, 0, s>>>(f, alpha, x, y, n);
}

void ActivationBackward(cudaStream_t s, int f, float alpha, const float* x, const float* y, const float* dy, float* dx,
                        int64_t n) {
  ActivationBackwardKernel<<<Blocks(n), kThreads, 0, s>>>(f, alpha, x, y, dy, dx, n);
}

void BinaryForward(cudaStream_t s, int op, const float* a, const float* b, float* y, int64_t n) {
  BinaryForwardKernel<<<Blocks(n), kThreads, 0, s>>>(op, a, b, y, n);
}

void BinaryBackward(cudaStream_t s, int op, const float* a, const float* b, const float* dy, float* da, float* db,
                    int64_t n) {
  BinaryBackwardKernel<<<Blocks(n), kThreads, 0, s>>>(op, a, b, dy, da, db, n);
}

void Scale(cudaStream_t s, float alpha, const float* x, float* y, int64_t n) {
  ScaleKernel<<<Blocks(n), kThreads, 0, s>>>(alpha, x, y, n);
}

void ToBfloat16(cudaStream_t s, const float* x, uint16_t* y, int64_t n) {
  ToBfloat16Kernel<<<Blocks(n), kThreads, 0, s>>>(x, reinterpret_cast<__nv_bfloat16*>(y), n);
}

int ReducePartials() { return kReduceBlocks; }

void Reduce(cudaStream_t s, const float* x, int64_t n, bool square, double* partials, double* result) {
  int blocks = static_cast<int>((n + kThreads - 1) / kThreads);
  blocks = blocks < 1 ? 1 : (blocks > kReduceBlocks ? kReduceBlocks : blocks);
  ReducePartialKernel<<<blocks, kThreads, 0, s>>>(x, n, square, partials);
  ReduceFinalKernel<<<1, kThreads, 0, s>>>(partials, blocks, result);
}

void SumAxis(cudaStream_t s, int64_t outer, int64_t reduce, int64_t inner, const float* x, float* y, bool accumulate) {
  LAUNCH_INDEXED(SumAxisKernel, Fits32(outer * reduce * inner), Blocks(outer * inner), kThreads, s, outer, reduce, inner,
                 x, y, accumulate);
}

void SumAxisBackward(cudaStream_t s, int64_t outer, int64_t reduce, int64_t inner, const float* dy, float* dx) {
  LAUNCH_INDEXED(SumAxisBackwardKernel, Fits32(outer * reduce * inner), Blocks(outer * reduce * inner), kThreads, s,
                 outer, reduce, inner, dy, dx);
}

void RowBiasBackward(cudaStream_t s, int64_t rows, int64_t cols, const float* dy, float* dbias) {
  // dbias[j] += sum over the rows: SumAxis with outer 1, accumulating.
  LAUNCH_INDEXED(SumAxisKernel, Fits32(rows * cols), Blocks(cols), kThreads, s, int64_t{1}, rows, cols, dy, dbias, true);
}

void AddRowBias(cudaStream_t s, int64_t rows, int64_t cols, const float* bias, float* y) {
  LAUNCH_INDEXED(AddRowBiasKernel, Fits32(rows * cols), Blocks(rows * cols), kThreads, s, rows, cols, bias, y);
}

void LayerNormForward(cudaStream_t s, int64_t rows, int64_t cols, float eps, const float* x, const float* gamma,
                      const float* beta, float* y, float* mean, float* rstd) {
  if (rows == 0) return;
  LayerNormForwardKernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(cols, eps, x, gamma, beta, y, mean, rstd);
}

void LayerNormBackward(cudaStream_t s, int64_t rows, int64_t cols, const float* x, const float* gamma,
                       const float* mean, const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta) {
  if (rows == 0) return;
  if (dgamma != nullptr || dbeta != nullptr) {
    LayerNormBackwardParamsKernel<<<Blocks(cols), kThreads, 0, s>>>(rows, cols, x, mean, rstd, dy, dgamma, dbeta);
  }
  if (dx != nullptr) {
    LayerNormBackwardDxKernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(cols, x, gamma, mean, rstd, dy, dx);
  }
}

void BatchNormStats(cudaStream_t s, int64_t n, int64_t c, int64_t hw, const float* x, float* sums) {
  if (c == 0) return;
  LAUNCH_INDEXED(BatchNormStatsKernel, Fits32(n * c * hw), static_cast<unsigned>(c), kChannelThreads, s, n, c, hw, x,
                 nullptr, nullptr, nullptr, sums);
}

void BatchNormMoments(cudaStream_t s, int64_t c, float eps, float momentum, const float* sums, float* running_mean,
                      float* running_var, float* mean, float* rstd) {
  if (c == 0) return;
  BatchNormMomentsKernel<<<Blocks(c), kThreads, 0, s>>>(c, eps, momentum, sums, running_mean, running_var, mean, rstd);
}

void BatchNormApply(cudaStream_t s, int64_t n, int64_t c, int64_t hw, const float* x, const float* mean,
                    const float* rstd, const float* gamma, const float* beta, float* y) {
  LAUNCH_INDEXED(BatchNormApplyKernel, Fits32(n * c * hw), Blocks(n * c * hw), kThreads, s, n, c, hw, x, mean, rstd,
                 gamma, beta, y);
}

void BatchNormBackwardStats(cudaStream_t s, int64_t n, int64_t c, int64_t hw, const float* x, const float* mean,
                            const float* rstd, const float* dy, float* sums) {
  if (c == 0) return;
  LAUNCH_INDEXED(BatchNormStatsKernel, Fits32(n * c * hw), static_cast<unsigned>(c), kChannelThreads, s, n, c, hw, x,
                 mean, rstd, dy, sums);
}

void BatchNormBackwardApply(cudaStream_t s, int64_t n, int64_t c, int64_t hw, const float* x, const float* mean,
                            const float* rstd, const float* gamma, const float* sums, const float* dy, float* dx) {
  LAUNCH_INDEXED(BatchNormBackwardApplyKernel, Fits32(n * c * hw), Blocks(n * c * hw), kThreads, s, n, c, hw, x, mean,
                 rstd, gamma, sums, dy, dx);
}

void SoftmaxForward(cudaStream_t s, int64_t rows, int64_t cols, const float* x, float* y, bool log) {
  if (rows == 0) return;
  SoftmaxForwardKernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(cols, x, y, log);
}

void SoftmaxBackward(cudaStream_t s, int64_t rows, int64_t cols, const float* y, const float* dy, float* dx,
                     bool log) {
  if (rows == 0) return;
  SoftmaxBackwardKernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(cols, y, dy, dx, log);
}

void CrossEntropyForward(cudaStream_t s, int64_t rows, int64_t cols, const float* x, const int32_t* labels, float* logp,
                         float* per_row, int* bad_label) {
  SoftmaxForward(s, rows, cols, x, logp, /*log=*/true);
  CrossEntropyPickKernel<<<Blocks(rows), kThreads, 0, s>>>(rows, cols, logp, labels, per_row, bad_label);
}

void CrossEntropyBackward(cudaStream_t s, int64_t rows, int64_t cols, const float* logp, const int32_t* labels,
                          const float* dloss, float* dx) {
  CrossEntropyBackwardKernel<<<Blocks(rows * cols), kThreads, 0, s>>>(rows, cols, logp, labels, dloss, dx);
}

void BytesToFloatPlanar(cudaStream_t s, int64_t images, int64_t pixels, int64_t channels, float scale,
                        const uint8_t* in, float* out) {
  LAUNCH_INDEXED(BytesToFloatPlanarKernel, Fits32(images * channels * pixels), Blocks(images * channels * pixels),
                 kThreads, s, images, pixels, channels, scale, in, out);
}

void GatherRows(cudaStream_t s, int64_t rows, int64_t row_words, const float* table, int64_t count,
                const int32_t* indices, float* out) {
  (void)rows;
  if (count * row_words == 0) return;
  LAUNCH_INDEXED(GatherRowsKernel, Fits32(count * row_words), Blocks(count * row_words), kThreads, s, row_words,
                 count, indices, reinterpret_cast<const uint32_t*>(table), reinterpret_cast<uint32_t*>(out));
}

void ScatterRows(cudaStream_t s, int64_t rows, int64_t row_words, float* table, int64_t count,
                 const int32_t* indices, const float* values) {
  (void)rows;
  if (count * row_words == 0) return;
  LAUNCH_INDEXED(ScatterRowsKernel, Fits32(count * row_words), Blocks(count * row_words), kThreads, s, row_words,
                 count, indices, reinterpret_cast<const uint32_t*>(values), reinterpret_cast<uint32_t*>(table));
}

void GatherBytesToFloatPlanar(cudaStream_t s, int64_t rows, int64_t row_words, const float* table, int64_t images,
                              const int32_t* indices, int64_t pixels, int64_t channels, float scale, float* out) {
  (void)rows;
  if (images * pixels * channels == 0) return;
  LAUNCH_INDEXED(GatherBytesToFloatPlanarKernel, Fits32(images * channels * pixels), Blocks(images * channels * pixels),
                 kThreads, s, row_words, images, indices, pixels, channels, scale,
                 reinterpret_cast<const uint8_t*>(table), out);
}

void AdamUpdate(cudaStream_t s, int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float c1,
                float c2, const float* grad, float* param, float* m, float* v) {
  AdamKernel<<<Blocks(n), kThreads, 0, s>>>(n, lr, beta1, beta2, eps, weight_decay, lr / c1, 1.0f / sqrtf(c2), grad,
                                            param, m, v);
}

void SgdUpdate(cudaStream_t s, int64_t n, float lr, float momentum, float weight_decay, const float* grad,
               float* param, float* buf) {
  SgdKernel<<<Blocks(n), kThreads, 0, s>>>(n, lr, momentum, weight_decay, grad, param, buf);
}

__global__ void ClipByNormKernel(float* x, int64_t n, float max_norm, const double* sumsq, float* norm) {
  const float value = static_cast<float>(sqrt(sumsq[0]));
  if (norm != nullptr && blockIdx.x == 0 && threadIdx.x == 0) norm[0] = value;
  if (!(value > max_norm && value > 0.0f)) return;
  const float scale = max_norm / value;
  FOR_EACH(k, n) { x[k] *= scale; }
}

void ClipByNorm(cudaStream_t s, float* x, int64_t n, float max_norm, const double* sumsq, float* norm) {
  ClipByNormKernel<<<Blocks(n), kThreads, 0, s>>>(x, n, max_norm, sumsq, norm);
}

void Polyak(cudaStream_t s, int64_t n, float tau, const float* online, float* target) {
  PolyakKernel<<<Blocks(n), kThreads, 0, s>>>(n, tau, online, target);
}

__global__ void StoreScalarKernel(const double* value, float scale, float* out) {
  out[0] = static_cast<float>(value[0] * scale);
}

void StoreScalar(cudaStream_t s, const double* value, float scale, float* out) {
  StoreScalarKernel<<<1, 1, 0, s>>>(value, scale, out);
}

__global__ void TrustRatioKernel(const float* w_squared, const float* u_squared, float coefficient, float weight_decay,
                                 float* ratio) {
  const double w = sqrt(static_cast<double>(w_squared[0])), u = sqrt(static_cast<double>(u_squared[0]));
  ratio[0] = w > 0 && u > 0 ? static_cast<float>(coefficient * w / (u + weight_decay * w)) : 1.0f;
}

void TrustRatio(cudaStream_t s, const float* w_squared, const float* u_squared, float coefficient, float weight_decay,
                float* ratio) {
  TrustRatioKernel<<<1, 1, 0, s>>>(w_squared, u_squared, coefficient, weight_decay, ratio);
}

__global__ void ScaleByScalarKernel(float alpha, const float* scalar, float* x, int64_t n) {
  const float k = alpha * scalar[0];
  FOR_EACH(i, n) x[i] *= k;
}

void ScaleByScalar(cudaStream_t s, float alpha, const float* scalar, float* x, int64_t n) {
  if (n == 0) return;
  ScaleByScalarKernel<<<Blocks(n), kThreads, 0, s>>>(alpha, scalar, x, n);
}

}  // namespace troupe::cuda::kernels
