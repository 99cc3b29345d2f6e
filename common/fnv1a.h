// FNV-1a, 64 bits: the checksum of troupe's checkpoint files
// (engine/nn/checkpoint.h) and stable names (std::hash is not promised to be
// the same across builds). Header-only with no dependencies, so the bench's
// peers (bench/peers/*.cc, compiled on their own against libtorch) include
// it too.
#ifndef TROUPE_COMMON_FNV1A_H_
#define TROUPE_COMMON_FNV1A_H_

#include <cstddef>
#include <cstdint>

namespace troupe {

// FNV-1a's standard 64-bit offset basis.
inline constexpr uint64_t kFnv1aBasis = 14695981039346656037ull;
// The basis troupe's checkpoint files were written with from the start, one
// digit short of the standard one; kept so that every existing file reads.
inline constexpr uint64_t kCheckpointFnv1aBasis = 1469598103934665603ull;

inline uint64_t Fnv1a64(const char* data, size_t n, uint64_t basis = kFnv1aBasis) {
  uint64_t h = basis;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 1099511628211ull;
  }
  return h;
}

// The checksum that ends a troupe checkpoint file: FNV-1a-64 of every byte
// before it, from kCheckpointFnv1aBasis.
inline uint64_t CheckpointChecksum(const char* data, size_t n) { return Fnv1a64(data, n, kCheckpointFnv1aBasis); }

}  // namespace troupe

#endif  // TROUPE_COMMON_FNV1A_H_
