// CpuBackend: everything but the dense/conv kernels (those are in cpu_conv.cc).
#include "engine/nn/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "common/status_macros.h"
#include "engine/nn/tensor.h"

namespace troupe::nn {
namespace {
// Elementwise loops shorter than this run on one thread.
constexpr int64_t kGrain = 1 << 15;

inline float SoftplusF(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
inline float SigmoidF(float x) { return 1.0f / (1.0f + std::exp(-x)); }
}  // namespace

CpuBackend::CpuBackend(int num_threads, std::unique_ptr<CpuMemoryGuard> guard)
    : pool_(num_threads), guard_(std::move(guard)) {
  for (auto& s : scratch_) s.resize(pool_.num_threads());
}

CpuBackend::~CpuBackend() {
  for (auto& kind : scratch_) {
    for (auto& b : kind) Free(b.data);
  }
  ReleaseScratchPool();
}

void CpuBackend::Enter(const char* kernel, std::initializer_list<const void*> pointers) {
  if (open_calls_++ == 0) guard_->Open();
  int argument = 0;
  for (const void* p : pointers) {
    ++argument;
    if (p != nullptr && !guard_->Owns(p)) {
      std::fprintf(stderr,
                   "%s device: %s was given host memory (pointer argument %d, %p): kernels take only "
                   "device memory (Tape::Input uploads host data)\n",
                   name().c_str(), kernel, argument, p);
      std::abort();
    }
  }
}

void CpuBackend::Leave() {
  if (--open_calls_ == 0) guard_->Close();
}

float* CpuBackend::Scratch(int kind, int slot, int64_t count) {
  Buffer& b = scratch_[kind][slot];
  if (b.capacity < count) {
    Free(b.data);
    b.data = AllocateFloats(count);
    b.capacity = count;
  }
  return b.data;
}

// --- Memory --------------------------------------------------------------------

void* CpuBackend::DeviceAllocate(size_t bytes) {
  if (guard_) return guard_->Allocate(bytes);
  const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, rounded);
  TROUPE_CHECK(p != nullptr);
  return p;
}

void CpuBackend::DeviceFree(void* p) {
  if (guard_) {
    guard_->Free(p);
  } else {
    std::free(p);
  }
}

void CpuBackend::Upload(const void* host, void* device, size_t bytes) {
  const Call call(this, "Upload", {device});
  std::memcpy(device, host, bytes);
}

void CpuBackend::Download(const void* device, void* host, size_t bytes) {
  if (guard_ && host_reads_forbidden()) {
    std::fprintf(stderr,
                 "%s device: Download of %zu bytes inside a step (a host round trip): read what the host "
                 "wants with ReadAtStepEnd, keep reduced values on the device\n",
                 name().c_str(), bytes);
    std::abort();
  }
  const Call call(this, "Download", {device});
  std::memcpy(host, device, bytes);
}

void CpuBackend::Fill(float* x, int64_t n, float value, float step) {
  const Call call(this, "Fill", {x});
  if (step == 0.0f) {
    pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) { std::fill(x + b, x + e, value); });
    return;
  }
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] = value + static_cast<float>(i) * step;
  });
}

void CpuBackend::Copy(const float* x, float* y, int64_t n) {
  const Call call(this, "Copy", {x, y});
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) { std::memcpy(y + b, x + b, sizeof(float) * (e - b)); });
}

void CpuBackend::Axpy(float alpha, const float* x, float* y, int64_t n) {
  const Call call(this, "Axpy", {x, y});
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] += alpha * x[i];
  });
}

void CpuBackend::AddScalar(float alpha, const float* scalar, float* y, int64_t n) {
  const Call call(this, "AddScalar", {scalar, y});
  const float add = alpha * scalar[0];
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] += add;
  });
}

void CpuBackend::CopyBlocks(int64_t outer, int64_t len, const float* src, int64_t src_stride, int64_t src_offset,
                            float* dst, int64_t dst_stride, int64_t dst_offset, bool accumulate) {
  const Call call(this, "CopyBlocks", {src, dst});
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

namespace {

// y (+)= f(x[i]) over [b, e): the accumulate flag outside the loop.
template <typename F>
void MapInto(const float* x, float* y, int64_t b, int64_t e, bool accumulate, F f) {
  if (accumulate) {
    for (int64_t i = b; i < e; ++i) y[i] += f(x[i]);
  } else {
    for (int64_t i = b; i < e; ++i) y[i] = f(x[i]);
  }
}

}  // namespace

void CpuBackend::Unary(UnaryOp op, float alpha, float beta, const float* x, float* y, int64_t n, bool accumulate) {
  const Call call(this, "Unary", {x, y});
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
    auto map = [&](auto f) { MapInto(x, y, b, e, accumulate, f); };
    switch (op) {
      case UnaryOp::kRelu:
        return map([](float v) { return v > 0.0f ? v : 0.0f; });
      case UnaryOp::kLeakyRelu:
        return map([alpha](float v) { return v > 0.0f ? v : alpha * v; });
      case UnaryOp::kElu:
        return map([alpha](float v) { return v > 0.0f ? v : alpha * std::expm1(v); });
      case UnaryOp::kTanh:
        return map([](float v) { return std::tanh(v); });
      case UnaryOp::kSigmoid:
        return map([](float v) { return SigmoidF(v); });
      case UnaryOp::kSoftplus:
        return map([](float v) { return SoftplusF(v); });
      case UnaryOp::kAffine:
        if (beta == 0.0f) return map([alpha](float v) { return alpha * v; });
        return map([alpha, beta](float v) { return alpha * v + beta; });
      case UnaryOp::kClamp:
        return map([alpha, beta](float v) { return std::min(std::max(v, alpha), beta); });
      case UnaryOp::kExp:
        return map([](float v) { return std::exp(v); });
      case UnaryOp::kLog:
        return map([](float v) { return std::log(v); });
      case UnaryOp::kSqrt:
        return map([](float v) { return std::sqrt(v); });
      case UnaryOp::kRsqrt:
        return map([](float v) { return 1.0f / std::sqrt(v); });
      case UnaryOp::kReciprocal:
        return map([](float v) { return 1.0f / v; });
      case UnaryOp::kSquare:
        return map([](float v) { return v * v; });
      case UnaryOp::kAbs:
        return map([](float v) { return std::fabs(v); });
      case UnaryOp::kFloor:
        return map([](float v) { return std::floor(v); });
      case UnaryOp::kStep:
        return map([](float v) { return v > 0.0f ? 1.0f : 0.0f; });
    }
  });
}

void CpuBackend::UnaryBackward(UnaryOp op, float alpha, float beta, const float* x, const float* y, const float* dy,
                               float* dx, int64_t n) {
  const Call call(this, "UnaryBackward", {x, y, dy, dx});
  if (dx == nullptr) return;
  // Every operand is loaded whatever the branch: a load only on one side
  // (x > 0 ? dy : 0) kept GCC from vectorizing, and the scalar loop
  // mispredicted on every other sign (~30x slower over 256x256 floats).
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
    // dx += f'(x) * dy with the derivative from x (or, for `of_y`, from y).
    auto with_x = [&](auto derivative) {
      for (int64_t i = b; i < e; ++i) dx[i] += derivative(x[i]) * dy[i];
    };
    auto with_y = [&](auto derivative) {
      for (int64_t i = b; i < e; ++i) dx[i] += derivative(y[i]) * dy[i];
    };
    switch (op) {
      case UnaryOp::kRelu:
        for (int64_t i = b; i < e; ++i) {
          const float g = dy[i];
          dx[i] += x[i] > 0.0f ? g : 0.0f;
        }
        return;
      case UnaryOp::kLeakyRelu:
        for (int64_t i = b; i < e; ++i) {
          const float g = dy[i];
          dx[i] += x[i] > 0.0f ? g : alpha * g;
        }
        return;
      case UnaryOp::kElu:
        // d/dx alpha*(e^x - 1) = y + alpha.
        for (int64_t i = b; i < e; ++i) {
          const float g = dy[i], slope = y[i] + alpha;
          dx[i] += x[i] > 0.0f ? g : slope * g;
        }
        return;
      case UnaryOp::kTanh:
        for (int64_t i = b; i < e; ++i) dx[i] += (1.0f - y[i] * y[i]) * dy[i];
        return;
      case UnaryOp::kSigmoid:
        for (int64_t i = b; i < e; ++i) dx[i] += y[i] * (1.0f - y[i]) * dy[i];
        return;
      case UnaryOp::kSoftplus:
        for (int64_t i = b; i < e; ++i) dx[i] += SigmoidF(x[i]) * dy[i];
        return;
      case UnaryOp::kAffine:
        for (int64_t i = b; i < e; ++i) dx[i] += alpha * dy[i];
        return;
      case UnaryOp::kClamp:
        return with_x([alpha, beta](float v) { return v >= alpha && v <= beta ? 1.0f : 0.0f; });
      case UnaryOp::kExp:
        return with_y([](float v) { return v; });
      case UnaryOp::kLog:
        return with_x([](float v) { return 1.0f / v; });
      case UnaryOp::kSqrt:
        return with_y([](float v) { return 0.5f / v; });
      case UnaryOp::kRsqrt:
        return with_y([](float v) { return -0.5f * v * v * v; });
      case UnaryOp::kReciprocal:
        return with_y([](float v) { return -v * v; });
      case UnaryOp::kSquare:
        return with_x([](float v) { return 2.0f * v; });
      case UnaryOp::kAbs:
        return with_x([](float v) { return v > 0.0f ? 1.0f : v < 0.0f ? -1.0f : 0.0f; });
      case UnaryOp::kFloor:
      case UnaryOp::kStep:
        return;  // zero almost everywhere
    }
  });
}

namespace {

// y[i] (+)= a[i * sa] op b[i * sb] for i < n (strides 0 or 1).
template <typename Op>
void BinaryRow(const float* a, int64_t sa, const float* b, int64_t sb, float* y, int64_t n, bool accumulate, Op op) {
  if (accumulate) {
    for (int64_t i = 0; i < n; ++i) y[i] += op(a[i * sa], b[i * sb]);
  } else if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) y[i] = op(a[i], b[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = op(a[i * sa], b[i * sb]);
  }
}

}  // namespace

void CpuBackend::BinaryBroadcast(Binary op, const View3& v, const float* a, int a_axes, const float* b, int b_axes,
                                 float* y, bool accumulate) {
  const Call call(this, "BinaryBroadcast", {a, b, y});
  // Both operands whole: one flat row (the elementwise kernels' loop).
  const bool flat = a_axes == kAllAxes && b_axes == kAllAxes;
  const int64_t rows = flat ? 1 : v.outer * v.mid, len = flat ? v.size() : v.inner;
  const Strides3 sa = StridesOf(v, a_axes), sb = StridesOf(v, b_axes);
  auto run = [&](auto f) {
    if (flat) {
      pool_.ParallelFor(len, kGrain, [&](int64_t lo, int64_t hi) {
        BinaryRow(a + lo, 1, b + lo, 1, y + lo, hi - lo, accumulate, f);
      });
      return;
    }
    pool_.ParallelFor(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, len)), [&](int64_t lo, int64_t hi) {
      for (int64_t r = lo; r < hi; ++r) {
        const int64_t o = r / v.mid, m = r % v.mid;
        BinaryRow(a + o * sa.outer + m * sa.mid, sa.inner, b + o * sb.outer + m * sb.mid, sb.inner, y + r * len, len,
                  accumulate, f);
      }
    });
  };
  switch (op) {
    case Binary::kAdd:
      return run([](float p, float q) { return p + q; });
    case Binary::kSub:
      return run([](float p, float q) { return p - q; });
    case Binary::kMul:
      return run([](float p, float q) { return p * q; });
    case Binary::kDiv:
      return run([](float p, float q) { return p / q; });
    case Binary::kMax:
      return run([](float p, float q) { return std::max(p, q); });
    case Binary::kMin:
      return run([](float p, float q) { return std::min(p, q); });
  }
}

void CpuBackend::Reduce(Reduction op, const View3& v, float scale, const float* x, float* y, bool accumulate) {
  const Call call(this, "Reduce", {x, y});
  const bool max = op == Reduction::kMax;
  auto store = [&](float* out, double value) {
    const float result = static_cast<float>(value * scale);
    *out = accumulate ? *out + result : result;
  };
  pool_.ParallelFor(v.outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, v.mid * v.inner)),
                    [&](int64_t lo, int64_t hi) {
    for (int64_t o = lo; o < hi; ++o) {
      const float* xo = x + o * v.mid * v.inner;
      for (int64_t i = 0; i < v.inner; ++i) {
        // Sums in double (as Sum); the max in float.
        double sum = 0.0;
        float most = -std::numeric_limits<float>::infinity();
        for (int64_t r = 0; r < v.mid; ++r) {
          const float value = xo[r * v.inner + i];
          if (max) {
            most = std::max(most, value);
          } else {
            sum += value;
          }
        }
        store(y + o * v.inner + i, max ? most : sum);
      }
    }
  });
}

void CpuBackend::Gather(int64_t outer, int64_t in, int64_t inner, int64_t out, const float* x, const int32_t* indices,
                        float* y) {
  const Call call(this, "Gather", {x, indices, y});
  for (int64_t k = 0; k < outer * out; ++k) TROUPE_CHECK(indices[k] >= 0 && indices[k] < in);
  const size_t bytes = sizeof(float) * static_cast<size_t>(inner);
  pool_.ParallelFor(outer * out, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, inner)),
                    [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      std::memcpy(y + k * inner, x + ((k / out) * in + indices[k]) * inner, bytes);
    }
  });
}

void CpuBackend::Scatter(int64_t outer, int64_t in, int64_t inner, int64_t out, const int32_t* indices,
                         const float* values, float* x, bool add) {
  const Call call(this, "Scatter", {indices, values, x});
  for (int64_t k = 0; k < outer * out; ++k) TROUPE_CHECK(indices[k] >= 0 && indices[k] < in);
  // Places may repeat within an outer row: one thread per outer row.
  pool_.ParallelFor(outer, std::max<int64_t>(1, kGrain / std::max<int64_t>(1, out * inner)),
                    [&](int64_t lo, int64_t hi) {
    for (int64_t o = lo; o < hi; ++o) {
      for (int64_t j = 0; j < out; ++j) {
        const float* value = values + (o * out + j) * inner;
        float* place = x + (o * in + indices[o * out + j]) * inner;
        if (add) {
          for (int64_t i = 0; i < inner; ++i) place[i] += value[i];
        } else {
          std::memcpy(place, value, sizeof(float) * static_cast<size_t>(inner));
        }
      }
    }
  });
}

void CpuBackend::Convert(DType from, const void* x, DType to, void* y, int64_t n, float scale) {
  const Call call(this, "Convert", {x, y});
  auto as_float = [&](int64_t i) -> float {
    switch (from) {
      case DType::kU8:
        return static_cast<const uint8_t*>(x)[i] * scale;
      case DType::kI32:
        return static_cast<float>(static_cast<const int32_t*>(x)[i]) * scale;
      case DType::kF32:
        break;
    }
    return static_cast<const float*>(x)[i] * scale;
  };
  TROUPE_CHECK(to != DType::kU8);
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (to == DType::kF32) {
        static_cast<float*>(y)[i] = as_float(i);
      } else {
        static_cast<int32_t*>(y)[i] = static_cast<int32_t>(as_float(i));
      }
    }
  });
}

void CpuBackend::BinaryBackward(Binary op, const float* a, const float* b, const float* dy, float* da, float* db,
                                int64_t n) {
  const Call call(this, "BinaryBackward", {a, b, dy, da, db});
  if (op != Binary::kAdd && op != Binary::kSub && op != Binary::kMul) {
    return Backend::BinaryBackward(op, a, b, dy, da, db, n);  // which names the op and aborts
  }
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
        default:
          break;
      }
    }
  });
}

void CpuBackend::Scale(float alpha, const float* x, float* y, int64_t n) {
  const Call call(this, "Scale", {x, y});
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
  const Call call(this, "Sum", {x, y});
  y[0] = static_cast<float>(SumOf(x, n) * scale);
}

void CpuBackend::SquaredNorm(const float* x, int64_t n, float* y) {
  const Call call(this, "SquaredNorm", {x, y});
  y[0] = static_cast<float>(SquaredNormOf(x, n));
}

void CpuBackend::SumAxis(int64_t outer, int64_t reduce, int64_t inner, const float* x, float* y) {
  const Call call(this, "SumAxis", {x, y});
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
  const Call call(this, "SumAxisBackward", {dy, dx});
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
  const Call call(this, "LayerNormForward", {x, gamma, beta, y, mean, rstd});
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
  const Call call(this, "LayerNormBackward", {x, gamma, mean, rstd, dy, dx, dgamma, dbeta});
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
  const Call call(this, "BatchNormStats", {x, sums});
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
  const Call call(this, "BatchNormMoments", {sums, running_mean, running_var, mean, rstd});
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
  const Call call(this, "BatchNormApply", {x, mean, rstd, gamma, beta, y});
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
  const Call call(this, "BatchNormBackwardStats", {x, mean, rstd, dy, sums});
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
  const Call call(this, "BatchNormBackwardApply", {x, mean, rstd, gamma, sums, dy, dx});
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
  const Call call(this, "SoftmaxForward", {x, y});
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
  const Call call(this, "SoftmaxBackward", {y, dy, dx});
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
  const Call call(this, "CrossEntropyForward", {x, labels, logp, loss_out});
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
  const Call call(this, "CrossEntropyBackward", {logp, labels, dloss, dx});
  const float k = dloss[0] / rows;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      dx[r * cols + j] += k * (std::exp(logp[r * cols + j]) - (j == labels[r] ? 1.0f : 0.0f));
    }
  }
}

// --- Kernels of the layers above ------------------------------------------------

bool CpuBackend::HostKernel(const char* kernel, std::initializer_list<const void*> pointers,
                            absl::FunctionRef<void(HostParallelFor loop)> body) {
  const Call call(this, kernel, pointers);
  body([this](int64_t n, int64_t min_per_range, HostRangeFn fn) { pool_.ParallelFor(n, min_per_range, fn); });
  return true;
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
  const Call call(this, "GatherRows", {table, indices, out});
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(row_words);
  for (int64_t i = 0; i < count; ++i) {
    TROUPE_CHECK(indices[i] >= 0 && indices[i] < rows);
    std::memcpy(out + i * row_words, table + int64_t{indices[i]} * row_words, row_bytes);
  }
}

void CpuBackend::ScatterRows(int64_t rows, int64_t row_words, float* table, int64_t count, const int32_t* indices,
                             const float* values) {
  const Call call(this, "ScatterRows", {table, indices, values});
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(row_words);
  for (int64_t i = 0; i < count; ++i) {
    TROUPE_CHECK(indices[i] >= 0 && indices[i] < rows);
    std::memcpy(table + int64_t{indices[i]} * row_words, values + i * row_words, row_bytes);
  }
}

void CpuBackend::GatherBytesToFloatPlanar(int64_t rows, int64_t row_words, const float* table, int64_t images,
                                          const int32_t* indices, int64_t pixels, int64_t channels, float scale,
                                          float* out) {
  const Call call(this, "GatherBytesToFloatPlanar", {table, indices, out});
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
  const Call call(this, "BytesToFloatPlanar", {in, out});
  pool_.ParallelFor(images, /*min_per_range=*/1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      ImageToFloatPlanar(in + i * pixels * channels, pixels, channels, scale, out + i * channels * pixels);
    }
  });
}

// --- Optimizer kernels --------------------------------------------------------------

void CpuBackend::AdamUpdate(int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float c1,
                            float c2, const float* grad, float* param, float* m, float* v) {
  const Call call(this, "AdamUpdate", {grad, param, m, v});
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
  const Call call(this, "SgdUpdate", {grad, param, buf});
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float g = grad[i] + weight_decay * param[i];
      buf[i] = momentum * buf[i] + g;
      param[i] -= lr * buf[i];
    }
  });
}

void CpuBackend::ClipByNorm(float* x, int64_t n, float max_norm, float* norm) {
  const Call call(this, "ClipByNorm", {x, norm});
  const float value = static_cast<float>(std::sqrt(SquaredNormOf(x, n)));
  if (norm != nullptr) norm[0] = value;
  if (value > max_norm && value > 0.0f) Scale(max_norm / value, x, x, n);
}

void CpuBackend::Polyak(int64_t n, float tau, const float* online, float* target) {
  const Call call(this, "Polyak", {online, target});
  pool_.ParallelFor(n, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) target[i] += tau * (online[i] - target[i]);
  });
}

void CpuBackend::TrustRatio(const float* w_squared, const float* u_squared, float coefficient, float weight_decay,
                            float* ratio) {
  const Call call(this, "TrustRatio", {w_squared, u_squared, ratio});
  const double w = std::sqrt(static_cast<double>(w_squared[0])), u = std::sqrt(static_cast<double>(u_squared[0]));
  ratio[0] = w > 0 && u > 0 ? static_cast<float>(coefficient * w / (u + weight_decay * w)) : 1.0f;
}

void CpuBackend::ScaleByScalar(float alpha, const float* scalar, float* x, int64_t n) {
  const Call call(this, "ScaleByScalar", {scalar, x});
  Scale(alpha * scalar[0], x, x, n);
}

}  // namespace troupe::nn
