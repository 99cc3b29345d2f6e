// Index width for the CUDA backend's elementwise kernels (kernels.cu,
// conv_kernels.cu): kernels templated on the index type I run with int32
// indices wherever the tensors allow. A 64-bit integer division or remainder
// is a long emulated sequence on the GPU, and kernels that turn a flat index
// into coordinates divide for every element.
#ifndef TROUPE_ENGINE_CUDA_INDEXING_CUH_
#define TROUPE_ENGINE_CUDA_INDEXING_CUH_

#include <cstdint>

namespace troupe::cuda::kernels {

// True when every index below `n`, and a grid-stride loop's last step past
// it (at most a grid of 8192 blocks of 1024 threads), fits in int32.
inline bool Fits32(int64_t n) { return n >= 0 && n < (int64_t{1} << 31) - (int64_t{1} << 24); }

// Threads of a one-block-per-channel reduction (conv bias gradients,
// batch-norm statistics): a layer has few channels, each summed over the
// whole batch, so wide blocks keep more of the GPU busy.
constexpr int kChannelThreads = 1024;

}  // namespace troupe::cuda::kernels

// Grid-stride loop over [0, n) with an index of type I.
#define FOR_EACH_INDEX(I, i, n) \
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x); i < (n); \
       i += static_cast<I>(blockDim.x) * static_cast<I>(gridDim.x))

// Launches kernel<int32_t> when `fits`, else kernel<int64_t>.
#define LAUNCH_INDEXED(kernel, fits, grid, block, stream, ...)        \
  do {                                                                \
    if (fits) {                                                       \
      kernel<int32_t><<<(grid), (block), 0, (stream)>>>(__VA_ARGS__); \
    } else {                                                          \
      kernel<int64_t><<<(grid), (block), 0, (stream)>>>(__VA_ARGS__); \
    }                                                                 \
  } while (false)

#endif  // TROUPE_ENGINE_CUDA_INDEXING_CUH_
