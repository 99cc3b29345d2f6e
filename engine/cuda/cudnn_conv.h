// Convolutions through cuDNN: CudaBackend's convolution path by default
// (CudaBackendOptions::convolutions), im2col + cuBLAS where cuDNN is missing
// or has no algorithm for a geometry.
//
// cuDNN is opened at run time (dlopen of libcudnn.so.9, or the path in
// TROUPE_CUDNN_LIBRARY), not linked: a machine without it still runs every
// CUDA binary, on the im2col path, and says why. The calls are cuDNN's
// NCHW convolution API (cudnnConvolutionForward / BackwardData /
// BackwardFilter), whose layouts are the engine's own: activations
// [n, c, h, w], filters [oc, c, kh, kw] (cross-correlation, as nn's Conv2d).
//
// Algorithms are chosen per geometry, data type and pass by cuDNN's own
// measurement (cudnnFind*Algorithm, once, on first use, as PyTorch's
// cudnn.benchmark), among those that keep the engine's numerics: float32
// without TF32 tensor cores unless the backend allows TF32 (CUDNN_FMA_MATH,
// as PyTorch does with allow_tf32 off), bfloat16 operands with float32
// accumulation. Workspace is one device buffer that grows to the largest
// chosen algorithm's (at most kMaxWorkspaceBytes).
#ifndef TROUPE_ENGINE_CUDA_CUDNN_CONV_H_
#define TROUPE_ENGINE_CUDA_CUDNN_CONV_H_

#include <array>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/nn/backend.h"

namespace troupe::cuda {

// cuDNN's entry points, resolved from the shared library (cudnn_conv.cc).
struct CudnnApi;

// Opens cuDNN once per process (libcudnn.so.9, or TROUPE_CUDNN_LIBRARY) and
// resolves every call troupe makes; FailedPrecondition naming the library or
// the missing symbol otherwise (the answer, library or error, is kept for
// the process).
absl::StatusOr<const CudnnApi*> LoadCudnn();
// LoadCudnn's work, uncached: opens the first of `names` that dlopen finds
// (the answer stays open for the process).
absl::StatusOr<const CudnnApi*> OpenCudnn(const std::vector<std::string>& names);
// "cuDNN 9.19.0 (libcudnn.so.9)": the loaded library's own version.
std::string CudnnDescription(const CudnnApi& api);
// The output shape [n, oc, oh, ow] cuDNN derives for `g` from the
// descriptors CudnnConvolutions builds (host only, no GPU needed): equal to
// the geometry's own when the descriptors say what the engine means.
absl::StatusOr<std::array<int, 4>> CudnnOutputShape(const CudnnApi& api, const nn::ConvGeometry& g);

enum class ConvDataType { kFloat32, kBfloat16 };
enum class ConvPass {
  kForward,         // out[n, oc, oh, ow] = conv(a = x, b = w) + beta * out
  kBackwardData,    // out[n, c, h, w]    = conv^T(a = dy, b = w) + beta * out
  kBackwardFilter,  // out[oc, c, kh, kw] = dw(a = x, b = dy) + beta * out
};

class CudnnConvolutions {
 public:
  static constexpr size_t kMaxWorkspaceBytes = size_t{1} << 30;

  // A cuDNN handle on `stream` (a cudaStream_t of the calling thread's
  // current device). FailedPrecondition when cuDNN is missing or does not
  // start on this GPU (the reason in the message).
  static absl::StatusOr<std::unique_ptr<CudnnConvolutions>> Create(void* stream, bool allow_tf32);
  ~CudnnConvolutions();
  CudnnConvolutions(const CudnnConvolutions&) = delete;
  CudnnConvolutions& operator=(const CudnnConvolutions&) = delete;

  // Whether cuDNN has an algorithm for this pass of `g` on operands of
  // `type` (planned on first use: cuDNN measures its candidates, ~ms).
  bool Supports(ConvPass pass, const nn::ConvGeometry& g, ConvDataType type);
  // Queues one pass of the convolution `g` on operands of `type` (device
  // pointers; bfloat16 tensors as uint16_t) on the stream. False, having
  // queued nothing, when cuDNN offers no algorithm for it (the caller takes
  // its im2col path; the first such geometry is reported on stderr); a
  // failed launch aborts with the call, file and line.
  bool Run(ConvPass pass, const nn::ConvGeometry& g, ConvDataType type, const void* a, const void* b, float beta,
           void* out);

  // "cuDNN 9.19.0 (libcudnn.so.9)".
  const std::string& description() const { return description_; }
  // Geometries planned so far, and of those how many have no cuDNN algorithm.
  int plans() const { return static_cast<int>(plans_.size()); }
  int unsupported() const;

 private:
  struct Plan;
  CudnnConvolutions(const CudnnApi* api, void* handle, void* stream, bool allow_tf32);
  // The plan of (pass, g, type), made on first use.
  Plan& PlanFor(ConvPass pass, const nn::ConvGeometry& g, ConvDataType type);
  void* Workspace(size_t bytes);

  const CudnnApi* api_;
  void* handle_;  // cudnnHandle_t
  void* stream_;  // cudaStream_t
  bool allow_tf32_;
  std::string description_;
  using Key = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int>;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  bool reported_unsupported_ = false;
};

}  // namespace troupe::cuda

#endif  // TROUPE_ENGINE_CUDA_CUDNN_CONV_H_
