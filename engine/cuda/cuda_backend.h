// The CUDA backend of the nn engine: nn::Backend's core and, fused, nearly
// every composed kernel on one GPU.
// GEMMs go to cuBLAS (cublasGemmEx, float32 or bfloat16 inputs with float32
// accumulation, switchable); convolutions and transposed convolutions to
// cuDNN (cudnn_conv.h, opened at run time; bfloat16 operands there too),
// or, where cuDNN is missing or has no algorithm, im2col over the whole
// batch + one cuBLAS GEMM; everything else is this folder's own kernels.
//
// Device memory (the contract of backend.h): parameters, gradients, optimizer
// state, the tape's arena and every uploaded input come from Allocate
// (cudaMalloc: plain device memory), and the ops layer hands kernels
// nothing else (the strict CPU device proves it on every test), so whole
// training steps run on any GPU; pageable_memory_access() only says whether
// the GPU could also read ordinary host memory. The backend is synchronous by
// default (Options::synchronous: every call returns after its kernels; whole
// RL and GAN steps matched the CPU this way on an H200); the contract
// allows asynchronous kernels (TROUPE_CUDA_ASYNC=1), opt-in until a GPU run
// has checked them.
//
// Not thread-safe: one thread drives a CudaBackend at a time (the Backend
// contract). Each instance owns a CUDA stream, a cuBLAS handle and scratch
// that grows to the largest geometry seen; steady-state calls do not allocate.
#ifndef TROUPE_ENGINE_CUDA_CUDA_BACKEND_H_
#define TROUPE_ENGINE_CUDA_CUDA_BACKEND_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/cuda/cudnn_conv.h"
#include "engine/nn/backend.h"

namespace troupe::cuda {

// Number of CUDA devices, 0 when there is none or no driver; never fails.
// `why`, if given, receives the runtime's reason when the count is 0
// ("no CUDA-capable device is detected", "CUDA driver version is insufficient").
int DeviceCount(std::string* why = nullptr);

// A GPU architecture the kernels are built for: an entry of
// CMAKE_CUDA_ARCHITECTURES ("86-real": machine code for 8.6; "90-virtual":
// PTX for compute_90; "90": both).
struct CudaArchitecture {
  int major = 0, minor = 0;
  bool machine_code = false;  // sm_XY: runs on X.Y up to X.9 (same major)
  bool ptx = false;           // compute_XY: the driver compiles it for X.Y and every newer GPU
};
// Parses a comma- or semicolon-separated CMAKE_CUDA_ARCHITECTURES list;
// InvalidArgument naming the entry that is not NN, NN-real or NN-virtual.
absl::StatusOr<std::vector<CudaArchitecture>> ParseCudaArchitectures(const std::string& list);
// "sm_80, sm_86, sm_89, sm_90 + PTX compute_90".
std::string DescribeCudaArchitectures(const std::vector<CudaArchitecture>& architectures);
// True when a GPU of compute capability major.minor runs these kernels.
bool CoversComputeCapability(const std::vector<CudaArchitecture>& architectures, int major, int minor);
// What this build's kernels are for (its CMAKE_CUDA_ARCHITECTURES).
const std::vector<CudaArchitecture>& BuiltArchitectures();
// GPU `device`: its name and compute capability ("NVIDIA H200, compute
// capability 9.0"), and FailedPrecondition when this build's kernels do not
// cover it, naming both and the CMake setting that would
// ("-DCMAKE_CUDA_ARCHITECTURES=75"). Internal when the device cannot be read.
absl::StatusOr<std::string> CheckDeviceArchitecture(int device);

enum class GemmPrecision {
  kFloat32,   // float32 inputs, float32 accumulation (the CPU reference's math)
  kBfloat16,  // inputs rounded to bfloat16, float32 accumulation and output
};

enum class ConvAlgorithm {
  kCudnn,   // cuDNN, im2col where it is missing or has no algorithm for a geometry
  kIm2col,  // im2col + one cuBLAS GEMM, always
};

struct CudaBackendOptions {
  int device = 0;
  GemmPrecision gemm_precision = GemmPrecision::kFloat32;
  // TF32 tensor cores for float32 GEMMs (10-bit mantissa inputs). Off by
  // default so float32 matches the CPU reference to float rounding.
  bool allow_tf32 = false;
  // How convolutions run. Create() takes TROUPE_CUDA_CONV=im2col or =cudnn
  // from the environment.
  ConvAlgorithm convolutions = ConvAlgorithm::kCudnn;
  // Every call waits for its kernels (see the header comment, point 2).
  // Create() turns it off when the environment has TROUPE_CUDA_ASYNC=1: the
  // kernels queue on the stream and the host waits only where it reads a
  // result (Download, Sum, ...) or hands memory to another stream (the
  // Replicator synchronises before collectives), as the contract allows;
  // kept opt-in until a GPU run has checked it against the synchronous one.
  bool synchronous = true;
  // Per-call profile: every call waits for its kernels and adds its time,
  // from its first CUDA step to its end (launches and kernels), to its
  // name's total, and the host's time between calls (the ops layer, the
  // caller) to a row of its own; the table goes to stderr when the backend
  // is destroyed. Convolutions are also timed by stage
  // ("Conv2dBackward: GEMM dw"; the call's own row is then what follows its
  // last stage). Create() turns it on when the environment has
  // TROUPE_CUDA_PROFILE=1.
  bool profile = false;
};

class CudaBackend final : public nn::Backend {
 public:
  // FailedPrecondition "no CUDA device: ..." without a device or driver;
  // InvalidArgument for a device index out of range; Internal for a CUDA or
  // cuBLAS failure, naming the call.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& options = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override;
  int num_threads() const override { return 1; }
  const CudaBackendOptions& options() const { return options_; }
  // Switches GEMM/conv precision between calls.
  void set_gemm_precision(GemmPrecision precision) { options_.gemm_precision = precision; }
  // True when the GPU can address ordinary (pageable) host memory.
  bool pageable_memory_access() const { return pageable_memory_access_; }
  // How convolutions run here: "cuDNN 9.19.0 (libcudnn.so.9)", or "im2col +
  // cuBLAS" with the reason cuDNN is not used.
  const std::string& convolutions() const { return convolutions_; }
  // Convolution geometries (per pass and type) cuDNN had no algorithm for,
  // which ran on im2col instead.
  int conv_fallbacks() const { return cudnn_ != nullptr ? cudnn_->unsupported() : 0; }

  // --- Device memory (nn::Backend's contract) ----------------------------------
  // Allocate gives this GPU's memory (cudaMalloc), uninitialised; aborts
  // with file and line on failure.
  // Copies between any host pointer and this GPU's memory; waits.
  void Upload(const void* host, void* device, size_t bytes) override;
  void Download(const void* device, void* host, size_t bytes) override;
  void Synchronize() override;
  // Ends the step (nn::Backend) and checks its cross-entropy labels.
  void EndStep() override;
  // The CUDA stream (cudaStream_t) the kernels run on.
  void* stream() const { return stream_; }

  // --- nn::Backend --------------------------------------------------------------
  // The core's generic kernels beyond GEMM, convolutions and copies (Fill's
  // iota, Unary, BinaryBroadcast, Reduce, Gather, Scatter, Convert: simple
  // grid-stride kernels, marked "core") sit beside the fused kernels of their
  // concern, which override nn::Backend's composed defaults.
  void Fill(float* x, int64_t n, float value, float step = 0.0f) override;  // core
  void Copy(const float* x, float* y, int64_t n) override;
  void Axpy(float alpha, const float* x, float* y, int64_t n) override;
  void AddScalar(float alpha, const float* scalar, float* y, int64_t n) override;
  void CopyBlocks(int64_t outer, int64_t len, const float* src, int64_t src_stride, int64_t src_offset, float* dst,
                  int64_t dst_stride, int64_t dst_offset, bool accumulate) override;

  void Gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, const float* b,
            float beta, float* c) override;
  void AddRowBias(int64_t rows, int64_t cols, const float* bias, float* y) override;
  void RowBiasBackward(int64_t rows, int64_t cols, const float* dy, float* dbias) override;

  void Conv2dForward(const nn::ConvGeometry& g, nn::FusedActivation act, const float* x, const float* w,
                     const float* b, float* y) override;
  void Conv2dBackward(const nn::ConvGeometry& g, nn::FusedActivation act, const float* x, const float* w,
                      const float* y, const float* dy, float* dx, float* dw,
                      float* db) override;
  void ConvTranspose2dForward(const nn::ConvGeometry& g, const float* x, const float* w, const float* b,
                              float* y) override;
  void ConvTranspose2dBackward(const nn::ConvGeometry& g, const float* x, const float* w, const float* dy, float* dx,
                               float* dw, float* db) override;

  void ActivationForward(nn::Activation f, float alpha, const float* x, float* y, int64_t n) override;
  void ActivationBackward(nn::Activation f, float alpha, const float* x, const float* y, const float* dy, float* dx,
                          int64_t n) override;
  void BinaryForward(nn::Binary op, const float* a, const float* b, float* y, int64_t n) override;
  void BinaryBackward(nn::Binary op, const float* a, const float* b, const float* dy, float* da, float* db,
                      int64_t n) override;
  void Scale(float alpha, const float* x, float* y, int64_t n) override;
  // Core.
  void Unary(nn::UnaryOp op, float alpha, float beta, const float* x, float* y, int64_t n,
             bool accumulate = false) override;
  void UnaryBackward(nn::UnaryOp op, float alpha, float beta, const float* x, const float* y, const float* dy,
                     float* dx, int64_t n) override;
  void BinaryBroadcast(nn::Binary op, const nn::View3& v, const float* a, int a_axes, const float* b, int b_axes,
                       float* y, bool accumulate = false) override;

  void Reduce(nn::Reduction op, const nn::View3& v, float scale, const float* x, float* y,
              bool accumulate = false) override;  // core
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
  // Core.
  void Gather(int64_t outer, int64_t in, int64_t inner, int64_t out, const float* x, const int32_t* indices,
              float* y) override;
  void Scatter(int64_t outer, int64_t in, int64_t inner, int64_t out, const int32_t* indices, const float* values,
               float* x, bool add) override;
  void Convert(nn::DType from, const void* x, nn::DType to, void* y, int64_t n, float scale = 1.0f) override;
  void GatherRows(int64_t rows, int64_t row_words, const float* table, int64_t count, const int32_t* indices,
                  float* out) override;
  void ScatterRows(int64_t rows, int64_t row_words, float* table, int64_t count, const int32_t* indices,
                   const float* values) override;
  void GatherBytesToFloatPlanar(int64_t rows, int64_t row_words, const float* table, int64_t images,
                                const int32_t* indices, int64_t pixels, int64_t channels, float scale,
                                float* out) override;
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
  void* DeviceAllocate(size_t bytes) override;
  void DeviceFree(void* p) override;

 private:
  explicit CudaBackend(const CudaBackendOptions& options);
  // Scratch slot `slot` of at least `bytes` (device memory, grows only).
  void* Scratch(int slot, size_t bytes);
  // The cuDNN path (cuda_conv.cc): whether cuDNN runs `pass` of `g` at this
  // precision; an operand in the pass's type (x itself, or a bfloat16 copy
  // in scratch slot `slot`); one pass into float32 `out` (+)= result.
  bool Bf16() const { return options_.gemm_precision == GemmPrecision::kBfloat16; }
  bool UseCudnn(ConvPass pass, const nn::ConvGeometry& g);
  const void* ConvOperand(int slot, const float* x, int64_t n);
  void CudnnPass(ConvPass pass, const nn::ConvGeometry& g, const void* a, const void* b, float* out, int64_t n,
                 bool accumulate);
  // One pass into y [n, channels, hw] (overwritten; profiled as `stage`),
  // then y = act(y + bias) in one more, a bfloat16 result converted in it.
  void CudnnPassWithBias(ConvPass pass, const nn::ConvGeometry& g, const void* a, const void* b, const float* bias,
                         bool relu, int64_t channels, int64_t hw, float* y, const char* stage);
  // Row-major GEMM with explicit leading dimensions and batch strides.
  void GemmStrided(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                   int64_t lda, int64_t stride_a, const float* b, int64_t ldb, int64_t stride_b, float beta, float* c,
                   int64_t ldc, int64_t stride_c, int64_t batch);
  // y[0] = scale * sum of x (squared when `square`), accumulated in double
  // on the device; nothing comes back to the host.
  void ReduceTo(const float* x, int64_t n, bool square, float scale, float* y);
  // Aborts, naming the columns, when a CrossEntropyForward since the last
  // check was given a label outside [0, cols) (a host read: at once outside
  // a step, at its end inside one).
  void CheckLabels();
  // After each public call: waits when synchronous, and checks for errors.
  void Done(const char* what);
  // Profiling (options_.profile): the time since the last mark goes to
  // `what`; End also closes the call (the next Bound starts one).
  void Mark(const char* what);
  void End(const char* what);
  // Within a call, when profiling: waits for the kernels so far and marks
  // them as `what` (a stage of the call: "Conv2dBackward: GEMM dw").
  void Stage(const char* what);
  void PrintProfile() const;

  CudaBackendOptions options_;
  bool pageable_memory_access_ = false;
  void* stream_ = nullptr;  // cudaStream_t
  // Makes this backend's GPU the calling thread's current device (a replica
  // thread, or the main thread between steps, may drive a backend another
  // thread made) and returns the stream; every call goes through it.
  void* Bound();
  void* cublas_ = nullptr;  // cublasHandle_t
  std::unique_ptr<CudnnConvolutions> cudnn_;  // null: im2col
  std::string convolutions_;
  struct Buffer {
    void* data = nullptr;
    size_t capacity = 0;
  };
  static constexpr int kScratchSlots = 8;
  Buffer scratch_[kScratchSlots];
  double* reduce_result_ = nullptr;  // device double[2]
  int* bad_label_ = nullptr;         // device int: a CrossEntropyForward label out of range
  int64_t label_columns_ = 0;        // the columns of the unchecked CrossEntropyForward, 0 if none
  struct CallTime {
    int64_t calls = 0;
    double seconds = 0.0;
  };
  std::map<std::string, CallTime> profile_;
  bool in_call_ = false;  // profiling: between a call's first Bound and its End
  std::chrono::steady_clock::time_point last_mark_ = std::chrono::steady_clock::now();
};

}  // namespace troupe::cuda

#endif  // TROUPE_ENGINE_CUDA_CUDA_BACKEND_H_
