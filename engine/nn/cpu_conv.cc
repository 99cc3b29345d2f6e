// CpuBackend's dense kernels: GEMM, row bias, and convolutions by im2col +
// Eigen GEMM, one sample per task, spread over the pool.
#include <algorithm>
#include <cstring>

#include <immintrin.h>

#include <Eigen/Core>

#include "common/status_macros.h"
#include "engine/nn/cpu_backend.h"

namespace troupe::nn {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMatrix>;
using Map = Eigen::Map<RowMatrix>;
using StridedMap = Eigen::Map<RowMatrix, 0, Eigen::OuterStride<>>;
using ConstStridedMap = Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>>;

// C[m, n] = alpha * op(A) op(B) + beta * C on one thread; `ldc` is C's row stride,
// `ldb` B's row stride (B is [k, n] or, transposed, [n, k] in memory).
void GemmSerial(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  StridedMap cm(c, m, n, Eigen::OuterStride<>(ldc));
  if (beta == 0.0f) {
    cm.setZero();
  } else if (beta != 1.0f) {
    cm *= beta;
  }
  // Each of the four transpose cases maps A and B with their stored shapes.
  if (!trans_a && !trans_b) {
    cm.noalias() += alpha * ConstStridedMap(a, m, k, Eigen::OuterStride<>(lda)) *
                    ConstStridedMap(b, k, n, Eigen::OuterStride<>(ldb));
  } else if (!trans_a && trans_b) {
    cm.noalias() += alpha * ConstStridedMap(a, m, k, Eigen::OuterStride<>(lda)) *
                    ConstStridedMap(b, n, k, Eigen::OuterStride<>(ldb)).transpose();
  } else if (trans_a && !trans_b) {
    cm.noalias() += alpha * ConstStridedMap(a, k, m, Eigen::OuterStride<>(lda)).transpose() *
                    ConstStridedMap(b, k, n, Eigen::OuterStride<>(ldb));
  } else {
    cm.noalias() += alpha * ConstStridedMap(a, k, m, Eigen::OuterStride<>(lda)).transpose() *
                    ConstStridedMap(b, n, k, Eigen::OuterStride<>(ldb)).transpose();
  }
}

// dst[0, n) = src[0, n) for the short runs im2col copies (one image row,
// tens of floats): whole vectors with an overlapping last one, inline, where
// a memcpy call per row cost more than the copy.
inline void CopyRun(const float* src, float* dst, int64_t n) {
#if defined(__AVX512F__)
  if (n >= 16) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_loadu_ps(src + i));
    if (i < n) _mm512_storeu_ps(dst + n - 16, _mm512_loadu_ps(src + n - 16));
    return;
  }
#endif
#if defined(__AVX__)
  if (n >= 8) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_loadu_ps(src + i));
    if (i < n) _mm256_storeu_ps(dst + n - 8, _mm256_loadu_ps(src + n - 8));
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i];
}

// dst[i] = src[2 * i] for i < n (a stride-2 convolution's row): even lanes
// of two vectors at a time.
inline void CopyEvenLanes(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  // The last pair of loads ends at src[2*i + 31], which must be < 2*n - 1.
  for (; i + 16 < n; i += 16) {
    _mm512_storeu_ps(dst + i, _mm512_permutex2var_ps(_mm512_loadu_ps(src + 2 * i), even,
                                                     _mm512_loadu_ps(src + 2 * i + 16)));
  }
#endif
  for (; i < n; ++i) dst[i] = src[2 * i];
}

// Unrolls output rows [oy0, oy1) of one sample x[c, h, w] into
// col[c*kh*kw, (oy1-oy0)*ow] (zeros for padding).
void Im2Col(const ConvGeometry& g, const float* x, int64_t oy0, int64_t oy1, float* col) {
  const int64_t ow = g.ow(), s = g.stride, cols = (oy1 - oy0) * ow;
  for (int64_t ch = 0; ch < g.c; ++ch) {
    const float* xc = x + ch * g.h * g.w;
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        float* row = col + ((ch * g.kh + ki) * g.kw + kj) * cols;
        // Output columns [lo, hi) read inside the image: ix = ox*s - pad + kj.
        const int64_t lo = std::min(ow, std::max<int64_t>(0, (g.pad - kj + s - 1) / s));
        const int64_t hi = std::max(lo, std::min(ow, (g.w + g.pad - kj + s - 1) / s));
        for (int64_t oy = oy0; oy < oy1; ++oy) {
          const int64_t iy = oy * s - g.pad + ki;
          float* out = row + (oy - oy0) * ow;
          if (iy < 0 || iy >= g.h) {
            std::memset(out, 0, sizeof(float) * ow);
            continue;
          }
          for (int64_t ox = 0; ox < lo; ++ox) out[ox] = 0.0f;
          const float* src = xc + iy * g.w + lo * s - g.pad + kj;
          if (s == 1) {
            CopyRun(src, out + lo, hi - lo);
          } else if (s == 2) {
            CopyEvenLanes(src, out + lo, hi - lo);
          } else {
            for (int64_t ox = lo; ox < hi; ++ox) out[ox] = src[(ox - lo) * s];
          }
          for (int64_t ox = hi; ox < ow; ++ox) out[ox] = 0.0f;
        }
      }
    }
  }
}

// The adjoint of Im2Col: x[c, h, w] += scatter of col.
void Col2Im(const ConvGeometry& g, const float* col, float* x) {
  const int64_t oh = g.oh(), ow = g.ow();
  for (int64_t ch = 0; ch < g.c; ++ch) {
    float* xc = x + ch * g.h * g.w;
    for (int64_t ki = 0; ki < g.kh; ++ki) {
      for (int64_t kj = 0; kj < g.kw; ++kj) {
        const float* row = col + ((ch * g.kh + ki) * g.kw + kj) * oh * ow;
        for (int64_t oy = 0; oy < oh; ++oy) {
          const int64_t iy = oy * g.stride - g.pad + ki;
          if (iy < 0 || iy >= g.h) continue;
          const float* in = row + oy * ow;
          float* xr = xc + iy * g.w;
          if (g.stride == 1) {
            const int64_t lo = std::max<int64_t>(0, g.pad - kj);
            const int64_t hi = std::min<int64_t>(ow, g.w + g.pad - kj);
            float* dst = xr + lo - g.pad + kj;
            for (int64_t ox = lo; ox < hi; ++ox) dst[ox - lo] += in[ox];
          } else {
            for (int64_t ox = 0; ox < ow; ++ox) {
              const int64_t ix = ox * g.stride - g.pad + kj;
              if (ix >= 0 && ix < g.w) xr[ix] += in[ox];
            }
          }
        }
      }
    }
  }
}

// y = act(y + b) over a block [oc, cols] (row stride ld) of one sample's
// output, while it is in cache.
void BiasActivation(FusedActivation act, int64_t oc, int64_t cols, int64_t ld, const float* b, float* y) {
  for (int64_t o = 0; o < oc; ++o) {
    float* yo = y + o * ld;
    const float bo = b != nullptr ? b[o] : 0.0f;
    if (act == FusedActivation::kRelu) {
      for (int64_t j = 0; j < cols; ++j) yo[j] = std::max(yo[j] + bo, 0.0f);
    } else if (b != nullptr) {
      for (int64_t j = 0; j < cols; ++j) yo[j] += bo;
    }
  }
}

// Whether dx of a convolution is itself a stride-1 convolution of dy (with
// the flipped, transposed weights and "full" padding kh - 1 - pad), which is
// one well-shaped GEMM (inner dimension oc*kh*kw) and no scatter, instead of
// the GEMM with inner dimension oc and a col2im scatter-add.
bool DxIsConvolution(const ConvGeometry& g) { return g.stride == 1 && g.kh == g.kw && g.pad <= g.kh - 1; }

// flipped[c, (o, a, b)] = w[o, c, kh-1-a, kw-1-b].
void FlipWeights(const ConvGeometry& g, const float* w, float* flipped) {
  const int64_t kk = g.kh * g.kw;
  for (int64_t o = 0; o < g.oc; ++o) {
    for (int64_t ch = 0; ch < g.c; ++ch) {
      const float* src = w + (o * g.c + ch) * kk;
      float* dst = flipped + (ch * g.oc + o) * kk;
      for (int64_t j = 0; j < kk; ++j) dst[j] = src[kk - 1 - j];
    }
  }
}

// Convolutions unroll and multiply a block of whole output rows at a time,
// about this many output pixels: the block's columns (c*kh*kw rows of them)
// stay in L2 from im2col through Eigen's packing instead of going out to
// memory and back for the whole image.
constexpr int64_t kBlockPixels = 512;
int64_t BlockRows(int64_t ow, int64_t oh) { return std::clamp<int64_t>(kBlockPixels / ow, 1, oh); }

}  // namespace

void CpuBackend::Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                      const float* b, float beta, float* c) {
  const Call call(this, "Gemm", {a, b, c});
  const int64_t lda = trans_a ? m : k;
  const int64_t ldb = trans_b ? k : n;
  const double flops = 2.0 * m * n * k;
  const int threads = flops < 4e6 ? 1 : pool_.num_threads();
  if (threads == 1) {
    GemmSerial(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, n);
    return;
  }
  if (m >= n) {
    // Split C's rows: each range uses the matching rows of op(A).
    pool_.ParallelFor(m, 16, [&](int64_t begin, int64_t end) {
      const float* a_part = trans_a ? a + begin : a + begin * lda;
      GemmSerial(trans_a, trans_b, end - begin, n, k, alpha, a_part, lda, b, ldb, beta, c + begin * n, n);
    });
  } else {
    // Split C's columns: each range uses the matching columns of op(B).
    pool_.ParallelFor(n, 16, [&](int64_t begin, int64_t end) {
      const float* b_part = trans_b ? b + begin * ldb : b + begin;
      GemmSerial(trans_a, trans_b, m, end - begin, k, alpha, a, lda, b_part, ldb, beta, c + begin, n);
    });
  }
}

void CpuBackend::AddRowBias(int64_t rows, int64_t cols, const float* bias, float* y) {
  const Call call(this, "AddRowBias", {bias, y});
  pool_.ParallelFor(rows, std::max<int64_t>(1, 32768 / std::max<int64_t>(1, cols)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* yr = y + r * cols;
      for (int64_t j = 0; j < cols; ++j) yr[j] += bias[j];
    }
  });
}

void CpuBackend::RowBiasBackward(int64_t rows, int64_t cols, const float* dy, float* dbias) {
  const Call call(this, "RowBiasBackward", {dy, dbias});
  for (int64_t r = 0; r < rows; ++r) {
    const float* d = dy + r * cols;
    for (int64_t j = 0; j < cols; ++j) dbias[j] += d[j];
  }
}

void CpuBackend::ZeroPartials(int64_t count) {
  for (int t = 0; t < pool_.num_threads(); ++t) std::memset(Scratch(1, t, count), 0, sizeof(float) * count);
}

void CpuBackend::AddPartials(int64_t dw_count, float* dw, int64_t db_count, float* db) {
  for (int t = 0; t < pool_.num_threads(); ++t) {
    const float* partial = scratch_[1][t].data;
    if (dw != nullptr) {
      for (int64_t j = 0; j < dw_count; ++j) dw[j] += partial[j];
    }
    if (db != nullptr) {
      for (int64_t j = 0; j < db_count; ++j) db[j] += partial[dw_count + j];
    }
  }
}

void CpuBackend::Conv2dForward(const ConvGeometry& g, FusedActivation act, const float* x, const float* w,
                               const float* b, float* y) {
  const Call call(this, "Conv2dForward", {x, w, b, y});
  const int64_t p = g.oh() * g.ow(), ckk = g.c * g.kh * g.kw;
  const int64_t x_stride = g.c * g.h * g.w, y_stride = g.oc * p;
  const int64_t oh = g.oh(), ow = g.ow(), rows = BlockRows(ow, oh);
  // Size every thread's columns before the parallel loop.
  for (int t = 0; t < pool_.num_threads(); ++t) Scratch(0, t, ckk * rows * ow);
  pool_.ParallelTasks(g.n, [&](int64_t begin, int64_t end) {
    float* col = scratch_[0][CurrentWorkerIndex()].data;
    for (int64_t i = begin; i < end; ++i) {
      // y_i[oc, block] = act(w[oc, ckk] * col[ckk, block] + b), block by block.
      for (int64_t oy = 0; oy < oh; oy += rows) {
        const int64_t oy1 = std::min(oh, oy + rows), cols = (oy1 - oy) * ow;
        Im2Col(g, x + i * x_stride, oy, oy1, col);
        float* yb = y + i * y_stride + oy * ow;
        GemmSerial(false, false, g.oc, cols, ckk, 1.0f, w, ckk, col, cols, 0.0f, yb, p);
        BiasActivation(act, g.oc, cols, p, b, yb);
      }
    }
  });
}

void CpuBackend::Conv2dBackward(const ConvGeometry& g, FusedActivation act, const float* x, const float* w,
                                const float* y, const float* dy, float* dx, float* dw, float* db) {
  const Call call(this, "Conv2dBackward", {x, w, y, dy, dx, dw, db});
  const int64_t p = g.oh() * g.ow(), ckk = g.c * g.kh * g.kw, hw = g.h * g.w;
  const int64_t x_stride = g.c * hw, y_stride = g.oc * p;
  const int threads = pool_.num_threads();
  const bool dx_as_conv = dx != nullptr && DxIsConvolution(g);
  // dx as a convolution of dy: its geometry, columns and weights.
  ConvGeometry back;
  back.c = g.oc, back.h = g.oh(), back.w = g.ow();
  back.oc = g.c, back.kh = g.kh, back.kw = g.kw, back.stride = 1, back.pad = g.kh - 1 - g.pad;
  const int64_t back_rows = g.oc * g.kh * g.kw;
  float* flipped = nullptr;
  if (dx_as_conv) {
    flipped = Scratch(3, 0, g.c * back_rows);
    FlipWeights(g, w, flipped);
  }
  const int64_t oh = g.oh(), ow = g.ow(), rows = BlockRows(ow, oh), back_block = BlockRows(g.w, g.h);
  // Per thread: columns, the activation's gradient, and weight/bias gradient
  // partials (zeroed).
  for (int t = 0; t < threads; ++t) {
    Scratch(0, t, std::max(ckk * rows * ow, dx_as_conv ? back_rows * back_block * g.w : ckk * p));
    if (act != FusedActivation::kNone) Scratch(2, t, y_stride);
  }
  ZeroPartials(g.oc * ckk + g.oc);
  pool_.ParallelTasks(g.n, [&](int64_t begin, int64_t end) {
    const int slot = CurrentWorkerIndex();
    float* col = scratch_[0][slot].data;
    float* dw_part = scratch_[1][slot].data;
    float* db_part = dw_part + g.oc * ckk;
    for (int64_t i = begin; i < end; ++i) {
      const float* dyi = dy + i * y_stride;
      if (act == FusedActivation::kRelu) {
        // Through the ReLU: y > 0 exactly where its input was.
        float* dpre = scratch_[2][slot].data;
        const float* yi = y + i * y_stride;
        for (int64_t j = 0; j < y_stride; ++j) dpre[j] = yi[j] > 0.0f ? dyi[j] : 0.0f;
        dyi = dpre;
      }
      // dw[oc, ckk] += dy_i[oc, block] * col[ckk, block]^T, block by block.
      for (int64_t oy = 0; dw != nullptr && oy < oh; oy += rows) {
        const int64_t oy1 = std::min(oh, oy + rows), cols = (oy1 - oy) * ow;
        Im2Col(g, x + i * x_stride, oy, oy1, col);
        GemmSerial(false, true, g.oc, ckk, cols, 1.0f, dyi + oy * ow, p, col, cols, 1.0f, dw_part, ckk);
      }
      // db[oc] += sum_p dy_i.
      if (db != nullptr) {
        for (int64_t o = 0; o < g.oc; ++o) {
          const float* d = dyi + o * p;
          float s = 0.0f;
          for (int64_t j = 0; j < p; ++j) s += d[j];
          db_part[o] += s;
        }
      }
      if (dx_as_conv) {
        // dx_i[c, block] += flipped[c, oc*kh*kw] * im2col(dy_i)[oc*kh*kw, block].
        for (int64_t iy = 0; iy < g.h; iy += back_block) {
          const int64_t iy1 = std::min(g.h, iy + back_block), cols = (iy1 - iy) * g.w;
          Im2Col(back, dyi, iy, iy1, col);
          GemmSerial(false, false, g.c, cols, back_rows, 1.0f, flipped, back_rows, col, cols, 1.0f,
                     dx + i * x_stride + iy * g.w, hw);
        }
      } else if (dx != nullptr) {
        // dx_i += col2im(w^T[ckk, oc] * dy_i[oc, p]).
        GemmSerial(true, false, ckk, p, g.oc, 1.0f, w, ckk, dyi, p, 0.0f, col, p);
        Col2Im(g, col, dx + i * x_stride);
      }
    }
  });
  AddPartials(g.oc * ckk, dw, g.oc, db);
}

void CpuBackend::ConvTranspose2dForward(const ConvGeometry& g, const float* x, const float* w, const float* b,
                                        float* y) {
  const Call call(this, "ConvTranspose2dForward", {x, w, b, y});
  const int64_t p = g.oh() * g.ow(), ckk = g.c * g.kh * g.kw, hw = g.h * g.w;
  const int64_t x_stride = g.oc * p, y_stride = g.c * hw;
  for (int t = 0; t < pool_.num_threads(); ++t) Scratch(0, t, ckk * p);
  pool_.ParallelTasks(g.n, [&](int64_t begin, int64_t end) {
    float* col = scratch_[0][CurrentWorkerIndex()].data;
    for (int64_t i = begin; i < end; ++i) {
      // y_i = col2im(w^T[ckk, oc] * x_i[oc, p]) + b.
      float* yi = y + i * y_stride;
      GemmSerial(true, false, ckk, p, g.oc, 1.0f, w, ckk, x + i * x_stride, p, 0.0f, col, p);
      std::memset(yi, 0, sizeof(float) * y_stride);
      Col2Im(g, col, yi);
      if (b != nullptr) {
        for (int64_t ch = 0; ch < g.c; ++ch) {
          for (int64_t j = 0; j < hw; ++j) yi[ch * hw + j] += b[ch];
        }
      }
    }
  });
}

void CpuBackend::ConvTranspose2dBackward(const ConvGeometry& g, const float* x, const float* w, const float* dy,
                                         float* dx, float* dw, float* db) {
  const Call call(this, "ConvTranspose2dBackward", {x, w, dy, dx, dw, db});
  const int64_t p = g.oh() * g.ow(), ckk = g.c * g.kh * g.kw, hw = g.h * g.w;
  const int64_t x_stride = g.oc * p, y_stride = g.c * hw;
  const int threads = pool_.num_threads();
  for (int t = 0; t < threads; ++t) Scratch(0, t, ckk * p);
  ZeroPartials(g.oc * ckk + g.c);
  pool_.ParallelTasks(g.n, [&](int64_t begin, int64_t end) {
    const int slot = CurrentWorkerIndex();
    float* col = scratch_[0][slot].data;
    float* dw_part = scratch_[1][slot].data;
    float* db_part = dw_part + g.oc * ckk;
    for (int64_t i = begin; i < end; ++i) {
      const float* dyi = dy + i * y_stride;
      // col = im2col(dy_i): the transposed conv's backward is a conv.
      Im2Col(g, dyi, 0, g.oh(), col);
      // dw[oc, ckk] += x_i[oc, p] * col^T.
      if (dw != nullptr) GemmSerial(false, true, g.oc, ckk, p, 1.0f, x + i * x_stride, p, col, p, 1.0f, dw_part, ckk);
      // dx_i[oc, p] += w[oc, ckk] * col.
      if (dx != nullptr) GemmSerial(false, false, g.oc, p, ckk, 1.0f, w, ckk, col, p, 1.0f, dx + i * x_stride, p);
      if (db != nullptr) {
        for (int64_t ch = 0; ch < g.c; ++ch) {
          float s = 0.0f;
          for (int64_t j = 0; j < hw; ++j) s += dyi[ch * hw + j];
          db_part[ch] += s;
        }
      }
    }
  });
  AddPartials(g.oc * ckk, dw, g.c, db);
}

}  // namespace troupe::nn
