#include "engine/nn/strict_cpu_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/status_macros.h"

namespace troupe::nn {
namespace {

size_t PageSize() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

}  // namespace

StrictCpuBackend::StrictCpuBackend(int num_threads, size_t arena_bytes) : inner_(num_threads) {
  reserved_ = (arena_bytes + PageSize() - 1) / PageSize() * PageSize();
  void* p = mmap(nullptr, reserved_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  TROUPE_CHECK(p != MAP_FAILED);
  arena_ = static_cast<char*>(p);
}

StrictCpuBackend::~StrictCpuBackend() { munmap(arena_, reserved_); }

StrictCpuBackend::Open::Open(StrictCpuBackend* backend) : backend_(backend) {
  backend_->Protect(PROT_READ | PROT_WRITE);
}

StrictCpuBackend::Open::Open(StrictCpuBackend* backend, const char* kernel,
                             std::initializer_list<const void*> device_pointers)
    : Open(backend) {
  int argument = 0;
  for (const void* p : device_pointers) {
    ++argument;
    if (p != nullptr && !backend->Owns(p)) {
      std::fprintf(stderr,
                   "strict CPU device: %s was given host memory (pointer argument %d, %p): kernels take only "
                   "device memory (Tape::Input uploads host data)\n",
                   kernel, argument, p);
      std::abort();
    }
  }
}

StrictCpuBackend::Open::~Open() { backend_->Protect(PROT_NONE); }

void StrictCpuBackend::Protect(int protection) {
  if (used_ == 0) return;
  TROUPE_CHECK(mprotect(arena_, (used_ + PageSize() - 1) / PageSize() * PageSize(), protection) == 0);
}

bool StrictCpuBackend::Owns(const void* p) const {
  const char* c = static_cast<const char*>(p);
  return c >= arena_ && c < arena_ + used_;
}

void* StrictCpuBackend::Allocate(size_t bytes) {
  const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
  void* p = nullptr;
  // A freed block of the same size, or fresh arena.
  if (auto it = free_.find(rounded); it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
  } else {
    if (used_ + rounded > reserved_) {
      std::fprintf(stderr, "strict CPU device: out of arena: %zu bytes asked, %zu of %zu used\n", bytes, used_,
                   reserved_);
      std::abort();
    }
    p = arena_ + used_;
    used_ += rounded;
  }
  sizes_[p] = rounded;
  return p;
}

void StrictCpuBackend::Free(void* p) {
  if (p == nullptr) return;
  auto it = sizes_.find(p);
  TROUPE_CHECK(it != sizes_.end());  // not this device's, or freed twice
  free_[it->second].push_back(p);
  sizes_.erase(it);
}

void StrictCpuBackend::Upload(const void* host, void* device, size_t bytes) {
  const Open open(this);
  std::memcpy(device, host, bytes);
}

void StrictCpuBackend::Download(const void* device, void* host, size_t bytes) {
  if (host_reads_forbidden()) {
    std::fprintf(stderr,
                 "strict CPU device: Download of %zu bytes inside a step (a host round trip): read what the host "
                 "wants with ReadAtStepEnd, keep reduced values on the device\n",
                 bytes);
    std::abort();
  }
  const Open open(this);
  std::memcpy(host, device, bytes);
}

// --- Kernels: CpuBackend's, with the arena open ------------------------------

void StrictCpuBackend::Fill(float* x, int64_t n, float value) {
  const Open open(this, "Fill", {x});
  inner_.Fill(x, n, value);
}

void StrictCpuBackend::Copy(const float* x, float* y, int64_t n) {
  const Open open(this, "Copy", {x, y});
  inner_.Copy(x, y, n);
}

void StrictCpuBackend::Axpy(float alpha, const float* x, float* y, int64_t n) {
  const Open open(this, "Axpy", {x, y});
  inner_.Axpy(alpha, x, y, n);
}

void StrictCpuBackend::AddScalar(float alpha, const float* scalar, float* y, int64_t n) {
  const Open open(this, "AddScalar", {scalar, y});
  inner_.AddScalar(alpha, scalar, y, n);
}

void StrictCpuBackend::CopyBlocks(int64_t outer, int64_t len, const float* src, int64_t src_stride, int64_t src_offset, float* dst, int64_t dst_stride, int64_t dst_offset, bool accumulate) {
  const Open open(this, "CopyBlocks", {src, dst});
  inner_.CopyBlocks(outer, len, src, src_stride, src_offset, dst, dst_stride, dst_offset, accumulate);
}

void StrictCpuBackend::Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b, float beta, float* c) {
  const Open open(this, "Gemm", {a, b, c});
  inner_.Gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
}

void StrictCpuBackend::AddRowBias(int64_t rows, int64_t cols, const float* bias, float* y) {
  const Open open(this, "AddRowBias", {bias, y});
  inner_.AddRowBias(rows, cols, bias, y);
}

void StrictCpuBackend::RowBiasBackward(int64_t rows, int64_t cols, const float* dy, float* dbias) {
  const Open open(this, "RowBiasBackward", {dy, dbias});
  inner_.RowBiasBackward(rows, cols, dy, dbias);
}

void StrictCpuBackend::Conv2dForward(const ConvGeometry& g, FusedActivation act, const float* x, const float* w, const float* b, float* y) {
  const Open open(this, "Conv2dForward", {x, w, b, y});
  inner_.Conv2dForward(g, act, x, w, b, y);
}

void StrictCpuBackend::Conv2dBackward(const ConvGeometry& g, FusedActivation act, const float* x, const float* w, const float* y, const float* dy, float* dx, float* dw, float* db) {
  const Open open(this, "Conv2dBackward", {x, w, y, dy, dx, dw, db});
  inner_.Conv2dBackward(g, act, x, w, y, dy, dx, dw, db);
}

void StrictCpuBackend::ConvTranspose2dForward(const ConvGeometry& g, const float* x, const float* w, const float* b, float* y) {
  const Open open(this, "ConvTranspose2dForward", {x, w, b, y});
  inner_.ConvTranspose2dForward(g, x, w, b, y);
}

void StrictCpuBackend::ConvTranspose2dBackward(const ConvGeometry& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db) {
  const Open open(this, "ConvTranspose2dBackward", {x, w, dy, dx, dw, db});
  inner_.ConvTranspose2dBackward(g, x, w, dy, dx, dw, db);
}

void StrictCpuBackend::ActivationForward(Activation f, float alpha, const float* x, float* y, int64_t n) {
  const Open open(this, "ActivationForward", {x, y});
  inner_.ActivationForward(f, alpha, x, y, n);
}

void StrictCpuBackend::ActivationBackward(Activation f, float alpha, const float* x, const float* y, const float* dy, float* dx, int64_t n) {
  const Open open(this, "ActivationBackward", {x, y, dy, dx});
  inner_.ActivationBackward(f, alpha, x, y, dy, dx, n);
}

void StrictCpuBackend::BinaryForward(Binary op, const float* a, const float* b, float* y, int64_t n) {
  const Open open(this, "BinaryForward", {a, b, y});
  inner_.BinaryForward(op, a, b, y, n);
}

void StrictCpuBackend::BinaryBackward(Binary op, const float* a, const float* b, const float* dy, float* da, float* db, int64_t n) {
  const Open open(this, "BinaryBackward", {a, b, dy, da, db});
  inner_.BinaryBackward(op, a, b, dy, da, db, n);
}

void StrictCpuBackend::Scale(float alpha, const float* x, float* y, int64_t n) {
  const Open open(this, "Scale", {x, y});
  inner_.Scale(alpha, x, y, n);
}

void StrictCpuBackend::Sum(const float* x, int64_t n, float scale, float* y) {
  const Open open(this, "Sum", {x, y});
  inner_.Sum(x, n, scale, y);
}

void StrictCpuBackend::SquaredNorm(const float* x, int64_t n, float* y) {
  const Open open(this, "SquaredNorm", {x, y});
  inner_.SquaredNorm(x, n, y);
}

void StrictCpuBackend::SumAxis(int64_t outer, int64_t reduce, int64_t inner, const float* x, float* y) {
  const Open open(this, "SumAxis", {x, y});
  inner_.SumAxis(outer, reduce, inner, x, y);
}

void StrictCpuBackend::SumAxisBackward(int64_t outer, int64_t reduce, int64_t inner, const float* dy, float* dx) {
  const Open open(this, "SumAxisBackward", {dy, dx});
  inner_.SumAxisBackward(outer, reduce, inner, dy, dx);
}

void StrictCpuBackend::LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd) {
  const Open open(this, "LayerNormForward", {x, gamma, beta, y, mean, rstd});
  inner_.LayerNormForward(rows, cols, eps, x, gamma, beta, y, mean, rstd);
}

void StrictCpuBackend::LayerNormBackward(int64_t rows, int64_t cols, const float* x, const float* gamma, const float* mean, const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta) {
  const Open open(this, "LayerNormBackward", {x, gamma, mean, rstd, dy, dx, dgamma, dbeta});
  inner_.LayerNormBackward(rows, cols, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
}

void StrictCpuBackend::BatchNormStats(int64_t n, int64_t c, int64_t hw, const float* x, float* sums) {
  const Open open(this, "BatchNormStats", {x, sums});
  inner_.BatchNormStats(n, c, hw, x, sums);
}

void StrictCpuBackend::BatchNormMoments(int64_t c, float eps, float momentum, const float* sums, float* running_mean,
                                        float* running_var, float* mean, float* rstd) {
  const Open open(this, "BatchNormMoments", {sums, running_mean, running_var, mean, rstd});
  inner_.BatchNormMoments(c, eps, momentum, sums, running_mean, running_var, mean, rstd);
}

void StrictCpuBackend::BatchNormApply(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean, const float* rstd, const float* gamma, const float* beta, float* y) {
  const Open open(this, "BatchNormApply", {x, mean, rstd, gamma, beta, y});
  inner_.BatchNormApply(n, c, hw, x, mean, rstd, gamma, beta, y);
}

void StrictCpuBackend::BatchNormBackwardStats(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean, const float* rstd, const float* dy, float* sums) {
  const Open open(this, "BatchNormBackwardStats", {x, mean, rstd, dy, sums});
  inner_.BatchNormBackwardStats(n, c, hw, x, mean, rstd, dy, sums);
}

void StrictCpuBackend::BatchNormBackwardApply(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean, const float* rstd, const float* gamma, const float* sums, const float* dy, float* dx) {
  const Open open(this, "BatchNormBackwardApply", {x, mean, rstd, gamma, sums, dy, dx});
  inner_.BatchNormBackwardApply(n, c, hw, x, mean, rstd, gamma, sums, dy, dx);
}

void StrictCpuBackend::SoftmaxForward(int64_t rows, int64_t cols, const float* x, float* y, bool log) {
  const Open open(this, "SoftmaxForward", {x, y});
  inner_.SoftmaxForward(rows, cols, x, y, log);
}

void StrictCpuBackend::SoftmaxBackward(int64_t rows, int64_t cols, const float* y, const float* dy, float* dx, bool log) {
  const Open open(this, "SoftmaxBackward", {y, dy, dx});
  inner_.SoftmaxBackward(rows, cols, y, dy, dx, log);
}

void StrictCpuBackend::CrossEntropyForward(int64_t rows, int64_t cols, const float* x, const int32_t* labels, float* logp, float* loss) {
  const Open open(this, "CrossEntropyForward", {x, labels, logp, loss});
  inner_.CrossEntropyForward(rows, cols, x, labels, logp, loss);
}

void StrictCpuBackend::CrossEntropyBackward(int64_t rows, int64_t cols, const float* logp, const int32_t* labels, const float* dloss, float* dx) {
  const Open open(this, "CrossEntropyBackward", {logp, labels, dloss, dx});
  inner_.CrossEntropyBackward(rows, cols, logp, labels, dloss, dx);
}

void StrictCpuBackend::CategoricalProjection(int64_t rows, int64_t atoms, float v_min, float v_max, const float* probabilities, const float* reward, const float* discount, float* out) {
  const Open open(this, "CategoricalProjection", {probabilities, reward, discount, out});
  inner_.CategoricalProjection(rows, atoms, v_min, v_max, probabilities, reward, discount, out);
}

void StrictCpuBackend::BytesToFloatPlanar(int64_t images, int64_t pixels, int64_t channels, float scale, const uint8_t* in, float* out) {
  const Open open(this, "BytesToFloatPlanar", {in, out});
  inner_.BytesToFloatPlanar(images, pixels, channels, scale, in, out);
}

void StrictCpuBackend::GatherRows(int64_t rows, int64_t row_words, const float* table, int64_t count,
                                  const int32_t* indices, float* out) {
  const Open open(this, "GatherRows", {table, indices, out});
  inner_.GatherRows(rows, row_words, table, count, indices, out);
}

void StrictCpuBackend::ScatterRows(int64_t rows, int64_t row_words, float* table, int64_t count,
                                   const int32_t* indices, const float* values) {
  const Open open(this, "ScatterRows", {table, indices, values});
  inner_.ScatterRows(rows, row_words, table, count, indices, values);
}

void StrictCpuBackend::GatherBytesToFloatPlanar(int64_t rows, int64_t row_words, const float* table,
                                                int64_t images, const int32_t* indices, int64_t pixels,
                                                int64_t channels, float scale, float* out) {
  const Open open(this, "GatherBytesToFloatPlanar", {table, indices, out});
  inner_.GatherBytesToFloatPlanar(rows, row_words, table, images, indices, pixels, channels, scale, out);
}

void StrictCpuBackend::RandomShiftForward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t pad, const int32_t* shifts, const float* x, float* y) {
  const Open open(this, "RandomShiftForward", {shifts, x, y});
  inner_.RandomShiftForward(n, c, h, w, pad, shifts, x, y);
}

void StrictCpuBackend::RandomShiftBackward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t pad, const int32_t* shifts, const float* dy, float* dx) {
  const Open open(this, "RandomShiftBackward", {shifts, dy, dx});
  inner_.RandomShiftBackward(n, c, h, w, pad, shifts, dy, dx);
}

void StrictCpuBackend::SpectralNormPowerIteration(int64_t rows, int64_t cols, const float* w, float* u, float* v, int iterations) {
  const Open open(this, "SpectralNormPowerIteration", {w, u, v});
  inner_.SpectralNormPowerIteration(rows, cols, w, u, v, iterations);
}

void StrictCpuBackend::SpectralNormForward(int64_t rows, int64_t cols, const float* w, const float* u, const float* v, float* y, float* sigma) {
  const Open open(this, "SpectralNormForward", {w, u, v, y, sigma});
  inner_.SpectralNormForward(rows, cols, w, u, v, y, sigma);
}

void StrictCpuBackend::SpectralNormBackward(int64_t rows, int64_t cols, const float* w, const float* u, const float* v, const float* sigma, const float* dy, float* dw) {
  const Open open(this, "SpectralNormBackward", {w, u, v, sigma, dy, dw});
  inner_.SpectralNormBackward(rows, cols, w, u, v, sigma, dy, dw);
}

void StrictCpuBackend::AdamUpdate(int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float c1, float c2, const float* grad, float* param, float* m, float* v) {
  const Open open(this, "AdamUpdate", {grad, param, m, v});
  inner_.AdamUpdate(n, lr, beta1, beta2, eps, weight_decay, c1, c2, grad, param, m, v);
}

void StrictCpuBackend::SgdUpdate(int64_t n, float lr, float momentum, float weight_decay, const float* grad, float* param, float* buf) {
  const Open open(this, "SgdUpdate", {grad, param, buf});
  inner_.SgdUpdate(n, lr, momentum, weight_decay, grad, param, buf);
}

void StrictCpuBackend::ClipByNorm(float* x, int64_t n, float max_norm, float* norm) {
  const Open open(this, "ClipByNorm", {x, norm});
  inner_.ClipByNorm(x, n, max_norm, norm);
}

void StrictCpuBackend::Polyak(int64_t n, float tau, const float* online, float* target) {
  const Open open(this, "Polyak", {online, target});
  inner_.Polyak(n, tau, online, target);
}

void StrictCpuBackend::TrustRatio(const float* w_squared, const float* u_squared, float coefficient, float weight_decay, float* ratio) {
  const Open open(this, "TrustRatio", {w_squared, u_squared, ratio});
  inner_.TrustRatio(w_squared, u_squared, coefficient, weight_decay, ratio);
}

void StrictCpuBackend::ScaleByScalar(float alpha, const float* scalar, float* x, int64_t n) {
  const Open open(this, "ScaleByScalar", {scalar, x});
  inner_.ScaleByScalar(alpha, scalar, x, n);
}

}  // namespace troupe::nn
