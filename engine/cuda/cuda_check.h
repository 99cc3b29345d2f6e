// Fail-fast checks for CUDA runtime and cuBLAS calls whose failure is a broken
// invariant (a bad pointer, a lost device): print the call, file and line, and
// abort, as TROUPE_CHECK does. Internal to engine/cuda.
#ifndef TROUPE_ENGINE_CUDA_CUDA_CHECK_H_
#define TROUPE_ENGINE_CUDA_CUDA_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define CUDA_CHECK(call)                                                                              \
  do {                                                                                                \
    const cudaError_t troupe_cuda_error_ = (call);                                                    \
    if (troupe_cuda_error_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,                       \
                   cudaGetErrorString(troupe_cuda_error_));                                           \
      std::abort();                                                                                   \
    }                                                                                                 \
  } while (false)

#define CUBLAS_CHECK(call)                                                                            \
  do {                                                                                                \
    const cublasStatus_t troupe_cublas_status_ = (call);                                              \
    if (troupe_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                             \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,                       \
                   cublasGetStatusString(troupe_cublas_status_));                                     \
      std::abort();                                                                                   \
    }                                                                                                 \
  } while (false)

#endif  // TROUPE_ENGINE_CUDA_CUDA_CHECK_H_
