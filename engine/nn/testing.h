// Helpers of the engine's tests (not linked into anything else): seeded
// random data, and CoreOnlyBackend, the backend that implements only
// nn::Backend's core, so every composed kernel runs its default body.
#ifndef TROUPE_ENGINE_NN_TESTING_H_
#define TROUPE_ENGINE_NN_TESTING_H_

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "engine/nn/backend.h"
#include "engine/nn/cpu_backend.h"

namespace troupe::nn {

// n floats uniform in [lo, hi) from `seed`, none with |x| < min_abs (kept
// away from a kink, such as relu's at 0, for finite differences).
inline std::vector<float> RandomVector(int64_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f,
                                       float min_abs = 0.0f) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) {
    do {
      x = d(rng);
    } while (std::fabs(x) < min_abs);
  }
  return v;
}

// A backend of exactly the core: its pure virtuals, forwarded to a
// CpuBackend (whose memory it uses), and nothing else, so every other
// kernel runs Backend's composed default. That it compiles (it is final and
// made) proves the core is these 19 methods.
class CoreOnlyBackend final : public Backend {
 public:
  explicit CoreOnlyBackend(int num_threads = 1) : cpu_(num_threads) {}
  ~CoreOnlyBackend() override { ReleaseScratchPool(); }

  std::string name() const override { return "core_only"; }
  int num_threads() const override { return cpu_.num_threads(); }
  // Allocate calls so far (the scratch pool's included).
  int64_t allocations() const { return allocations_; }
  void* DeviceAllocate(size_t bytes) override {
    ++allocations_;
    return cpu_.Allocate(bytes);
  }
  void DeviceFree(void* p) override { cpu_.Free(p); }
  void Upload(const void* host, void* device, size_t bytes) override { cpu_.Upload(host, device, bytes); }
  void Download(const void* device, void* host, size_t bytes) override { cpu_.Download(device, host, bytes); }
  void Synchronize() override { cpu_.Synchronize(); }

  void Fill(float* x, int64_t n, float value, float step = 0.0f) override { cpu_.Fill(x, n, value, step); }
  void CopyBlocks(int64_t outer, int64_t len, const float* src, int64_t src_stride, int64_t src_offset, float* dst,
                  int64_t dst_stride, int64_t dst_offset, bool accumulate) override {
    cpu_.CopyBlocks(outer, len, src, src_stride, src_offset, dst, dst_stride, dst_offset, accumulate);
  }
  void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
            float beta, float* c) override {
    cpu_.Gemm(trans_a, trans_b, m, n, k, alpha, a, b, beta, c);
  }
  void Conv2dForward(const ConvGeometry& g, FusedActivation act, const float* x, const float* w, const float* b,
                     float* y) override {
    cpu_.Conv2dForward(g, act, x, w, b, y);
  }
  void Conv2dBackward(const ConvGeometry& g, FusedActivation act, const float* x, const float* w, const float* y,
                      const float* dy, float* dx, float* dw, float* db) override {
    cpu_.Conv2dBackward(g, act, x, w, y, dy, dx, dw, db);
  }
  void Unary(UnaryOp op, float alpha, float beta, const float* x, float* y, int64_t n,
             bool accumulate = false) override {
    cpu_.Unary(op, alpha, beta, x, y, n, accumulate);
  }
  void UnaryBackward(UnaryOp op, float alpha, float beta, const float* x, const float* y, const float* dy, float* dx,
                     int64_t n) override {
    cpu_.UnaryBackward(op, alpha, beta, x, y, dy, dx, n);
  }
  void BinaryBroadcast(Binary op, const View3& v, const float* a, int a_axes, const float* b, int b_axes, float* y,
                       bool accumulate = false) override {
    cpu_.BinaryBroadcast(op, v, a, a_axes, b, b_axes, y, accumulate);
  }
  void Reduce(Reduction op, const View3& v, float scale, const float* x, float* y, bool accumulate = false) override {
    cpu_.Reduce(op, v, scale, x, y, accumulate);
  }
  void Gather(int64_t outer, int64_t in, int64_t inner, int64_t out, const float* x, const int32_t* indices,
              float* y) override {
    cpu_.Gather(outer, in, inner, out, x, indices, y);
  }
  void Scatter(int64_t outer, int64_t in, int64_t inner, int64_t out, const int32_t* indices, const float* values,
               float* x, bool add) override {
    cpu_.Scatter(outer, in, inner, out, indices, values, x, add);
  }
  void Convert(DType from, const void* x, DType to, void* y, int64_t n, float scale = 1.0f) override {
    cpu_.Convert(from, x, to, y, n, scale);
  }

 private:
  CpuBackend cpu_;
  int64_t allocations_ = 0;
};

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_TESTING_H_
