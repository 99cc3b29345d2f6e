// Convolution helpers for the CUDA backend: whole-batch im2col / col2im and
// the [n, oc, P] <-> [oc, n*P] layout changes around the one big GEMM
// (Caffe's and early cuDNN's "explicit GEMM" convolution), and the one-pass
// bias / ReLU / bfloat16 epilogues around cuDNN's convolutions.
// Index arithmetic is 32-bit wherever the tensors allow (indexing.cuh).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "engine/cuda/indexing.cuh"
#include "engine/cuda/kernels.h"

namespace troupe::cuda::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 8192;

int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

// Block (x, y): row y = (ch, ki, kj) of col, columns (i, oy, ox) strided over x.
template <typename I>
__global__ void Im2ColKernel(Conv g, const float* x, float* col) {
  const I oh = g.oh, ow = g.ow, p = oh * ow, np = static_cast<I>(g.n) * p;
  const I h = g.h, w = g.w, c = g.c, kh = g.kh, kw = g.kw, stride = g.stride, pad = g.pad;
  for (I row = blockIdx.y; row < c * kh * kw; row += gridDim.y) {
    const I kj = row % kw, ki = (row / kw) % kh, ch = row / (kw * kh);
    float* out = col + row * np;
    FOR_EACH_INDEX(I, column, np) {
      const I i = column / p, pix = column % p, oy = pix / ow, ox = pix % ow;
      const I iy = oy * stride - pad + ki, ix = ox * stride - pad + kj;
      out[column] = (iy >= 0 && iy < h && ix >= 0 && ix < w) ? x[((i * c + ch) * h + iy) * w + ix] : 0.0f;
    }
  }
}

// One thread per x entry, gathering every col entry that read it (no atomics).
template <typename I>
__global__ void Col2ImKernel(Conv g, const float* col, float* x, bool accumulate) {
  const I oh = g.oh, ow = g.ow, p = oh * ow, np = static_cast<I>(g.n) * p;
  const I h = g.h, w = g.w, c = g.c, kh = g.kh, kw = g.kw, stride = g.stride, pad = g.pad;
  FOR_EACH_INDEX(I, k, static_cast<I>(g.n) * c * h * w) {
    const I ix = k % w, iy = (k / w) % h, ch = (k / (w * h)) % c, i = k / (w * h * c);
    float s = 0.0f;
    for (I ki = 0; ki < kh; ++ki) {
      const I ty = iy + pad - ki;
      if (ty < 0 || ty % stride != 0) continue;
      const I oy = ty / stride;
      if (oy >= oh) continue;
      for (I kj = 0; kj < kw; ++kj) {
        const I tx = ix + pad - kj;
        if (tx < 0 || tx % stride != 0) continue;
        const I ox = tx / stride;
        if (ox >= ow) continue;
        s += col[((ch * kh + ki) * kw + kj) * np + i * p + oy * ow + ox];
      }
    }
    x[k] = accumulate ? x[k] + s : s;
  }
}

template <typename I>
__global__ void ToChannelMajorKernel(int64_t n64, int64_t oc64, int64_t p64, const float* x, float* y) {
  // y[o, i*p + j] = x[i, o, j]; indexed by the output so writes coalesce.
  const I n = n64, oc = oc64, p = p64;
  FOR_EACH_INDEX(I, k, n * oc * p) {
    const I o = k / (n * p), rest = k % (n * p), i = rest / p, j = rest % p;
    y[k] = x[(i * oc + o) * p + j];
  }
}

template <typename I>
__global__ void ToBatchMajorKernel(int64_t n64, int64_t oc64, int64_t p64, const float* x, const float* bias, float* y,
                                   bool accumulate) {
  // y[i, o, j] (+)= x[o, i*p + j] + bias[o].
  const I n = n64, oc = oc64, p = p64;
  FOR_EACH_INDEX(I, k, n * oc * p) {
    const I j = k % p, o = (k / p) % oc, i = k / (p * oc);
    const float v = x[o * n * p + i * p + j] + (bias ? bias[o] : 0.0f);
    y[k] = accumulate ? y[k] + v : v;
  }
}

// One block per channel, kChannelThreads wide.
template <typename I>
__global__ void __launch_bounds__(kChannelThreads)
    ChannelSumKernel(int64_t n64, int64_t c64, int64_t hw64, const float* dy, float* db) {
  __shared__ float partial[kChannelThreads];
  const I n = n64, c = c64, hw = hw64, ch = blockIdx.x;
  float s = 0.0f;
  for (I k = threadIdx.x; k < n * hw; k += blockDim.x) s += dy[((k / hw) * c + ch) * hw + k % hw];
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  if (threadIdx.x == 0) db[ch] += partial[0];
}

__device__ inline float Load(const float* p, int64_t i) { return p[i]; }
__device__ inline float Load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }

template <typename I, typename T>
__global__ void ChannelBiasActivationKernel(int64_t n64, int64_t c64, int64_t hw64, const T* x, const float* bias,
                                            bool relu, float* y) {
  const I n = n64, c = c64, hw = hw64;
  FOR_EACH_INDEX(I, k, n * c * hw) {
    float v = Load(x, k);
    if (bias != nullptr) v += bias[(k / hw) % c];
    y[k] = relu && v < 0.0f ? 0.0f : v;
  }
}

__global__ void ReluGradientKernel(int64_t n, const float* y, const float* dy, float* out) {
  FOR_EACH_INDEX(int64_t, i, n) out[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

__global__ void AddBfloat16Kernel(int64_t n, const __nv_bfloat16* x, float* y, bool accumulate) {
  FOR_EACH_INDEX(int64_t, i, n) y[i] = accumulate ? y[i] + __bfloat162float(x[i]) : __bfloat162float(x[i]);
}

}  // namespace

void Im2Col(cudaStream_t s, const Conv& g, const float* x, float* col) {
  const int64_t rows = g.c * g.kh * g.kw, np = g.n * g.oh * g.ow;
  const dim3 grid(static_cast<unsigned>(Blocks(np)), static_cast<unsigned>(rows < 65535 ? rows : 65535));
  LAUNCH_INDEXED(Im2ColKernel, Fits32(rows * np) && Fits32(g.n * g.c * g.h * g.w), grid, kThreads, s, g, x, col);
}

void Col2Im(cudaStream_t s, const Conv& g, const float* col, float* x, bool accumulate) {
  const int64_t size = g.n * g.c * g.h * g.w;
  LAUNCH_INDEXED(Col2ImKernel, Fits32(size) && Fits32(g.c * g.kh * g.kw * g.n * g.oh * g.ow), Blocks(size), kThreads,
                 s, g, col, x, accumulate);
}

void ToChannelMajor(cudaStream_t s, int64_t n, int64_t oc, int64_t p, const float* x, float* y) {
  LAUNCH_INDEXED(ToChannelMajorKernel, Fits32(n * oc * p), Blocks(n * oc * p), kThreads, s, n, oc, p, x, y);
}

void ToBatchMajor(cudaStream_t s, int64_t n, int64_t oc, int64_t p, const float* x, const float* bias, float* y,
                  bool accumulate) {
  LAUNCH_INDEXED(ToBatchMajorKernel, Fits32(n * oc * p), Blocks(n * oc * p), kThreads, s, n, oc, p, x, bias, y,
                 accumulate);
}

void ChannelSum(cudaStream_t s, int64_t n, int64_t c, int64_t hw, const float* dy, float* db) {
  if (c == 0) return;
  LAUNCH_INDEXED(ChannelSumKernel, Fits32(n * c * hw), static_cast<unsigned>(c), kChannelThreads, s, n, c, hw, dy, db);
}

namespace {
template <typename T>
void LaunchChannelBiasActivation(cudaStream_t s, int64_t n, int64_t c, int64_t hw, const T* x, const float* bias,
                                 bool relu, float* y) {
  const int64_t count = n * c * hw;
  if (Fits32(count)) {
    ChannelBiasActivationKernel<int32_t, T><<<Blocks(count), kThreads, 0, s>>>(n, c, hw, x, bias, relu, y);
  } else {
    ChannelBiasActivationKernel<int64_t, T><<<Blocks(count), kThreads, 0, s>>>(n, c, hw, x, bias, relu, y);
  }
}
}  // namespace

void ChannelBiasActivation(cudaStream_t s, int64_t n, int64_t c, int64_t hw, const float* x, const float* bias,
                           bool relu, float* y) {
  LaunchChannelBiasActivation(s, n, c, hw, x, bias, relu, y);
}

void ChannelBiasActivation(cudaStream_t s, int64_t n, int64_t c, int64_t hw, const uint16_t* x, const float* bias,
                           bool relu, float* y) {
  LaunchChannelBiasActivation(s, n, c, hw, reinterpret_cast<const __nv_bfloat16*>(x), bias, relu, y);
}

void ReluGradient(cudaStream_t s, int64_t n, const float* y, const float* dy, float* out) {
  ReluGradientKernel<<<Blocks(n), kThreads, 0, s>>>(n, y, dy, out);
}

void AddBfloat16(cudaStream_t s, int64_t n, const uint16_t* x, float* y, bool accumulate) {
  AddBfloat16Kernel<<<Blocks(n), kThreads, 0, s>>>(n, reinterpret_cast<const __nv_bfloat16*>(x), y, accumulate);
}

}  // namespace troupe::cuda::kernels
