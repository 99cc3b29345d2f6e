// CpuBackend: everything but the dense/conv kernels (those are in cpu_conv.cc).
#include "engine/nn/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/status_macros.h"
#include "engine/nn/tensor.h"

namespace troupe::nn {
namespace {
// Elementwise loops shorter than this run on one thread.
constexpr int64_t kGrain = 1 << 15;

inline float SoftplusF(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
inline float SigmoidF(float x) { return 1.0f / (1.0f + std::exp(-x)); }
}  // namespace

CpuBackend::CpuBackend(int num_threads) : pool_(num_threads) {
  for (auto& s : scratch_) s.resize(pool_.num_threads());
}

CpuBackend::~CpuBackend() {
  for (auto& kind : scratch_) {
    for (auto& b : kind) FreeFloats(b.data);
  }
}

float* CpuBackend::Scratch(int kind, int slot, int64_t count) {
  Buffer& b = scratch_[kind][slot];
  if (b.capacity < count) {
    FreeFloats(b.data);
    b.data = AllocateFloats(count);
    b.capacity = count;
  }
  return b.data;
}

// --- Memory --------------------------------------------------------------------

void CategoricalProjectionRow(std::span<const float> probabilities, float reward, float discount, float v_min,
                           float v_max, std::span<float> out) {
  const int n = static_cast<int>(probabilities.size());
  TROUPE_CHECK(n >= 2 && out.size() == probabilities.size());
  const float dz = (v_max - v_min) / static_cast<float>(n - 1);
  std::fill(out.begin(), out.end(), 0.0f);
  for (int j = 0; j < n; ++j) {
    // Bellemare et al. 2017, Algorithm 1: Tz_j clipped, then split between
    // the atoms below (l) and above (u) it.
    const float tz = std::clamp(reward + discount * (v_min + j * dz), v_min, v_max);
    const float b = std::clamp((tz - v_min) / dz, 0.0f, static_cast<float>(n - 1));
    const int l = static_cast<int>(std::floor(b));
    const int u = static_cast<int>(std::ceil(b));
    if (l == u) {
      out[l] += probabilities[j];
    } else {
      out[l] += probabilities[j] * (static_cast<float>(u) - b);
      out[u] += probabilities[j] * (b - static_cast<float>(l));
    }
  }
}

void* CpuBackend::Allocate(size_t bytes) {
  const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, rounded);
  TROUPE_CHECK(p != nullptr);
  return p;
}

void CpuBackend::Free(void* p) { std::free(p); }

void CpuBackend::Upload(const void* host, void* device, size_t bytes) { std::memcpy(device, host, bytes); }

void CpuBackend::Download(const void* device, void* host, size_t bytes) { std::memcpy(host, device, bytes); }

void CpuBackend::Fill(float* x, int64_t n, float value) {
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) { std::fill(x + b, x + e, value); });
}

void CpuBackend::Copy(const float* x, float* y, int64_t n) {
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) { std::memcpy(y + b, x + b, sizeof(float) * (e - b)); });
}

void CpuBackend::Axpy(float alpha, const float* x, float* y, int64_t n) {
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] += alpha * x[i];
  });
}

void CpuBackend::AddScalar(float alpha, const float* scalar, float* y, int64_t n) {
  const float add = alpha * scalar[0];
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] += add;
  });
}

void CpuBackend::CopyBlocks(int64_t outer, int64_t len, const float* src, int64_t src_stride, int64_t src_offset,
                            float* dst, int64_t dst_stride, int64_t dst_offset, bool accumulate) {
  pool_.ParallelFor(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, len)), [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      const float* s = src + o * src_stride + src_offset;
      float* d = dst + o * dst_stride + dst_offset;
      if (accumulate) {
        for (int64_t i = 0; i < len; ++i) d[i] += s[i];
      } else {
        std::memcpy(d, s, sizeof(float) * len);
      }
    }
  });
}

// --- Elementwise ---------------------------------------------------------------

void CpuBackend::ActivationForward(Activation f, float alpha, const float* x, float* y, int64_t n) {
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
    switch (f) {
      case Activation::kRelu:
        for (int64_t i = b; i < e; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
        break;
      case Activation::kLeakyRelu:
        for (int64_t i = b; i < e; ++i) y[i] = x[i] > 0.0f ? x[i] : alpha * x[i];
        break;
      case Activation::kElu:
        for (int64_t i = b; i < e; ++i) y[i] = x[i] > 0.0f ? x[i] : alpha * std::expm1(x[i]);
        break;
      case Activation::kTanh:
        for (int64_t i = b; i < e; ++i) y[i] = std::tanh(x[i]);
        break;
      case Activation::kSigmoid:
        for (int64_t i = b; i < e; ++i) y[i] = SigmoidF(x[i]);
        break;
      case Activation::kSoftplus:
        for (int64_t i = b; i < e; ++i) y[i] = SoftplusF(x[i]);
        break;
    }
  });
}

void CpuBackend::ActivationBackward(Activation f, float alpha, const float* x, const float* y, const float* dy,
                                    float* dx, int64_t n) {
  // Every operand is loaded whatever the branch: a load only on one side
  // (x > 0 ? dy : 0) kept GCC from vectorizing, and the scalar loop
  // mispredicted on every other sign (~30x slower over 256x256 floats).
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
    switch (f) {
      case Activation::kRelu:
        for (int64_t i = b; i < e; ++i) {
          const float g = dy[i];
          dx[i] += x[i] > 0.0f ? g : 0.0f;
        }
        break;
      case Activation::kLeakyRelu:
        for (int64_t i = b; i < e; ++i) {
          const float g = dy[i];
          dx[i] += x[i] > 0.0f ? g : alpha * g;
        }
        break;
      case Activation::kElu:
        // d/dx alpha*(e^x - 1) = y + alpha.
        for (int64_t i = b; i < e; ++i) {
          const float g = dy[i], slope = y[i] + alpha;
          dx[i] += x[i] > 0.0f ? g : slope * g;
        }
        break;
      case Activation::kTanh:
        for (int64_t i = b; i < e; ++i) dx[i] += (1.0f - y[i] * y[i]) * dy[i];
        break;
      case Activation::kSigmoid:
        for (int64_t i = b; i < e; ++i) dx[i] += y[i] * (1.0f - y[i]) * dy[i];
        break;
      case Activation::kSoftplus:
        for (int64_t i = b; i < e; ++i) dx[i] += SigmoidF(x[i]) * dy[i];
        break;
    }
  });
}

void CpuBackend::BinaryForward(Binary op, const float* a, const float* b, float* y, int64_t n) {
  pool_.ParallelFor(n, kGrain, [&](int64_t lo, int64_t hi) {
    switch (op) {
      case Binary::kAdd:
        for (int64_t i = lo; i < hi; ++i) y[i] = a[i] + b[i];
        break;
      case Binary::kSub:
        for (int64_t i = lo; i < hi; ++i) y[i] = a[i] - b[i];
        break;
      case Binary::kMul:
        for (int64_t i = lo; i < hi; ++i) y[i] = a[i] * b[i];
        break;
    }
  });
}

void CpuBackend::BinaryBackward(Binary op, const float* a, const float* b, const float* dy, float* da, float* db,
                                int64_t n) {
  pool_.ParallelFor(n, kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      switch (op) {
        case Binary::kAdd:
          if (da) da[i] += dy[i];
          if (db) db[i] += dy[i];
          break;
        case Binary::kSub:
          if (da) da[i] += dy[i];
          if (db) db[i] -= dy[i];
          break;
        case Binary::kMul:
          if (da) da[i] += b[i] * dy[i];
          if (db) db[i] += a[i] * dy[i];
          break;
      }
    }
  });
}

void CpuBackend::Scale(float alpha, const float* x, float* y, int64_t n) {
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = alpha * x[i];
  });
}

// --- Reductions ----------------------------------------------------------------

namespace {
double SumOf(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}
double SquaredNormOf(const float* x, int64_t n) {
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}
}  // namespace

void CpuBackend::Sum(const float* x, int64_t n, float scale, float* y) {
  y[0] = static_cast<float>(SumOf(x, n) * scale);
}

void CpuBackend::SquaredNorm(const float* x, int64_t n, float* y) { y[0] = static_cast<float>(SquaredNormOf(x, n)); }

void CpuBackend::SumAxis(int64_t outer, int64_t reduce, int64_t inner, const float* x, float* y) {
  for (int64_t o = 0; o < outer; ++o) {
    float* yo = y + o * inner;
    std::fill(yo, yo + inner, 0.0f);
    for (int64_t r = 0; r < reduce; ++r) {
      const float* xr = x + (o * reduce + r) * inner;
      for (int64_t i = 0; i < inner; ++i) yo[i] += xr[i];
    }
  }
}

void CpuBackend::SumAxisBackward(int64_t outer, int64_t reduce, int64_t inner, const float* dy, float* dx) {
  for (int64_t o = 0; o < outer; ++o) {
    const float* d = dy + o * inner;
    for (int64_t r = 0; r < reduce; ++r) {
      float* xr = dx + (o * reduce + r) * inner;
      for (int64_t i = 0; i < inner; ++i) xr[i] += d[i];
    }
  }
}

// --- Normalisation -------------------------------------------------------------

void CpuBackend::LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x, const float* gamma,
                                  const float* beta, float* y, float* mean, float* rstd) {
  pool_.ParallelFor(rows, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * cols;
      double s = 0.0, ss = 0.0;
      for (int64_t j = 0; j < cols; ++j) s += xr[j];
      const double mu = s / cols;
      for (int64_t j = 0; j < cols; ++j) ss += (xr[j] - mu) * (xr[j] - mu);
      const float rs = static_cast<float>(1.0 / std::sqrt(ss / cols + eps));
      mean[r] = static_cast<float>(mu);
      rstd[r] = rs;
      float* yr = y + r * cols;
      for (int64_t j = 0; j < cols; ++j) yr[j] = (xr[j] - mean[r]) * rs * gamma[j] + beta[j];
    }
  });
}

void CpuBackend::LayerNormBackward(int64_t rows, int64_t cols, const float* x, const float* gamma, const float* mean,
                                   const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    const float* dr = dy + r * cols;
    // Parameter gradients.
    for (int64_t j = 0; j < cols; ++j) {
      const float xhat = (xr[j] - mean[r]) * rstd[r];
      if (dgamma) dgamma[j] += dr[j] * xhat;
      if (dbeta) dbeta[j] += dr[j];
    }
    if (dx == nullptr) continue;
    // dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy * gamma.
    double sg = 0.0, sgx = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const float g = dr[j] * gamma[j];
      sg += g;
      sgx += g * (xr[j] - mean[r]) * rstd[r];
    }
    const float mg = static_cast<float>(sg / cols), mgx = static_cast<float>(sgx / cols);
    float* dxr = dx + r * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const float xhat = (xr[j] - mean[r]) * rstd[r];
      dxr[j] += rstd[r] * (dr[j] * gamma[j] - mg - xhat * mgx);
    }
  }
}

void CpuBackend::BatchNormStats(int64_t n, int64_t c, int64_t hw, const float* x, float* sums) {
  for (int64_t ch = 0; ch < c; ++ch) {
    double s = 0.0, ss = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + (i * c + ch) * hw;
      for (int64_t j = 0; j < hw; ++j) {
        s += xi[j];
        ss += static_cast<double>(xi[j]) * xi[j];
      }
    }
    sums[ch] = static_cast<float>(s);
    sums[c + ch] = static_cast<float>(ss);
  }
  sums[2 * c] = static_cast<float>(n * hw);
}

void CpuBackend::BatchNormMoments(int64_t c, float eps, float momentum, const float* sums, float* running_mean,
                                  float* running_var, float* mean, float* rstd) {
  if (sums == nullptr) {
    for (int64_t ch = 0; ch < c; ++ch) {
      mean[ch] = running_mean[ch];
      rstd[ch] = 1.0f / std::sqrt(running_var[ch] + eps);
    }
    return;
  }
  const double count = sums[2 * c];
  for (int64_t ch = 0; ch < c; ++ch) {
    const double mu = sums[ch] / count;
    const double var = std::max(0.0, sums[c + ch] / count - mu * mu);
    mean[ch] = static_cast<float>(mu);
    rstd[ch] = static_cast<float>(1.0 / std::sqrt(var + eps));
    if (running_mean != nullptr) {
      const double unbiased = count > 1 ? var * count / (count - 1) : var;
      running_mean[ch] += momentum * (static_cast<float>(mu) - running_mean[ch]);
      running_var[ch] += momentum * (static_cast<float>(unbiased) - running_var[ch]);
    }
  }
}

void CpuBackend::BatchNormApply(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean,
                                const float* rstd, const float* gamma, const float* beta, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t ch = 0; ch < c; ++ch) {
      const float* xi = x + (i * c + ch) * hw;
      float* yi = y + (i * c + ch) * hw;
      const float scale = gamma[ch] * rstd[ch], shift = beta[ch] - mean[ch] * scale;
      for (int64_t j = 0; j < hw; ++j) yi[j] = xi[j] * scale + shift;
    }
  }
}

void CpuBackend::BatchNormBackwardStats(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean,
                                        const float* rstd, const float* dy, float* sums) {
  for (int64_t ch = 0; ch < c; ++ch) {
    double sd = 0.0, sdx = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + (i * c + ch) * hw;
      const float* di = dy + (i * c + ch) * hw;
      for (int64_t j = 0; j < hw; ++j) {
        sd += di[j];
        sdx += di[j] * (xi[j] - mean[ch]) * rstd[ch];
      }
    }
    sums[ch] = static_cast<float>(sd);
    sums[c + ch] = static_cast<float>(sdx);
  }
  sums[2 * c] = static_cast<float>(n * hw);
}

void CpuBackend::BatchNormBackwardApply(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean,
                                        const float* rstd, const float* gamma, const float* sums, const float* dy,
                                        float* dx) {
  const double count = sums[2 * c];
  for (int64_t ch = 0; ch < c; ++ch) {
    const float md = static_cast<float>(sums[ch] / count), mdx = static_cast<float>(sums[c + ch] / count);
    const float k = gamma[ch] * rstd[ch];
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x + (i * c + ch) * hw;
      const float* di = dy + (i * c + ch) * hw;
      float* dxi = dx + (i * c + ch) * hw;
      for (int64_t j = 0; j < hw; ++j) {
        const float xhat = (xi[j] - mean[ch]) * rstd[ch];
        dxi[j] += k * (di[j] - md - xhat * mdx);
      }
    }
  }
}

// --- Softmax family --------------------------------------------------------------

void CpuBackend::SoftmaxForward(int64_t rows, int64_t cols, const float* x, float* y, bool log) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    const float mx = *std::max_element(xr, xr + cols);
    double s = 0.0;
    for (int64_t j = 0; j < cols; ++j) s += std::exp(xr[j] - mx);
    const float lse = mx + static_cast<float>(std::log(s));
    for (int64_t j = 0; j < cols; ++j) yr[j] = log ? xr[j] - lse : std::exp(xr[j] - lse);
  }
}

void CpuBackend::SoftmaxBackward(int64_t rows, int64_t cols, const float* y, const float* dy, float* dx, bool log) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* yr = y + r * cols;
    const float* dr = dy + r * cols;
    float* xr = dx + r * cols;
    if (log) {
      // y = x - lse: dx = dy - softmax * sum(dy).
      double s = 0.0;
      for (int64_t j = 0; j < cols; ++j) s += dr[j];
      for (int64_t j = 0; j < cols; ++j) xr[j] += dr[j] - std::exp(yr[j]) * static_cast<float>(s);
    } else {
      // dx = y * (dy - sum(dy * y)).
      double s = 0.0;
      for (int64_t j = 0; j < cols; ++j) s += dr[j] * yr[j];
      for (int64_t j = 0; j < cols; ++j) xr[j] += yr[j] * (dr[j] - static_cast<float>(s));
    }
  }
}

void CpuBackend::CrossEntropyForward(int64_t rows, int64_t cols, const float* x, const int32_t* labels, float* logp,
                                     float* loss_out) {
  SoftmaxForward(rows, cols, x, logp, /*log=*/true);
  double loss = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    TROUPE_CHECK(labels[r] >= 0 && labels[r] < cols);
    loss -= logp[r * cols + labels[r]];
  }
  loss_out[0] = static_cast<float>(loss / rows);
}

void CpuBackend::CrossEntropyBackward(int64_t rows, int64_t cols, const float* logp, const int32_t* labels,
                                      const float* dloss, float* dx) {
  const float k = dloss[0] / rows;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      dx[r * cols + j] += k * (std::exp(logp[r * cols + j]) - (j == labels[r] ? 1.0f : 0.0f));
    }
  }
}

// --- Distributional RL -------------------------------------------------------------

void CpuBackend::CategoricalProjection(int64_t rows, int64_t atoms, float v_min, float v_max,
                                       const float* probabilities, const float* reward, const float* discount,
                                       float* out) {
  pool_.ParallelFor(rows, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      CategoricalProjectionRow({probabilities + r * atoms, static_cast<size_t>(atoms)}, reward[r], discount[r], v_min,
                               v_max, {out + r * atoms, static_cast<size_t>(atoms)});
    }
  });
}

// --- Images ----------------------------------------------------------------------

namespace {

// One interleaved uint8 image [pixels, channels] as float planes
// [channels, pixels] times `scale`.
void ImageToFloatPlanar(const uint8_t* src, int64_t pixels, int64_t channels, float scale, float* dst) {
  for (int64_t p = 0; p < pixels; ++p) {
    for (int64_t ch = 0; ch < channels; ++ch) dst[ch * pixels + p] = src[p * channels + ch] * scale;
  }
}

}  // namespace

void CpuBackend::GatherRows(int64_t rows, int64_t row_words, const float* table, int64_t count,
                            const int32_t* indices, float* out) {
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(row_words);
  for (int64_t i = 0; i < count; ++i) {
    TROUPE_CHECK(indices[i] >= 0 && indices[i] < rows);
    std::memcpy(out + i * row_words, table + int64_t{indices[i]} * row_words, row_bytes);
  }
}

void CpuBackend::ScatterRows(int64_t rows, int64_t row_words, float* table, int64_t count, const int32_t* indices,
                             const float* values) {
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(row_words);
  for (int64_t i = 0; i < count; ++i) {
    TROUPE_CHECK(indices[i] >= 0 && indices[i] < rows);
    std::memcpy(table + int64_t{indices[i]} * row_words, values + i * row_words, row_bytes);
  }
}

void CpuBackend::GatherBytesToFloatPlanar(int64_t rows, int64_t row_words, const float* table, int64_t images,
                                          const int32_t* indices, int64_t pixels, int64_t channels, float scale,
                                          float* out) {
  TROUPE_CHECK(pixels * channels <= 4 * row_words);
  for (int64_t i = 0; i < images; ++i) TROUPE_CHECK(indices[i] >= 0 && indices[i] < rows);
  pool_.ParallelFor(images, /*min_per_range=*/1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      ImageToFloatPlanar(reinterpret_cast<const uint8_t*>(table + int64_t{indices[i]} * row_words), pixels, channels,
                         scale, out + i * channels * pixels);
    }
  });
}

void CpuBackend::BytesToFloatPlanar(int64_t images, int64_t pixels, int64_t channels, float scale,
                                    const uint8_t* in, float* out) {
  pool_.ParallelFor(images, /*min_per_range=*/1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      ImageToFloatPlanar(in + i * pixels * channels, pixels, channels, scale, out + i * channels * pixels);
    }
  });
}

void CpuBackend::RandomShiftForward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t pad, const int32_t* shifts,
                                    const float* x, float* y) {
  pool_.ParallelFor(n, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t sy = shifts[2 * i] - pad, sx = shifts[2 * i + 1] - pad;
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* xc = x + (i * c + ch) * h * w;
        float* yc = y + (i * c + ch) * h * w;
        for (int64_t r = 0; r < h; ++r) {
          // Replicate padding = clamp the source coordinate.
          const int64_t iy = std::clamp<int64_t>(r + sy, 0, h - 1);
          for (int64_t q = 0; q < w; ++q) yc[r * w + q] = xc[iy * w + std::clamp<int64_t>(q + sx, 0, w - 1)];
        }
      }
    }
  });
}

void CpuBackend::RandomShiftBackward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t pad, const int32_t* shifts,
                                     const float* dy, float* dx) {
  pool_.ParallelFor(n, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t sy = shifts[2 * i] - pad, sx = shifts[2 * i + 1] - pad;
      for (int64_t ch = 0; ch < c; ++ch) {
        float* xc = dx + (i * c + ch) * h * w;
        const float* dc = dy + (i * c + ch) * h * w;
        for (int64_t r = 0; r < h; ++r) {
          const int64_t iy = std::clamp<int64_t>(r + sy, 0, h - 1);
          for (int64_t q = 0; q < w; ++q) xc[iy * w + std::clamp<int64_t>(q + sx, 0, w - 1)] += dc[r * w + q];
        }
      }
    }
  });
}

// --- Spectral normalisation --------------------------------------------------------

void CpuBackend::SpectralNormPowerIteration(int64_t rows, int64_t cols, const float* w, float* u, float* v,
                                            int iterations) {
  auto normalize = [](float* a, int64_t n) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(a[i]) * a[i];
    const float inv = static_cast<float>(1.0 / (std::sqrt(s) + 1e-12));
    for (int64_t i = 0; i < n; ++i) a[i] *= inv;
  };
  for (int it = 0; it < iterations; ++it) {
    // v = normalize(w^T u); u = normalize(w v).
    for (int64_t j = 0; j < cols; ++j) v[j] = 0.0f;
    for (int64_t i = 0; i < rows; ++i) {
      for (int64_t j = 0; j < cols; ++j) v[j] += w[i * cols + j] * u[i];
    }
    normalize(v, cols);
    for (int64_t i = 0; i < rows; ++i) {
      double s = 0.0;
      for (int64_t j = 0; j < cols; ++j) s += w[i * cols + j] * v[j];
      u[i] = static_cast<float>(s);
    }
    normalize(u, rows);
  }
}

void CpuBackend::SpectralNormForward(int64_t rows, int64_t cols, const float* w, const float* u, const float* v,
                                     float* y, float* sigma_out) {
  double sigma = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) sigma += static_cast<double>(u[i]) * w[i * cols + j] * v[j];
  }
  const float inv = static_cast<float>(1.0 / sigma);
  for (int64_t k = 0; k < rows * cols; ++k) y[k] = w[k] * inv;
  sigma_out[0] = static_cast<float>(sigma);
}

void CpuBackend::SpectralNormBackward(int64_t rows, int64_t cols, const float* w, const float* u, const float* v,
                                      const float* sigma_in, const float* dy, float* dw) {
  const float sigma = sigma_in[0];
  double dot = 0.0;
  for (int64_t k = 0; k < rows * cols; ++k) dot += static_cast<double>(dy[k]) * w[k];
  const float inv = 1.0f / sigma;
  const float k2 = static_cast<float>(dot / (static_cast<double>(sigma) * sigma));
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) dw[i * cols + j] += dy[i * cols + j] * inv - k2 * u[i] * v[j];
  }
}

// --- Optimizer kernels --------------------------------------------------------------

void CpuBackend::AdamUpdate(int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float c1,
                            float c2, const float* grad, float* param, float* m, float* v) {
  const float step = lr / c1;
  const float inv_sqrt_c2 = 1.0f / std::sqrt(c2);
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float g = grad[i];
      m[i] = beta1 * m[i] + (1.0f - beta1) * g;
      v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
      // Decoupled weight decay (AdamW); 0 gives plain Adam.
      param[i] -= lr * weight_decay * param[i] + step * m[i] / (std::sqrt(v[i]) * inv_sqrt_c2 + eps);
    }
  });
}

void CpuBackend::SgdUpdate(int64_t n, float lr, float momentum, float weight_decay, const float* grad, float* param,
                           float* buf) {
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float g = grad[i] + weight_decay * param[i];
      buf[i] = momentum * buf[i] + g;
      param[i] -= lr * buf[i];
    }
  });
}

void CpuBackend::ClipByNorm(float* x, int64_t n, float max_norm, float* norm) {
  const float value = static_cast<float>(std::sqrt(SquaredNormOf(x, n)));
  if (norm != nullptr) norm[0] = value;
  if (value > max_norm && value > 0.0f) Scale(max_norm / value, x, x, n);
}

void CpuBackend::Polyak(int64_t n, float tau, const float* online, float* target) {
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) target[i] += tau * (online[i] - target[i]);
  });
}

void CpuBackend::TrustRatio(const float* w_squared, const float* u_squared, float coefficient, float weight_decay,
                            float* ratio) {
  const double w = std::sqrt(static_cast<double>(w_squared[0])), u = std::sqrt(static_cast<double>(u_squared[0]));
  ratio[0] = w > 0 && u > 0 ? static_cast<float>(coefficient * w / (u + weight_decay * w)) : 1.0f;
}

void CpuBackend::ScaleByScalar(float alpha, const float* scalar, float* x, int64_t n) {
  Scale(alpha * scalar[0], x, x, n);
}

}  // namespace troupe::nn
