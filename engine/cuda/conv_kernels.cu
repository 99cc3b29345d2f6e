// Convolution helpers for the CUDA backend: whole-batch im2col / col2im and
// the [n, oc, P] <-> [oc, n*P] layout changes around the one big GEMM
// (Caffe's and early cuDNN's "explicit GEMM" convolution).
#include <cuda_runtime.h>

#include "engine/cuda/kernels.h"

namespace troupe::cuda::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 8192;

int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

#define FOR_EACH(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// One thread per col entry: row (ch, ki, kj), column (i, oy, ox).
__global__ void Im2ColKernel(Conv g, const float* x, float* col) {
  const int64_t p = g.oh * g.ow, np = g.n * p, rows = g.c * g.kh * g.kw;
  FOR_EACH(k, rows * np) {
    const int64_t row = k / np, column = k % np;
    const int64_t i = column / p, pix = column % p, oy = pix / g.ow, ox = pix % g.ow;
    const int64_t kj = row % g.kw, ki = (row / g.kw) % g.kh, ch = row / (g.kw * g.kh);
    const int64_t iy = oy * g.stride - g.pad + ki, ix = ox * g.stride - g.pad + kj;
    col[k] = (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) ? x[((i * g.c + ch) * g.h + iy) * g.w + ix] : 0.0f;
  }
}

// One thread per x entry, gathering every col entry that read it (no atomics).
__global__ void Col2ImKernel(Conv g, const float* col, float* x, bool accumulate) {
  const int64_t p = g.oh * g.ow, np = g.n * p;
  FOR_EACH(k, g.n * g.c * g.h * g.w) {
    const int64_t ix = k % g.w, iy = (k / g.w) % g.h, ch = (k / (g.w * g.h)) % g.c, i = k / (g.w * g.h * g.c);
    float s = 0.0f;
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      const int64_t ty = iy + g.pad - ki;
      if (ty < 0 || ty % g.stride != 0) continue;
      const int64_t oy = ty / g.stride;
      if (oy >= g.oh) continue;
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        const int64_t tx = ix + g.pad - kj;
        if (tx < 0 || tx % g.stride != 0) continue;
        const int64_t ox = tx / g.stride;
        if (ox >= g.ow) continue;
        s += col[((ch * g.kh + ki) * g.kw + kj) * np + i * p + oy * g.ow + ox];
      }
    }
    x[k] = accumulate ? x[k] + s : s;
  }
}

__global__ void ToChannelMajorKernel(int64_t n, int64_t oc, int64_t p, const float* x, float* y) {
  // y[o, i*p + j] = x[i, o, j]; indexed by the output so writes coalesce.
  FOR_EACH(k, n * oc * p) {
    const int64_t o = k / (n * p), rest = k % (n * p), i = rest / p, j = rest % p;
    y[k] = x[(i * oc + o) * p + j];
  }
}

__global__ void ToBatchMajorKernel(int64_t n, int64_t oc, int64_t p, const float* x, const float* bias, float* y,
                                   bool accumulate) {
  // y[i, o, j] (+)= x[o, i*p + j] + bias[o].
  FOR_EACH(k, n * oc * p) {
    const int64_t j = k % p, o = (k / p) % oc, i = k / (p * oc);
    const float v = x[o * n * p + i * p + j] + (bias ? bias[o] : 0.0f);
    y[k] = accumulate ? y[k] + v : v;
  }
}

__global__ void AddChannelBiasKernel(int64_t n, int64_t c, int64_t hw, const float* bias, float* y) {
  FOR_EACH(k, n * c * hw) y[k] += bias[(k / hw) % c];
}

// One block per channel.
__global__ void ChannelSumKernel(int64_t n, int64_t c, int64_t hw, const float* dy, float* db) {
  __shared__ float partial[kThreads];
  const int64_t ch = blockIdx.x;
  float s = 0.0f;
  for (int64_t k = threadIdx.x; k < n * hw; k += blockDim.x) s += dy[((k / hw) * c + ch) * hw + k % hw];
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[ch] += partial[0];
}

}  // namespace

void Im2Col(cudaStream_t s, const Conv& g, const float* x, float* col) {
  Im2ColKernel<<<Blocks(g.c * g.kh * g.kw * g.n * g.oh * g.ow), kThreads, 0, s>>>(g, x, col);
}

void Col2Im(cudaStream_t s, const Conv& g, const float* col, float* x, bool accumulate) {
  Col2ImKernel<<<Blocks(g.n * g.c * g.h * g.w), kThreads, 0, s>>>(g, col, x, accumulate);
}

void ToChannelMajor(cudaStream_t s, int64_t n, int64_t oc, int64_t p, const float* x, float* y) {
  ToChannelMajorKernel<<<Blocks(n * oc * p), kThreads, 0, s>>>(n, oc, p, x, y);
}

void ToBatchMajor(cudaStream_t s, int64_t n, int64_t oc, int64_t p, const float* x, const float* bias, float* y,
                  bool accumulate) {
  ToBatchMajorKernel<<<Blocks(n * oc * p), kThreads, 0, s>>>(n, oc, p, x, bias, y, accumulate);
}

void AddChannelBias(cudaStream_t s, int64_t n, int64_t c, int64_t hw, const float* bias, float* y) {
  AddChannelBiasKernel<<<Blocks(n * c * hw), kThreads, 0, s>>>(n, c, hw, bias, y);
}

void ChannelSum(cudaStream_t s, int64_t n, int64_t c, int64_t hw, const float* dy, float* db) {
  if (c == 0) return;
  ChannelSumKernel<<<static_cast<unsigned>(c), kThreads, 0, s>>>(n, c, hw, dy, db);
}

}  // namespace troupe::cuda::kernels
