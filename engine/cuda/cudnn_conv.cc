// cuDNN convolutions for CudaBackend: the library opened at run time, one
// plan (descriptors and a measured algorithm) per geometry, type and pass.
#include "engine/cuda/cudnn_conv.h"

#include <dlfcn.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_check.h"

#if __has_include(<cudnn.h>)
#include <cudnn.h>

namespace troupe::cuda {

// Every cuDNN call troupe makes (the shim libcudnn.so.9 exports them all and
// loads its sub-libraries itself).
#define TROUPE_CUDNN_CALLS(X)                                                                                   \
  X(cudnnGetVersion)                                                                                            \
  X(cudnnGetErrorString)                                                                                        \
  X(cudnnCreate) X(cudnnDestroy) X(cudnnSetStream)                                                              \
  X(cudnnCreateTensorDescriptor) X(cudnnSetTensor4dDescriptor) X(cudnnDestroyTensorDescriptor)                  \
  X(cudnnCreateFilterDescriptor) X(cudnnSetFilter4dDescriptor) X(cudnnDestroyFilterDescriptor)                  \
  X(cudnnCreateConvolutionDescriptor) X(cudnnSetConvolution2dDescriptor) X(cudnnSetConvolutionMathType)        \
  X(cudnnGetConvolution2dForwardOutputDim) X(cudnnDestroyConvolutionDescriptor)                                 \
  X(cudnnFindConvolutionForwardAlgorithm) X(cudnnFindConvolutionBackwardDataAlgorithm)                          \
  X(cudnnFindConvolutionBackwardFilterAlgorithm)                                                                \
  X(cudnnConvolutionForward) X(cudnnConvolutionBackwardData) X(cudnnConvolutionBackwardFilter)

struct CudnnApi {
#define TROUPE_CUDNN_MEMBER(f) decltype(&::f) f = nullptr;
  TROUPE_CUDNN_CALLS(TROUPE_CUDNN_MEMBER)
#undef TROUPE_CUDNN_MEMBER
  std::string library;  // the name or path it was opened by
};

// A cuDNN call whose failure is a broken invariant (a launch on planned
// descriptors): the call, file and line, then abort, as CUDA_CHECK.
#define CUDNN_CHECK(api, call)                                                                            \
  do {                                                                                                    \
    const cudnnStatus_t troupe_cudnn_status_ = (api).call;                                                \
    if (troupe_cudnn_status_ != CUDNN_STATUS_SUCCESS) {                                                   \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,                           \
                   (api).cudnnGetErrorString(troupe_cudnn_status_));                                      \
      std::abort();                                                                                       \
    }                                                                                                     \
  } while (false)

absl::StatusOr<const CudnnApi*> OpenCudnn(const std::vector<std::string>& names) {
  std::string tried;
  for (const std::string& name : names) {
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* why = dlerror();
      absl::StrAppend(&tried, tried.empty() ? "" : "; ", why != nullptr ? why : name);
      continue;
    }
    auto api = std::make_unique<CudnnApi>();
    api->library = name;
#define TROUPE_CUDNN_RESOLVE(f)                                                              \
  api->f = reinterpret_cast<decltype(api->f)>(dlsym(lib, #f));                               \
  if (api->f == nullptr) {                                                                   \
    dlclose(lib);                                                                            \
    return absl::FailedPreconditionError(absl::StrCat("cuDNN: ", name, " has no " #f));      \
  }
    TROUPE_CUDNN_CALLS(TROUPE_CUDNN_RESOLVE)
#undef TROUPE_CUDNN_RESOLVE
    if (const size_t version = api->cudnnGetVersion(); version < 90000) {
      dlclose(lib);
      return absl::FailedPreconditionError(
          absl::StrCat("cuDNN: ", name, " is version ", version, "; troupe's calls need cuDNN 9"));
    }
    return api.release();  // kept for the process, as the library
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "cuDNN not found (", tried,
      "); put libcudnn.so.9 on LD_LIBRARY_PATH (CUDA's lib64, or the nvidia-cudnn-cu13 wheel's nvidia/cudnn/lib) "
      "or set TROUPE_CUDNN_LIBRARY"));
}

namespace {

bool FitsInt(int64_t v) { return v >= 0 && v <= INT_MAX; }

struct Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
};

void Destroy(const CudnnApi& api, Descriptors& d) {
  if (d.x != nullptr) api.cudnnDestroyTensorDescriptor(d.x);
  if (d.y != nullptr) api.cudnnDestroyTensorDescriptor(d.y);
  if (d.w != nullptr) api.cudnnDestroyFilterDescriptor(d.w);
  if (d.conv != nullptr) api.cudnnDestroyConvolutionDescriptor(d.conv);
  d = {};
}

// x [n, c, h, w], w [oc, c, kh, kw], y [n, oc, oh, ow], cross-correlation
// with the geometry's padding and stride, float32 accumulation. An error
// (nothing kept) for what cuDNN's 4-d descriptors cannot hold.
absl::Status Describe(const CudnnApi& api, const nn::ConvGeometry& g, cudnnDataType_t type, Descriptors& d) {
  const int64_t oh = g.oh(), ow = g.ow();
  if (oh <= 0 || ow <= 0 || g.stride <= 0 || g.pad < 0) {
    return absl::InvalidArgumentError(absl::StrCat("convolution with output ", oh, "x", ow, ", stride ", g.stride,
                                                   ", pad ", g.pad));
  }
  const std::pair<const char*, int64_t> tensors[] = {
      {"input", g.n * g.c * g.h * g.w}, {"output", g.n * g.oc * oh * ow}, {"filter", g.oc * g.c * g.kh * g.kw}};
  for (const auto& [name, elements] : tensors) {
    if (!FitsInt(elements)) {
      return absl::OutOfRangeError(
          absl::StrCat("the ", name, " tensor has ", elements, " elements; cuDNN's 4-d tensors hold at most ", INT_MAX));
    }
  }
  auto check = [&](cudnnStatus_t s, const char* what) {
    return s == CUDNN_STATUS_SUCCESS
               ? absl::OkStatus()
               : absl::InternalError(absl::StrCat(what, ": ", api.cudnnGetErrorString(s)));
  };
  absl::Status s = check(api.cudnnCreateTensorDescriptor(&d.x), "cudnnCreateTensorDescriptor");
  if (s.ok()) s = check(api.cudnnCreateTensorDescriptor(&d.y), "cudnnCreateTensorDescriptor");
  if (s.ok()) s = check(api.cudnnCreateFilterDescriptor(&d.w), "cudnnCreateFilterDescriptor");
  if (s.ok()) s = check(api.cudnnCreateConvolutionDescriptor(&d.conv), "cudnnCreateConvolutionDescriptor");
  const auto i = [](int64_t v) { return static_cast<int>(v); };
  if (s.ok()) {
    s = check(api.cudnnSetTensor4dDescriptor(d.x, CUDNN_TENSOR_NCHW, type, i(g.n), i(g.c), i(g.h), i(g.w)),
              "cudnnSetTensor4dDescriptor(x)");
  }
  if (s.ok()) {
    s = check(api.cudnnSetTensor4dDescriptor(d.y, CUDNN_TENSOR_NCHW, type, i(g.n), i(g.oc), i(oh), i(ow)),
              "cudnnSetTensor4dDescriptor(y)");
  }
  if (s.ok()) {
    s = check(api.cudnnSetFilter4dDescriptor(d.w, type, CUDNN_TENSOR_NCHW, i(g.oc), i(g.c), i(g.kh), i(g.kw)),
              "cudnnSetFilter4dDescriptor");
  }
  if (s.ok()) {
    s = check(api.cudnnSetConvolution2dDescriptor(d.conv, i(g.pad), i(g.pad), i(g.stride), i(g.stride), 1, 1,
                                                  CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
              "cudnnSetConvolution2dDescriptor");
  }
  if (!s.ok()) Destroy(api, d);
  return s;
}

// The fastest measured algorithm that ran, fits the workspace cap and keeps
// the numerics: strict float32 skips any that report tensor-core math (it
// was measured under FMA math and runs under it, as PyTorch does with TF32
// off, whatever math type cuDNN reports for a non-tensor-core algorithm).
template <typename Perf>
const Perf* Pick(const Perf* perf, int count, bool strict_float32) {
  for (int i = 0; i < count; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    if (perf[i].memory > CudnnConvolutions::kMaxWorkspaceBytes) continue;
    if (strict_float32 &&
        (perf[i].mathType == CUDNN_TENSOR_OP_MATH || perf[i].mathType == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION)) {
      continue;
    }
    return &perf[i];
  }
  return nullptr;
}

const char* PassName(ConvPass pass) {
  switch (pass) {
    case ConvPass::kForward: return "forward";
    case ConvPass::kBackwardData: return "backward data";
    case ConvPass::kBackwardFilter: return "backward filter";
  }
  return "?";
}

}  // namespace

absl::StatusOr<const CudnnApi*> LoadCudnn() {
  static const auto* loaded = [] {
    std::vector<std::string> names = {"libcudnn.so.9", "libcudnn.so"};
    if (const char* path = std::getenv("TROUPE_CUDNN_LIBRARY"); path != nullptr && *path != '\0') names = {path};
    return new absl::StatusOr<const CudnnApi*>(OpenCudnn(names));
  }();
  return *loaded;
}

std::string CudnnDescription(const CudnnApi& api) {
  const size_t v = api.cudnnGetVersion();
  return absl::StrCat("cuDNN ", v / 10000, ".", (v % 10000) / 100, ".", v % 100, " (", api.library, ")");
}

absl::StatusOr<std::array<int, 4>> CudnnOutputShape(const CudnnApi& api, const nn::ConvGeometry& g) {
  Descriptors d;
  if (absl::Status s = Describe(api, g, CUDNN_DATA_FLOAT, d); !s.ok()) return s;
  std::array<int, 4> shape{};
  const cudnnStatus_t s =
      api.cudnnGetConvolution2dForwardOutputDim(d.conv, d.x, d.w, &shape[0], &shape[1], &shape[2], &shape[3]);
  Destroy(api, d);
  if (s != CUDNN_STATUS_SUCCESS) {
    return absl::InternalError(absl::StrCat("cudnnGetConvolution2dForwardOutputDim: ", api.cudnnGetErrorString(s)));
  }
  return shape;
}

struct CudnnConvolutions::Plan {
  Descriptors d;
  bool supported = false;
  int algo = 0;
  size_t workspace = 0;
};

absl::StatusOr<std::unique_ptr<CudnnConvolutions>> CudnnConvolutions::Create(void* stream, bool allow_tf32) {
  absl::StatusOr<const CudnnApi*> api = LoadCudnn();
  if (!api.ok()) return api.status();
  cudnnHandle_t handle = nullptr;
  if (cudnnStatus_t s = (*api)->cudnnCreate(&handle); s != CUDNN_STATUS_SUCCESS) {
    return absl::FailedPreconditionError(
        absl::StrCat("cudnnCreate (", CudnnDescription(**api), "): ", (*api)->cudnnGetErrorString(s)));
  }
  if (cudnnStatus_t s = (*api)->cudnnSetStream(handle, static_cast<cudaStream_t>(stream)); s != CUDNN_STATUS_SUCCESS) {
    (*api)->cudnnDestroy(handle);
    return absl::FailedPreconditionError(absl::StrCat("cudnnSetStream: ", (*api)->cudnnGetErrorString(s)));
  }
  return std::unique_ptr<CudnnConvolutions>(new CudnnConvolutions(*api, handle, stream, allow_tf32));
}

CudnnConvolutions::CudnnConvolutions(const CudnnApi* api, void* handle, void* stream, bool allow_tf32)
    : api_(api), handle_(handle), stream_(stream), allow_tf32_(allow_tf32), description_(CudnnDescription(*api)) {}

CudnnConvolutions::~CudnnConvolutions() {
  cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  for (auto& [key, plan] : plans_) Destroy(*api_, plan->d);
  cudaFree(workspace_);
  api_->cudnnDestroy(static_cast<cudnnHandle_t>(handle_));
}

int CudnnConvolutions::unsupported() const {
  int n = 0;
  for (const auto& [key, plan] : plans_) n += plan->supported ? 0 : 1;
  return n;
}

void* CudnnConvolutions::Workspace(size_t bytes) {
  if (bytes > workspace_bytes_) {
    // Queued convolutions may still use the old buffer.
    CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
    CUDA_CHECK(cudaFree(workspace_));
    workspace_ = nullptr;
    CUDA_CHECK(cudaMalloc(&workspace_, bytes));
    workspace_bytes_ = bytes;
  }
  return workspace_;
}

CudnnConvolutions::Plan& CudnnConvolutions::PlanFor(ConvPass pass, const nn::ConvGeometry& g, ConvDataType type) {
  const Key key{static_cast<int>(pass), g.n, g.c, g.h, g.w, g.oc, g.kh, g.kw, g.stride, g.pad, static_cast<int>(type)};
  std::unique_ptr<Plan>& slot = plans_[key];
  if (slot != nullptr) return *slot;
  slot = std::make_unique<Plan>();
  Plan& plan = *slot;
  const bool bf16 = type == ConvDataType::kBfloat16;
  const bool strict_float32 = !bf16 && !allow_tf32_;
  absl::Status status = Describe(*api_, g, bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT, plan.d);
  std::string why;
  if (status.ok()) {
    CUDNN_CHECK(*api_, cudnnSetConvolutionMathType(plan.d.conv, strict_float32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH));
    // cuDNN runs each candidate on buffers of its own (the caller's are
    // untouched) and returns them fastest first.
    auto handle = static_cast<cudnnHandle_t>(handle_);
    int count = 0;
    cudnnStatus_t s = CUDNN_STATUS_SUCCESS;
    auto choose = [&](const auto* perf) {
      if (s != CUDNN_STATUS_SUCCESS) {
        why = absl::StrCat("cudnnFind: ", api_->cudnnGetErrorString(s));
      } else if (const auto* best = Pick(perf, count, strict_float32); best == nullptr) {
        why = absl::StrCat(count, " algorithms measured, none ran within the numerics and workspace");
      } else {
        plan.supported = true;
        plan.algo = static_cast<int>(best->algo);
        plan.workspace = best->memory;
        CUDNN_CHECK(*api_, cudnnSetConvolutionMathType(plan.d.conv, strict_float32 ? CUDNN_FMA_MATH : best->mathType));
      }
    };
    switch (pass) {
      case ConvPass::kForward: {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        s = api_->cudnnFindConvolutionForwardAlgorithm(handle, plan.d.x, plan.d.w, plan.d.conv, plan.d.y,
                                                       CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count, perf);
        choose(perf);
        break;
      }
      case ConvPass::kBackwardData: {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        s = api_->cudnnFindConvolutionBackwardDataAlgorithm(handle, plan.d.w, plan.d.y, plan.d.conv, plan.d.x,
                                                            CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf);
        choose(perf);
        break;
      }
      case ConvPass::kBackwardFilter: {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        s = api_->cudnnFindConvolutionBackwardFilterAlgorithm(handle, plan.d.x, plan.d.y, plan.d.conv, plan.d.w,
                                                              CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf);
        choose(perf);
        break;
      }
    }
  } else {
    why = status.ToString();
  }
  if (!plan.supported && !reported_unsupported_) {
    reported_unsupported_ = true;
    std::fprintf(stderr,
                 "troupe: %s has no %s %s algorithm for conv n=%ld c=%ld %ldx%ld -> oc=%ld k=%ldx%ld stride %ld pad "
                 "%ld (%s); im2col there (reported once)\n",
                 description_.c_str(), bf16 ? "bfloat16" : "float32", PassName(pass), static_cast<long>(g.n),
                 static_cast<long>(g.c), static_cast<long>(g.h), static_cast<long>(g.w), static_cast<long>(g.oc),
                 static_cast<long>(g.kh), static_cast<long>(g.kw), static_cast<long>(g.stride),
                 static_cast<long>(g.pad), why.c_str());
  }
  return plan;
}

bool CudnnConvolutions::Supports(ConvPass pass, const nn::ConvGeometry& g, ConvDataType type) {
  return PlanFor(pass, g, type).supported;
}

bool CudnnConvolutions::Run(ConvPass pass, const nn::ConvGeometry& g, ConvDataType type, const void* a,
                            const void* b, float beta, void* out) {
  Plan& plan = PlanFor(pass, g, type);
  if (!plan.supported) return false;
  void* workspace = plan.workspace == 0 ? nullptr : Workspace(plan.workspace);
  const float alpha = 1.0f;  // float scaling for float32 and bfloat16 tensors alike
  auto handle = static_cast<cudnnHandle_t>(handle_);
  switch (pass) {
    case ConvPass::kForward:
      CUDNN_CHECK(*api_, cudnnConvolutionForward(handle, &alpha, plan.d.x, a, plan.d.w, b, plan.d.conv,
                                                 static_cast<cudnnConvolutionFwdAlgo_t>(plan.algo), workspace,
                                                 plan.workspace, &beta, plan.d.y, out));
      break;
    case ConvPass::kBackwardData:
      CUDNN_CHECK(*api_, cudnnConvolutionBackwardData(handle, &alpha, plan.d.w, b, plan.d.y, a, plan.d.conv,
                                                      static_cast<cudnnConvolutionBwdDataAlgo_t>(plan.algo),
                                                      workspace, plan.workspace, &beta, plan.d.x, out));
      break;
    case ConvPass::kBackwardFilter:
      CUDNN_CHECK(*api_, cudnnConvolutionBackwardFilter(handle, &alpha, plan.d.x, a, plan.d.y, b, plan.d.conv,
                                                        static_cast<cudnnConvolutionBwdFilterAlgo_t>(plan.algo),
                                                        workspace, plan.workspace, &beta, plan.d.w, out));
      break;
  }
  return true;
}

}  // namespace troupe::cuda

#else  // no cudnn.h at build time: every convolution takes the im2col path.

namespace troupe::cuda {

struct CudnnApi {};
struct CudnnConvolutions::Plan {};

absl::StatusOr<const CudnnApi*> OpenCudnn(const std::vector<std::string>&) {
  return absl::FailedPreconditionError("cuDNN: troupe was built without cudnn.h (CUDNN_ROOT)");
}
absl::StatusOr<const CudnnApi*> LoadCudnn() { return OpenCudnn({}); }
std::string CudnnDescription(const CudnnApi&) { return "cuDNN (not built)"; }
absl::StatusOr<std::array<int, 4>> CudnnOutputShape(const CudnnApi&, const nn::ConvGeometry&) {
  return LoadCudnn().status();
}
absl::StatusOr<std::unique_ptr<CudnnConvolutions>> CudnnConvolutions::Create(void*, bool) {
  return LoadCudnn().status();
}
CudnnConvolutions::~CudnnConvolutions() = default;
int CudnnConvolutions::unsupported() const { return 0; }
bool CudnnConvolutions::Supports(ConvPass, const nn::ConvGeometry&, ConvDataType) { return false; }
bool CudnnConvolutions::Run(ConvPass, const nn::ConvGeometry&, ConvDataType, const void*, const void*, float,
                            void*) {
  return false;
}

}  // namespace troupe::cuda

#endif
