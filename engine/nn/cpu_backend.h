// The CPU backend: Eigen GEMM for dense layers and for convolutions (im2col
// per sample, as Caffe and TensorFlow's CPU kernels do), plain loops for the
// rest, spread over an owned ThreadPool. This is the reference backend.
//
// Not thread-safe: one thread drives it at a time (it runs its own workers).
// Scratch (im2col columns, per-thread weight-gradient partials) is owned here
// and grows to the largest geometry seen; steady-state calls do not allocate.
// It implements the core and fuses most composed kernels (backend.h); the
// activations and BinaryForward run as the defaults over its Unary and
// BinaryBroadcast, whose loops are the ones those kernels had.
//
// Its memory is ordinary aligned host memory, or a CpuMemoryGuard's: the
// strict CPU device (strict_cpu_backend.h) is this backend on memory the
// host cannot touch between calls.
#ifndef TROUPE_ENGINE_NN_CPU_BACKEND_H_
#define TROUPE_ENGINE_NN_CPU_BACKEND_H_

#include <cstddef>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/nn/backend.h"
#include "engine/nn/thread_pool.h"

namespace troupe::nn {

// Where a CpuBackend's memory lives, for a device that guards it (the strict
// CPU device's arena): the backend opens it around each of its calls and
// checks that every pointer a kernel is given is its memory.
class CpuMemoryGuard {
 public:
  virtual ~CpuMemoryGuard() = default;
  // As Backend::Allocate and Free.
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  // True if `p` points into this memory.
  virtual bool Owns(const void* p) const = 0;
  // The host may touch the memory between Open and Close (a call of the
  // backend's), and not otherwise.
  virtual void Open() = 0;
  virtual void Close() = 0;
};

class CpuBackend : public Backend {
 protected:
  // Ordinary host memory (aligned_alloc), or the guard's.
  void* DeviceAllocate(size_t bytes) override;
  void DeviceFree(void* p) override;

 public:
  // `num_threads` counts the calling thread; 1 runs everything inline.
  // `guard` null: plain host memory.
  explicit CpuBackend(int num_threads, std::unique_ptr<CpuMemoryGuard> guard = nullptr);
  ~CpuBackend() override;
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  std::string name() const override { return "cpu"; }
  int num_threads() const override { return pool_.num_threads(); }
  bool host_addressable() const override { return guard_ == nullptr; }
  ThreadPool& pool() { return pool_; }

  // Memory (DeviceAllocate) is ordinary host memory (aligned_alloc,
  // untouched until used), or the guard's; copies are memcpy; nothing is
  // asynchronous. With a guard, a
  // Download inside a step (outside a HostStaging scope) aborts.
  void Upload(const void* host, void* device, size_t bytes) override;
  void Download(const void* device, void* host, size_t bytes) override;
  void Synchronize() override {}

  // The core.
  void Fill(float* x, int64_t n, float value, float step = 0.0f) override;
  void CopyBlocks(int64_t outer, int64_t len, const float* src, int64_t src_stride, int64_t src_offset, float* dst,
                  int64_t dst_stride, int64_t dst_offset, bool accumulate) override;
  void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
            float beta, float* c) override;
  void Conv2dForward(const ConvGeometry& g, FusedActivation act, const float* x, const float* w, const float* b,
                     float* y) override;
  void Conv2dBackward(const ConvGeometry& g, FusedActivation act, const float* x, const float* w, const float* y,
                      const float* dy, float* dx, float* dw, float* db) override;
  void Unary(UnaryOp op, float alpha, float beta, const float* x, float* y, int64_t n,
             bool accumulate = false) override;
  void UnaryBackward(UnaryOp op, float alpha, float beta, const float* x, const float* y, const float* dy, float* dx,
                     int64_t n) override;
  void BinaryBroadcast(Binary op, const View3& v, const float* a, int a_axes, const float* b, int b_axes, float* y,
                       bool accumulate = false) override;
  void Reduce(Reduction op, const View3& v, float scale, const float* x, float* y, bool accumulate = false) override;
  void Gather(int64_t outer, int64_t in, int64_t inner, int64_t out, const float* x, const int32_t* indices,
              float* y) override;
  void Scatter(int64_t outer, int64_t in, int64_t inner, int64_t out, const int32_t* indices, const float* values,
               float* x, bool add) override;
  void Convert(DType from, const void* x, DType to, void* y, int64_t n, float scale = 1.0f) override;

  // Fused kernels.
  void Copy(const float* x, float* y, int64_t n) override;
  void Axpy(float alpha, const float* x, float* y, int64_t n) override;
  void AddScalar(float alpha, const float* scalar, float* y, int64_t n) override;
  void AddRowBias(int64_t rows, int64_t cols, const float* bias, float* y) override;
  void RowBiasBackward(int64_t rows, int64_t cols, const float* dy, float* dbias) override;
  void ConvTranspose2dForward(const ConvGeometry& g, const float* x, const float* w, const float* b,
                              float* y) override;
  void ConvTranspose2dBackward(const ConvGeometry& g, const float* x, const float* w, const float* dy, float* dx,
                               float* dw, float* db) override;

  void BinaryBackward(Binary op, const float* a, const float* b, const float* dy, float* da, float* db,
                      int64_t n) override;
  void Scale(float alpha, const float* x, float* y, int64_t n) override;

  void Sum(const float* x, int64_t n, float scale, float* y) override;
  void SquaredNorm(const float* x, int64_t n, float* y) override;
  void SumAxis(int64_t outer, int64_t reduce, int64_t inner, const float* x, float* y) override;
  void SumAxisBackward(int64_t outer, int64_t reduce, int64_t inner, const float* dy, float* dx) override;

  void LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x, const float* gamma, const float* beta,
                        float* y, float* mean, float* rstd) override;
  void LayerNormBackward(int64_t rows, int64_t cols, const float* x, const float* gamma, const float* mean,
                         const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta) override;
  void BatchNormStats(int64_t n, int64_t c, int64_t hw, const float* x, float* sums) override;
  void BatchNormMoments(int64_t c, float eps, float momentum, const float* sums, float* running_mean,
                          float* running_var, float* mean, float* rstd) override;
  void BatchNormApply(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean, const float* rstd,
                      const float* gamma, const float* beta, float* y) override;
  void BatchNormBackwardStats(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean, const float* rstd,
                              const float* dy, float* sums) override;
  void BatchNormBackwardApply(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean, const float* rstd,
                                const float* gamma, const float* sums, const float* dy, float* dx) override;

  void SoftmaxForward(int64_t rows, int64_t cols, const float* x, float* y, bool log) override;
  void SoftmaxBackward(int64_t rows, int64_t cols, const float* y, const float* dy, float* dx, bool log) override;
  void CrossEntropyForward(int64_t rows, int64_t cols, const float* x, const int32_t* labels, float* logp,
                             float* loss) override;
  void CrossEntropyBackward(int64_t rows, int64_t cols, const float* logp, const int32_t* labels, const float* dloss,
                            float* dx) override;

  void BytesToFloatPlanar(int64_t images, int64_t pixels, int64_t channels, float scale, const uint8_t* in,
                          float* out) override;
  void GatherRows(int64_t rows, int64_t row_words, const float* table, int64_t count, const int32_t* indices,
                  float* out) override;
  void ScatterRows(int64_t rows, int64_t row_words, float* table, int64_t count, const int32_t* indices,
                   const float* values) override;
  void GatherBytesToFloatPlanar(int64_t rows, int64_t row_words, const float* table, int64_t images,
                                const int32_t* indices, int64_t pixels, int64_t channels, float scale,
                                float* out) override;

  // An algorithm's kernel as a host loop over this backend's threads.
  bool HostKernel(const char* kernel, std::initializer_list<const void*> pointers,
                  absl::FunctionRef<void(HostParallelFor loop)> body) override;

  void AdamUpdate(int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float c1, float c2,
                  const float* grad, float* param, float* m, float* v) override;
  void SgdUpdate(int64_t n, float lr, float momentum, float weight_decay, const float* grad, float* param,
                 float* buf) override;
  void ClipByNorm(float* x, int64_t n, float max_norm, float* norm) override;
  void Polyak(int64_t n, float tau, const float* online, float* target) override;
  void TrustRatio(const float* w_squared, const float* u_squared, float coefficient, float weight_decay,
                    float* ratio) override;
  void ScaleByScalar(float alpha, const float* scalar, float* x, int64_t n) override;

 protected:
  CpuMemoryGuard* guard() const { return guard_.get(); }

 private:
  // Every call's entry. With a guard: opens the memory for the call (a call
  // inside another opens it once) and checks that each pointer argument but
  // null ones is the guard's memory, else aborts naming the kernel and the
  // argument (a kernel handed host memory, which a GPU could not read).
  class Call {
   public:
    Call(CpuBackend* backend, const char* kernel, std::initializer_list<const void*> pointers)
        : backend_(backend->guard_ ? backend : nullptr) {
      if (backend_ != nullptr) backend_->Enter(kernel, pointers);
    }
    ~Call() {
      if (backend_ != nullptr) backend_->Leave();
    }
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

   private:
    CpuBackend* backend_;
  };
  void Enter(const char* kernel, std::initializer_list<const void*> pointers);
  void Leave();

  // Per-thread scratch of at least `count` floats for slot `slot`
  // (kind 0: columns, 1: weight-gradient partials, 2: a sample's gradient
  // through a fused activation, 3: slot 0 only, flipped conv weights).
  float* Scratch(int kind, int slot, int64_t count);
  // Every thread's weight/bias-gradient partials (scratch kind 1): zeroed
  // (`count` floats each), then added into dw (dw_count floats, may be
  // null) and db (the next db_count, may be null).
  void ZeroPartials(int64_t count);
  void AddPartials(int64_t dw_count, float* dw, int64_t db_count, float* db);

  ThreadPool pool_;
  struct Buffer {
    float* data = nullptr;
    int64_t capacity = 0;
  };
  std::vector<Buffer> scratch_[4];
  std::unique_ptr<CpuMemoryGuard> guard_;
  int open_calls_ = 0;
};

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_CPU_BACKEND_H_
