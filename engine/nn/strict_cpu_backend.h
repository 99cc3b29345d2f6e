// The strict CPU device: the CPU backend's kernels on memory the host
// cannot touch. Allocate hands out memory from an arena kept PROT_NONE
// (mprotect) except while this backend's own calls run: a kernel, Upload,
// Download. A host read or write of device memory between kernels then
// faults at once, where it happens, instead of silently working on a CPU
// and failing on a GPU; so a test on this device proves a step keeps the
// device-memory contract of backend.h without a GPU. Results equal
// CpuBackend's bit for bit (the same kernels on the same threads).
//
// Kernels check that every pointer they are given is in the arena: the
// ops layer hands a kernel no host memory (a GPU could not read it). Inside
// a step (Backend::BeginStep ... EndStep) a Download aborts, outside a
// collective's HostStaging scope: so a test on this device proves a
// training step makes no host round trip (what a compiled step needs).
//
// For tests (config device CPU_STRICT): every call opens and closes the
// arena with two mprotect calls, whose cost grows with the arena's size.
// Not thread-safe (the Backend contract); other backends' memory and
// ordinary host memory are not protected.
#ifndef TROUPE_ENGINE_NN_STRICT_CPU_BACKEND_H_
#define TROUPE_ENGINE_NN_STRICT_CPU_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "engine/nn/backend.h"
#include "engine/nn/cpu_backend.h"

namespace troupe::nn {

class StrictCpuBackend final : public Backend {
 public:
  // `num_threads` as CpuBackend's. `arena_bytes` of address space are
  // reserved up front (MAP_NORESERVE: pages are backed only once used);
  // Allocate aborts, naming the size, when they run out.
  explicit StrictCpuBackend(int num_threads, size_t arena_bytes = size_t{16} << 30);
  ~StrictCpuBackend() override;
  StrictCpuBackend(const StrictCpuBackend&) = delete;
  StrictCpuBackend& operator=(const StrictCpuBackend&) = delete;

  std::string name() const override { return "cpu_strict"; }
  int num_threads() const override { return inner_.num_threads(); }

  void* Allocate(size_t bytes) override;
  void Free(void* p) override;
  void Upload(const void* host, void* device, size_t bytes) override;
  void Download(const void* device, void* host, size_t bytes) override;
  void Synchronize() override {}
  // True if `p` points into this device's arena.
  bool Owns(const void* p) const;

  void Fill(float* x, int64_t n, float value) override;
  void Copy(const float* x, float* y, int64_t n) override;
  void Axpy(float alpha, const float* x, float* y, int64_t n) override;
  void AddScalar(float alpha, const float* scalar, float* y, int64_t n) override;
  void CopyBlocks(int64_t outer, int64_t len, const float* src, int64_t src_stride, int64_t src_offset, float* dst, int64_t dst_stride, int64_t dst_offset, bool accumulate) override;
  void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b, float beta, float* c) override;
  void AddRowBias(int64_t rows, int64_t cols, const float* bias, float* y) override;
  void RowBiasBackward(int64_t rows, int64_t cols, const float* dy, float* dbias) override;
  void Conv2dForward(const ConvGeometry& g, FusedActivation act, const float* x, const float* w, const float* b, float* y) override;
  void Conv2dBackward(const ConvGeometry& g, FusedActivation act, const float* x, const float* w, const float* y, const float* dy, float* dx, float* dw, float* db) override;
  void ConvTranspose2dForward(const ConvGeometry& g, const float* x, const float* w, const float* b, float* y) override;
  void ConvTranspose2dBackward(const ConvGeometry& g, const float* x, const float* w, const float* dy, float* dx, float* dw, float* db) override;
  void ActivationForward(Activation f, float alpha, const float* x, float* y, int64_t n) override;
  void ActivationBackward(Activation f, float alpha, const float* x, const float* y, const float* dy, float* dx, int64_t n) override;
  void BinaryForward(Binary op, const float* a, const float* b, float* y, int64_t n) override;
  void BinaryBackward(Binary op, const float* a, const float* b, const float* dy, float* da, float* db, int64_t n) override;
  void Scale(float alpha, const float* x, float* y, int64_t n) override;
  void Sum(const float* x, int64_t n, float scale, float* y) override;
  void SquaredNorm(const float* x, int64_t n, float* y) override;
  void SumAxis(int64_t outer, int64_t reduce, int64_t inner, const float* x, float* y) override;
  void SumAxisBackward(int64_t outer, int64_t reduce, int64_t inner, const float* dy, float* dx) override;
  void LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x, const float* gamma, const float* beta, float* y, float* mean, float* rstd) override;
  void LayerNormBackward(int64_t rows, int64_t cols, const float* x, const float* gamma, const float* mean, const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta) override;
  void BatchNormStats(int64_t n, int64_t c, int64_t hw, const float* x, float* sums) override;
  void BatchNormMoments(int64_t c, float eps, float momentum, const float* sums, float* running_mean,
                          float* running_var, float* mean, float* rstd) override;
  void BatchNormApply(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean, const float* rstd, const float* gamma, const float* beta, float* y) override;
  void BatchNormBackwardStats(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean, const float* rstd, const float* dy, float* sums) override;
  void BatchNormBackwardApply(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean, const float* rstd,
                                const float* gamma, const float* sums, const float* dy, float* dx) override;
  void SoftmaxForward(int64_t rows, int64_t cols, const float* x, float* y, bool log) override;
  void SoftmaxBackward(int64_t rows, int64_t cols, const float* y, const float* dy, float* dx, bool log) override;
  void CrossEntropyForward(int64_t rows, int64_t cols, const float* x, const int32_t* labels, float* logp,
                             float* loss) override;
  void CrossEntropyBackward(int64_t rows, int64_t cols, const float* logp, const int32_t* labels, const float* dloss, float* dx) override;
  void CategoricalProjection(int64_t rows, int64_t atoms, float v_min, float v_max, const float* probabilities, const float* reward, const float* discount, float* out) override;
  void BytesToFloatPlanar(int64_t images, int64_t pixels, int64_t channels, float scale, const uint8_t* in, float* out) override;
  void GatherRows(int64_t rows, int64_t row_words, const float* table, int64_t count, const int32_t* indices,
                  float* out) override;
  void ScatterRows(int64_t rows, int64_t row_words, float* table, int64_t count, const int32_t* indices,
                   const float* values) override;
  void GatherBytesToFloatPlanar(int64_t rows, int64_t row_words, const float* table, int64_t images,
                                const int32_t* indices, int64_t pixels, int64_t channels, float scale,
                                float* out) override;
  void RandomShiftForward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t pad, const int32_t* shifts, const float* x, float* y) override;
  void RandomShiftBackward(int64_t n, int64_t c, int64_t h, int64_t w, int64_t pad, const int32_t* shifts, const float* dy, float* dx) override;
  void SpectralNormPowerIteration(int64_t rows, int64_t cols, const float* w, float* u, float* v, int iterations) override;
  void SpectralNormForward(int64_t rows, int64_t cols, const float* w, const float* u, const float* v, float* y,
                             float* sigma) override;
  void SpectralNormBackward(int64_t rows, int64_t cols, const float* w, const float* u, const float* v,
                              const float* sigma, const float* dy, float* dw) override;
  void AdamUpdate(int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float c1, float c2, const float* grad, float* param, float* m, float* v) override;
  void SgdUpdate(int64_t n, float lr, float momentum, float weight_decay, const float* grad, float* param, float* buf) override;
  void ClipByNorm(float* x, int64_t n, float max_norm, float* norm) override;
  void Polyak(int64_t n, float tau, const float* online, float* target) override;
  void TrustRatio(const float* w_squared, const float* u_squared, float coefficient, float weight_decay,
                    float* ratio) override;
  void ScaleByScalar(float alpha, const float* scalar, float* x, int64_t n) override;

 private:
  // Opens the arena (read/write) for the lifetime of a call. A kernel also
  // names its pointer arguments: each (but null ones) must be this device's
  // memory, or the process aborts naming the kernel and the argument, so a
  // kernel handed host memory is caught as a host touch of device memory is.
  class Open {
   public:
    explicit Open(StrictCpuBackend* backend);
    Open(StrictCpuBackend* backend, const char* kernel, std::initializer_list<const void*> device_pointers);
    ~Open();
    Open(const Open&) = delete;
    Open& operator=(const Open&) = delete;

   private:
    StrictCpuBackend* backend_;
  };
  void Protect(int protection);

  CpuBackend inner_;
  char* arena_ = nullptr;
  size_t reserved_ = 0;
  size_t used_ = 0;                            // bump pointer: [arena_, arena_ + used_) handed out
  std::map<void*, size_t> sizes_;              // live allocations and their (rounded) sizes
  std::map<size_t, std::vector<void*>> free_;  // freed blocks by size, reused first
};

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_STRICT_CPU_BACKEND_H_
