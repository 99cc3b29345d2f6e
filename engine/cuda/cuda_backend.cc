// CudaBackend: construction, memory, and every kernel but the dense and
// convolution ones (those are in cuda_conv.cc).
#include "engine/cuda/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "engine/cuda/cuda_check.h"
#include "engine/cuda/kernels.h"

namespace troupe::cuda {
namespace {
cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }
}  // namespace

int DeviceCount(std::string* why) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    if (why != nullptr) *why = cudaGetErrorString(e);
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  if (count == 0 && why != nullptr) *why = "the CUDA runtime reports 0 devices";
  return count;
}

absl::StatusOr<std::vector<CudaArchitecture>> ParseCudaArchitectures(const std::string& list) {
  std::vector<CudaArchitecture> out;
  for (absl::string_view entry : absl::StrSplit(list, absl::ByAnyChar(",;"), absl::SkipWhitespace())) {
    entry = absl::StripAsciiWhitespace(entry);
    CudaArchitecture a;
    absl::string_view number = entry;
    if (absl::ConsumeSuffix(&number, "-real")) {
      a.machine_code = true;
    } else if (absl::ConsumeSuffix(&number, "-virtual")) {
      a.ptx = true;
    } else {
      a.machine_code = a.ptx = true;
    }
    int value = 0;
    if (number.size() < 2 || !absl::SimpleAtoi(number, &value) || value < 10) {
      return absl::InvalidArgumentError(absl::StrCat("CUDA architecture '", entry,
                                                     "': expected NN, NN-real or NN-virtual (e.g. 86-real)"));
    }
    a.major = value / 10;
    a.minor = value % 10;
    out.push_back(a);
  }
  return out;
}

std::string DescribeCudaArchitectures(const std::vector<CudaArchitecture>& architectures) {
  std::vector<std::string> code, ptx;
  for (const CudaArchitecture& a : architectures) {
    if (a.machine_code) code.push_back(absl::StrCat("sm_", a.major, a.minor));
    if (a.ptx) ptx.push_back(absl::StrCat("compute_", a.major, a.minor));
  }
  std::string said = code.empty() ? "no machine code" : absl::StrJoin(code, ", ");
  if (!ptx.empty()) absl::StrAppend(&said, " + PTX ", absl::StrJoin(ptx, ", "));
  return said;
}

bool CoversComputeCapability(const std::vector<CudaArchitecture>& architectures, int major, int minor) {
  for (const CudaArchitecture& a : architectures) {
    // Machine code runs on its own major version at the same or a later minor;
    // PTX is compiled by the driver for its own and every later GPU.
    if (a.machine_code && a.major == major && a.minor <= minor) return true;
    if (a.ptx && (a.major < major || (a.major == major && a.minor <= minor))) return true;
  }
  return false;
}

const std::vector<CudaArchitecture>& BuiltArchitectures() {
#ifndef TROUPE_CUDA_ARCHITECTURES
#define TROUPE_CUDA_ARCHITECTURES "90"
#endif
  static const auto* built = new std::vector<CudaArchitecture>(*ParseCudaArchitectures(TROUPE_CUDA_ARCHITECTURES));
  return *built;
}

absl::StatusOr<std::string> CheckDeviceArchitecture(int device) {
  cudaDeviceProp properties{};
  if (cudaError_t e = cudaGetDeviceProperties(&properties, device); e != cudaSuccess) {
    cudaGetLastError();
    return absl::InternalError(absl::StrCat("cudaGetDeviceProperties(", device, "): ", cudaGetErrorString(e)));
  }
  const std::string said =
      absl::StrCat(properties.name, ", compute capability ", properties.major, ".", properties.minor);
  if (!CoversComputeCapability(BuiltArchitectures(), properties.major, properties.minor)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU ", device, " (", said, ") is not covered by this troupe's CUDA kernels (",
        DescribeCudaArchitectures(BuiltArchitectures()), "): rebuild with -DCMAKE_CUDA_ARCHITECTURES=",
        properties.major, properties.minor, " (or add it to the list)"));
  }
  return said;
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const CudaBackendOptions& options) {
  std::string why;
  const int count = DeviceCount(&why);
  if (count == 0) return absl::FailedPreconditionError(absl::StrCat("no CUDA device: ", why));
  if (options.device < 0 || options.device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", options.device, " does not exist (", count, " device(s): 0..", count - 1, ")"));
  }
  // A GPU the kernels were not built for fails here, naming it, instead of
  // at its first kernel ("no kernel image is available").
  RETURN_IF_ERROR(CheckDeviceArchitecture(options.device).status());
  std::unique_ptr<CudaBackend> b(new CudaBackend(options));
  auto env_is_1 = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr && std::string(v) == "1";
  };
  if (env_is_1("TROUPE_CUDA_PROFILE")) b->options_.profile = true;
  if (env_is_1("TROUPE_CUDA_ASYNC")) b->options_.synchronous = false;
  if (const char* conv = std::getenv("TROUPE_CUDA_CONV"); conv != nullptr && *conv != '\0') {
    const std::string v = conv;
    if (v != "cudnn" && v != "im2col") {
      return absl::InvalidArgumentError(absl::StrCat("TROUPE_CUDA_CONV=", v, ": expected cudnn or im2col"));
    }
    b->options_.convolutions = v == "cudnn" ? ConvAlgorithm::kCudnn : ConvAlgorithm::kIm2col;
  }
  // Device, stream, cuBLAS handle (math mode per the options).
  if (cudaError_t e = cudaSetDevice(options.device); e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaSetDevice(", options.device, "): ", cudaGetErrorString(e)));
  }
  cudaStream_t stream = nullptr;
  if (cudaError_t e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaStreamCreate: ", cudaGetErrorString(e)));
  }
  b->stream_ = stream;
  cublasHandle_t handle = nullptr;
  if (cublasStatus_t s = cublasCreate(&handle); s != CUBLAS_STATUS_SUCCESS) {
    return absl::InternalError(absl::StrCat("cublasCreate: ", cublasGetStatusString(s)));
  }
  b->cublas_ = handle;
  CUBLAS_CHECK(cublasSetStream(handle, stream));
  CUBLAS_CHECK(cublasSetMathMode(handle, options.allow_tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH));
  // Whether plain host memory is addressable from the device (HMM / ATS).
  int pageable = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, options.device));
  b->pageable_memory_access_ = pageable != 0;
  // Convolutions: cuDNN on this stream, else im2col (said once per process).
  b->convolutions_ = "im2col + cuBLAS";
  if (b->options_.convolutions == ConvAlgorithm::kCudnn) {
    absl::StatusOr<std::unique_ptr<CudnnConvolutions>> cudnn =
        CudnnConvolutions::Create(stream, b->options_.allow_tf32);
    if (cudnn.ok()) {
      b->cudnn_ = std::move(*cudnn);
      b->convolutions_ = b->cudnn_->description();
    } else {
      absl::StrAppend(&b->convolutions_, " (", cudnn.status().message(), ")");
      static std::atomic<bool> said{false};
      if (!said.exchange(true)) std::fprintf(stderr, "troupe: CUDA convolutions by %s\n", b->convolutions_.c_str());
    }
  } else {
    b->convolutions_ += " (as asked)";
  }
  CUDA_CHECK(cudaMalloc(&b->reduce_result_, sizeof(double) * (2 + kernels::ReducePartials())));
  CUDA_CHECK(cudaMalloc(&b->bad_label_, sizeof(int)));
  CUDA_CHECK(cudaMemset(b->bad_label_, 0, sizeof(int)));
  return b;
}

CudaBackend::CudaBackend(const CudaBackendOptions& options) : options_(options) {}

CudaBackend::~CudaBackend() {
  cudaSetDevice(options_.device);
  if (stream_ != nullptr) cudaStreamSynchronize(AsStream(stream_));
  if (options_.profile) PrintProfile();
  ReleaseScratchPool();
  cudnn_.reset();  // its handle is on stream_
  for (Buffer& b : scratch_) cudaFree(b.data);
  cudaFree(reduce_result_);
  cudaFree(bad_label_);
  if (cublas_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(cublas_));
  if (stream_ != nullptr) cudaStreamDestroy(AsStream(stream_));
}

std::string CudaBackend::name() const {
  return options_.gemm_precision == GemmPrecision::kBfloat16 ? "cuda-bf16" : "cuda";
}

// --- Memory ---------------------------------------------------------------------------

void* CudaBackend::Bound() {
  CUDA_CHECK(cudaSetDevice(options_.device));
  if (options_.profile && !in_call_) {
    // A call's first step: the time since the last call ended is the host's.
    in_call_ = true;
    Mark("(host, between calls)");
  }
  return stream_;
}

void* CudaBackend::DeviceAllocate(size_t bytes) {
  Bound();
  // Plain device memory: the host never touches it (backend.h; the strict
  // CPU device proves every step keeps to that), and unlike managed memory
  // it cannot oversubscribe the card.
  void* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, bytes == 0 ? 1 : bytes));
  if (options_.profile) End("Allocate");
  return p;
}

void CudaBackend::DeviceFree(void* p) {
  if (p == nullptr) return;
  CUDA_CHECK(cudaStreamSynchronize(AsStream(Bound())));
  CUDA_CHECK(cudaFree(p));
  if (options_.profile) End("Free");
}

void CudaBackend::Upload(const void* host, void* device, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyDefault, AsStream(Bound())));
  CUDA_CHECK(cudaStreamSynchronize(AsStream(Bound())));
  if (options_.profile) End("Upload");
}

void CudaBackend::Download(const void* device, void* host, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDefault, AsStream(Bound())));
  CUDA_CHECK(cudaStreamSynchronize(AsStream(Bound())));
  if (options_.profile) End("Download");
}

void CudaBackend::Synchronize() {
  CUDA_CHECK(cudaStreamSynchronize(AsStream(Bound())));
  if (options_.profile) End("Synchronize");
}

void* CudaBackend::Scratch(int slot, size_t bytes) {
  Buffer& b = scratch_[slot];
  if (b.capacity < bytes) {
    // The old buffer may still be read by queued kernels.
    CUDA_CHECK(cudaStreamSynchronize(AsStream(Bound())));
    CUDA_CHECK(cudaFree(b.data));
    b.data = nullptr;
    CUDA_CHECK(cudaMalloc(&b.data, bytes));
    b.capacity = bytes;
  }
  return b.data;
}

void CudaBackend::Done(const char* what) {
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    std::fprintf(stderr, "%s:%d: CudaBackend::%s: kernel launch failed: %s\n", __FILE__, __LINE__, what,
                 cudaGetErrorString(e));
    std::abort();
  }
  if (!options_.synchronous && !options_.profile) return;
  if (cudaError_t e = cudaStreamSynchronize(AsStream(Bound())); e != cudaSuccess) {
    std::fprintf(stderr, "%s:%d: CudaBackend::%s: %s\n", __FILE__, __LINE__, what, cudaGetErrorString(e));
    std::abort();
  }
  if (options_.profile) End(what);
}

void CudaBackend::Stage(const char* what) {
  if (!options_.profile) return;
  CUDA_CHECK(cudaStreamSynchronize(AsStream(Bound())));
  Mark(what);
}

void CudaBackend::End(const char* what) {
  Mark(what);
  in_call_ = false;
}

void CudaBackend::Mark(const char* what) {
  const auto now = std::chrono::steady_clock::now();
  CallTime& t = profile_[what];
  ++t.calls;
  t.seconds += std::chrono::duration<double>(now - last_mark_).count();
  last_mark_ = now;
}

void CudaBackend::PrintProfile() const {
  std::vector<std::pair<std::string, CallTime>> rows(profile_.begin(), profile_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double total = 0.0;
  for (const auto& [name, t] : rows) total += t.seconds;
  std::fprintf(stderr,
               "CudaBackend profile (%s, GPU %d; each call waited for, from its first CUDA step to its end; the "
               "host's time between calls in its own row)\n",
               name().c_str(), options_.device);
  std::fprintf(stderr, "%-28s %10s %12s %12s %7s\n", "call", "calls", "total ms", "us per call", "share");
  for (const auto& [name, t] : rows) {
    std::fprintf(stderr, "%-28s %10ld %12.2f %12.1f %6.1f%%\n", name.c_str(), static_cast<long>(t.calls),
                 1e3 * t.seconds, 1e6 * t.seconds / static_cast<double>(t.calls), 100.0 * t.seconds / total);
  }
}

void CudaBackend::Fill(float* x, int64_t n, float value, float step) {
  kernels::Fill(AsStream(Bound()), x, n, value, step);
  Done("Fill");
}

void CudaBackend::Unary(nn::UnaryOp op, float alpha, float beta, const float* x, float* y, int64_t n,
                        bool accumulate) {
  kernels::Unary(AsStream(Bound()), static_cast<int>(op), alpha, beta, x, y, n, accumulate);
  Done("Unary");
}

void CudaBackend::UnaryBackward(nn::UnaryOp op, float alpha, float beta, const float* x, const float* y,
                                const float* dy, float* dx, int64_t n) {
  if (dx == nullptr) return;
  kernels::UnaryBackward(AsStream(Bound()), static_cast<int>(op), alpha, beta, x, y, dy, dx, n);
  Done("UnaryBackward");
}

namespace {

// nn::StridesOf as the kernels take it.
kernels::Strides3 KernelStrides(const nn::View3& v, int axes) {
  const nn::Strides3 s = nn::StridesOf(v, axes);
  return {s.outer, s.mid, s.inner};
}

}  // namespace

void CudaBackend::BinaryBroadcast(nn::Binary op, const nn::View3& v, const float* a, int a_axes, const float* b,
                                  int b_axes, float* y, bool accumulate) {
  kernels::BinaryBroadcast(AsStream(Bound()), static_cast<int>(op), v.outer, v.mid, v.inner, a,
                           KernelStrides(v, a_axes), b, KernelStrides(v, b_axes), y, accumulate);
  Done("BinaryBroadcast");
}

void CudaBackend::Reduce(nn::Reduction op, const nn::View3& v, float scale, const float* x, float* y,
                         bool accumulate) {
  kernels::ReduceAxis(AsStream(Bound()), static_cast<int>(op), v.outer, v.mid, v.inner, scale, x, y, accumulate);
  Done("Reduce");
}

void CudaBackend::Gather(int64_t outer, int64_t in, int64_t inner, int64_t out, const float* x,
                         const int32_t* indices, float* y) {
  kernels::Gather(AsStream(Bound()), outer, in, inner, out, x, indices, y);
  Done("Gather");
}

void CudaBackend::Scatter(int64_t outer, int64_t in, int64_t inner, int64_t out, const int32_t* indices,
                          const float* values, float* x, bool add) {
  kernels::Scatter(AsStream(Bound()), outer, in, inner, out, indices, values, x, add);
  Done("Scatter");
}

void CudaBackend::Convert(nn::DType from, const void* x, nn::DType to, void* y, int64_t n, float scale) {
  TROUPE_CHECK(to != nn::DType::kU8);
  kernels::Convert(AsStream(Bound()), static_cast<int>(from), x, static_cast<int>(to), y, n, scale);
  Done("Convert");
}

void CudaBackend::Copy(const float* x, float* y, int64_t n) {
  CUDA_CHECK(cudaMemcpyAsync(y, x, sizeof(float) * n, cudaMemcpyDefault, AsStream(Bound())));
  Done("Copy");
}

void CudaBackend::Axpy(float alpha, const float* x, float* y, int64_t n) {
  kernels::Axpy(AsStream(Bound()), alpha, x, y, n);
  Done("Axpy");
}

void CudaBackend::AddScalar(float alpha, const float* scalar, float* y, int64_t n) {
  kernels::AddScalar(AsStream(Bound()), alpha, scalar, y, n);
  Done("AddScalar");
}

void CudaBackend::CopyBlocks(int64_t outer, int64_t len, const float* src, int64_t src_stride, int64_t src_offset,
                             float* dst, int64_t dst_stride, int64_t dst_offset, bool accumulate) {
  kernels::CopyBlocks(AsStream(Bound()), outer, len, src, src_stride, src_offset, dst, dst_stride, dst_offset,
                      accumulate);
  Done("CopyBlocks");
}

// --- Elementwise -----------------------------------------------------------------------

void CudaBackend::ActivationForward(nn::Activation f, float alpha, const float* x, float* y, int64_t n) {
  kernels::ActivationForward(AsStream(Bound()), static_cast<int>(f), alpha, x, y, n);
  Done("ActivationForward");
}

void CudaBackend::ActivationBackward(nn::Activation f, float alpha, const float* x, const float* y, const float* dy,
                                     float* dx, int64_t n) {
  kernels::ActivationBackward(AsStream(Bound()), static_cast<int>(f), alpha, x, y, dy, dx, n);
  Done("ActivationBackward");
}

void CudaBackend::BinaryForward(nn::Binary op, const float* a, const float* b, float* y, int64_t n) {
  kernels::BinaryForward(AsStream(Bound()), static_cast<int>(op), a, b, y, n);
  Done("BinaryForward");
}

void CudaBackend::BinaryBackward(nn::Binary op, const float* a, const float* b, const float* dy, float* da, float* db,
                                 int64_t n) {
  kernels::BinaryBackward(AsStream(Bound()), static_cast<int>(op), a, b, dy, da, db, n);
  Done("BinaryBackward");
}

void CudaBackend::Scale(float alpha, const float* x, float* y, int64_t n) {
  kernels::Scale(AsStream(Bound()), alpha, x, y, n);
  Done("Scale");
}

// --- Reductions -------------------------------------------------------------------------

void CudaBackend::ReduceTo(const float* x, int64_t n, bool square, float scale, float* y) {
  kernels::Reduce(AsStream(Bound()), x, n, square, reduce_result_ + 2, reduce_result_);
  kernels::StoreScalar(AsStream(Bound()), reduce_result_, scale, y);
}

void CudaBackend::Sum(const float* x, int64_t n, float scale, float* y) {
  ReduceTo(x, n, /*square=*/false, scale, y);
  Done("Sum");
}

void CudaBackend::SquaredNorm(const float* x, int64_t n, float* y) {
  ReduceTo(x, n, /*square=*/true, 1.0f, y);
  Done("SquaredNorm");
}

void CudaBackend::SumAxis(int64_t outer, int64_t reduce, int64_t inner, const float* x, float* y) {
  kernels::SumAxis(AsStream(Bound()), outer, reduce, inner, x, y, /*accumulate=*/false);
  Done("SumAxis");
}

void CudaBackend::SumAxisBackward(int64_t outer, int64_t reduce, int64_t inner, const float* dy, float* dx) {
  kernels::SumAxisBackward(AsStream(Bound()), outer, reduce, inner, dy, dx);
  Done("SumAxisBackward");
}

// --- Normalisation ------------------------------------------------------------------------

void CudaBackend::LayerNormForward(int64_t rows, int64_t cols, float eps, const float* x, const float* gamma,
                                   const float* beta, float* y, float* mean, float* rstd) {
  kernels::LayerNormForward(AsStream(Bound()), rows, cols, eps, x, gamma, beta, y, mean, rstd);
  Done("LayerNormForward");
}

void CudaBackend::LayerNormBackward(int64_t rows, int64_t cols, const float* x, const float* gamma, const float* mean,
                                    const float* rstd, const float* dy, float* dx, float* dgamma, float* dbeta) {
  kernels::LayerNormBackward(AsStream(Bound()), rows, cols, x, gamma, mean, rstd, dy, dx, dgamma, dbeta);
  Done("LayerNormBackward");
}

void CudaBackend::BatchNormStats(int64_t n, int64_t c, int64_t hw, const float* x, float* sums) {
  kernels::BatchNormStats(AsStream(Bound()), n, c, hw, x, sums);
  Done("BatchNormStats");
}

void CudaBackend::BatchNormMoments(int64_t c, float eps, float momentum, const float* sums, float* running_mean,
                                   float* running_var, float* mean, float* rstd) {
  kernels::BatchNormMoments(AsStream(Bound()), c, eps, momentum, sums, running_mean, running_var, mean, rstd);
  Done("BatchNormMoments");
}

void CudaBackend::BatchNormApply(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean,
                                 const float* rstd, const float* gamma, const float* beta, float* y) {
  kernels::BatchNormApply(AsStream(Bound()), n, c, hw, x, mean, rstd, gamma, beta, y);
  Done("BatchNormApply");
}

void CudaBackend::BatchNormBackwardStats(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean,
                                         const float* rstd, const float* dy, float* sums) {
  kernels::BatchNormBackwardStats(AsStream(Bound()), n, c, hw, x, mean, rstd, dy, sums);
  Done("BatchNormBackwardStats");
}

void CudaBackend::BatchNormBackwardApply(int64_t n, int64_t c, int64_t hw, const float* x, const float* mean,
                                         const float* rstd, const float* gamma, const float* sums, const float* dy,
                                         float* dx) {
  kernels::BatchNormBackwardApply(AsStream(Bound()), n, c, hw, x, mean, rstd, gamma, sums, dy, dx);
  Done("BatchNormBackwardApply");
}

// --- Softmax family ------------------------------------------------------------------------

void CudaBackend::SoftmaxForward(int64_t rows, int64_t cols, const float* x, float* y, bool log) {
  kernels::SoftmaxForward(AsStream(Bound()), rows, cols, x, y, log);
  Done("SoftmaxForward");
}

void CudaBackend::SoftmaxBackward(int64_t rows, int64_t cols, const float* y, const float* dy, float* dx, bool log) {
  kernels::SoftmaxBackward(AsStream(Bound()), rows, cols, y, dy, dx, log);
  Done("SoftmaxBackward");
}

void CudaBackend::CrossEntropyForward(int64_t rows, int64_t cols, const float* x, const int32_t* labels, float* logp,
                                      float* loss) {
  // Per-row losses in scratch; the bad-label flag (bad_label_) is set by any
  // row and read back at once outside a step, at the step's end inside one.
  float* per_row = static_cast<float*>(Scratch(5, sizeof(float) * rows));
  kernels::CrossEntropyForward(AsStream(Bound()), rows, cols, x, labels, logp, per_row, bad_label_);
  ReduceTo(per_row, rows, /*square=*/false, 1.0f / static_cast<float>(rows), loss);
  label_columns_ = cols;
  if (!in_step()) CheckLabels();
  Done("CrossEntropyForward");
}

void CudaBackend::CheckLabels() {
  if (label_columns_ == 0) return;
  int bad = 0;
  CUDA_CHECK(cudaMemcpyAsync(&bad, bad_label_, sizeof(int), cudaMemcpyDeviceToHost, AsStream(Bound())));
  CUDA_CHECK(cudaStreamSynchronize(AsStream(Bound())));
  if (bad != 0) {
    std::fprintf(stderr, "%s:%d: CrossEntropyForward: a label is outside [0, %lld)\n", __FILE__, __LINE__,
                 static_cast<long long>(label_columns_));
    std::abort();
  }
  label_columns_ = 0;
}

void CudaBackend::EndStep() {
  nn::Backend::EndStep();  // the deferred reads synchronise the stream
  CheckLabels();
}

void CudaBackend::CrossEntropyBackward(int64_t rows, int64_t cols, const float* logp, const int32_t* labels,
                                       const float* dloss, float* dx) {
  kernels::CrossEntropyBackward(AsStream(Bound()), rows, cols, logp, labels, dloss, dx);
  Done("CrossEntropyBackward");
}

// --- Images ------------------------------------------------------------------------------------

void CudaBackend::BytesToFloatPlanar(int64_t images, int64_t pixels, int64_t channels, float scale,
                                     const uint8_t* in, float* out) {
  kernels::BytesToFloatPlanar(AsStream(Bound()), images, pixels, channels, scale, in, out);
  Done("BytesToFloatPlanar");
}

void CudaBackend::GatherRows(int64_t rows, int64_t row_words, const float* table, int64_t count,
                             const int32_t* indices, float* out) {
  kernels::GatherRows(AsStream(Bound()), rows, row_words, table, count, indices, out);
  Done("GatherRows");
}

void CudaBackend::ScatterRows(int64_t rows, int64_t row_words, float* table, int64_t count, const int32_t* indices,
                              const float* values) {
  kernels::ScatterRows(AsStream(Bound()), rows, row_words, table, count, indices, values);
  Done("ScatterRows");
}

void CudaBackend::GatherBytesToFloatPlanar(int64_t rows, int64_t row_words, const float* table, int64_t images,
                                           const int32_t* indices, int64_t pixels, int64_t channels, float scale,
                                           float* out) {
  kernels::GatherBytesToFloatPlanar(AsStream(Bound()), rows, row_words, table, images, indices, pixels, channels,
                                    scale, out);
  Done("GatherBytesToFloatPlanar");
}

// --- Optimizers ----------------------------------------------------------------------------------

void CudaBackend::AdamUpdate(int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float c1,
                             float c2, const float* grad, float* param, float* m, float* v) {
  kernels::AdamUpdate(AsStream(Bound()), n, lr, beta1, beta2, eps, weight_decay, c1, c2, grad, param, m, v);
  Done("AdamUpdate");
}

void CudaBackend::SgdUpdate(int64_t n, float lr, float momentum, float weight_decay, const float* grad, float* param,
                            float* buf) {
  kernels::SgdUpdate(AsStream(Bound()), n, lr, momentum, weight_decay, grad, param, buf);
  Done("SgdUpdate");
}

void CudaBackend::ClipByNorm(float* x, int64_t n, float max_norm, float* norm) {
  // The sum of squares stays on the device: no host round trip per step.
  kernels::Reduce(AsStream(Bound()), x, n, /*square=*/true, reduce_result_ + 2, reduce_result_);
  kernels::ClipByNorm(AsStream(Bound()), x, n, max_norm, reduce_result_, norm);
  Done("ClipByNorm");
}

void CudaBackend::Polyak(int64_t n, float tau, const float* online, float* target) {
  kernels::Polyak(AsStream(Bound()), n, tau, online, target);
  Done("Polyak");
}

void CudaBackend::TrustRatio(const float* w_squared, const float* u_squared, float coefficient, float weight_decay,
                             float* ratio) {
  kernels::TrustRatio(AsStream(Bound()), w_squared, u_squared, coefficient, weight_decay, ratio);
  Done("TrustRatio");
}

void CudaBackend::ScaleByScalar(float alpha, const float* scalar, float* x, int64_t n) {
  kernels::ScaleByScalar(AsStream(Bound()), alpha, scalar, x, n);
  Done("ScaleByScalar");
}

}  // namespace troupe::cuda
