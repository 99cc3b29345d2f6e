// The strict CPU device: the CPU backend's kernels on memory the host
// cannot touch. Its CpuMemoryGuard hands out memory from an arena kept
// PROT_NONE (mprotect) except while the backend's own calls run: a kernel,
// Upload, Download. A host read or write of device memory between kernels
// then faults at once, where it happens, instead of silently working on a
// CPU and failing on a GPU; so a test on this device proves a step keeps
// the device-memory contract of backend.h without a GPU. Results equal
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
#include <string>

#include "engine/nn/cpu_backend.h"

namespace troupe::nn {

class StrictCpuBackend final : public CpuBackend {
 public:
  // `num_threads` as CpuBackend's. `arena_bytes` of address space are
  // reserved up front (MAP_NORESERVE: pages are backed only once used);
  // Allocate aborts, naming the size, when they run out.
  explicit StrictCpuBackend(int num_threads, size_t arena_bytes = size_t{16} << 30);
  std::string name() const override { return "cpu_strict"; }
  // True if `p` points into this device's arena.
  bool Owns(const void* p) const { return guard()->Owns(p); }
};

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_STRICT_CPU_BACKEND_H_
