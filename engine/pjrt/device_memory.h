// The device memory of one PjrtBackend: each allocation one PJRT buffer on the
// device (float32 words), named by an address from a range reserved
// PROT_NONE and never backed, so a host read of device memory faults as on
// the strict CPU device. Kernels take addresses anywhere inside an
// allocation (the tape's arena, a parameter inside a ParameterSet), so Find
// resolves a pointer to (allocation, offset).
//
// Holds: the allocations, their address ranges and current buffers. Not: what
// reads or writes them (a program records that: program_recorder.h; the
// backend's Upload and Download), nor any step state beyond each scratch
// allocation's live_in_step flag. A buffer is replaced by whoever writes a
// whole allocation anew (an execution's output, a whole upload), which
// destroys the old one.
#ifndef TROUPE_ENGINE_PJRT_DEVICE_MEMORY_H_
#define TROUPE_ENGINE_PJRT_DEVICE_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/pjrt/plugin.h"

namespace troupe::pjrt {

class DeviceMemory {
 public:
  struct Allocation {
    size_t bytes = 0;        // as asked for
    size_t reserved = 0;     // address range reserved (page multiple)
    int64_t words = 0;       // float32 words of the PJRT buffer
    uint32_t slot = 0;       // where its buffer is: DeviceMemory::buffer
    bool scratch = false;       // AllocateScratch: dead after each step
    bool live_in_step = false;  // scratch a split step's first program left for its second
    // This backend's allocations numbered as made: an address range freed
    // and reserved again is another allocation (a replayed step's check).
    uint64_t id = 0;
  };

  // Memory on `device` of `client`.
  DeviceMemory(std::shared_ptr<Client> client, int device) : client_(std::move(client)), device_(device) {}
  // Destroys every allocation's buffer and releases its address range.
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // A new allocation of `bytes`, zeros on the device (`scratch`: the tape's
  // arena, dead after each step). Aborts, saying why, when no address range
  // is left or the device refuses the buffer.
  void* Allocate(size_t bytes, bool scratch);
  // Frees the allocation at `p` (its start); aborts naming p when p is not one.
  void Free(void* p);
  // The allocation `p` points into and p's byte offset in it; aborts naming
  // the address when p is not this memory.
  std::pair<uintptr_t, Allocation*> Find(const void* p, int64_t* byte_offset);
  // The allocation whose range starts at `base`; null when there is none.
  Allocation* At(uintptr_t base);
  // An allocation's current PJRT buffer, by the allocation or its slot. The
  // buffers are one array apart from the allocations: a replayed step binds
  // its arguments' slots once per layout, then reads a hundred buffers from
  // a few cache lines every execution instead of one allocation each.
  capi::Buffer*& buffer(const Allocation& a) { return buffers_[a.slot]; }
  capi::Buffer*& buffer(uint32_t slot) { return buffers_[slot]; }

  // Bumped by every Allocate and Free, never 0: an Allocation* from At or
  // Find stays valid (and is the same allocation) while layout() is
  // unchanged (a replayed step binds its arguments once per layout).
  uint64_t layout() const { return layout_; }

  // A step begins: no scratch is live from an earlier program.
  void BeginStep();
  // Waits until every allocation's contents are computed (the first error).
  absl::Status Await();

 private:
  std::shared_ptr<Client> client_;
  int device_;
  // By the address range's start, in order: one array searched by halves
  // (Find runs for every upload; a tree's nodes came cold each time, after
  // an execution: docs/benchmarks/learner.md). Each Allocation on the heap,
  // so a pointer to one outlives insertions.
  struct Range {
    uintptr_t base, end;  // end: base + the bytes asked for
    std::unique_ptr<Allocation> allocation;
  };
  std::vector<Range> allocations_;
  // Each allocation's buffer at its slot; the slots freed, for the next.
  std::vector<capi::Buffer*> buffers_;
  std::vector<uint32_t> free_slots_;
  // The first range starting after `address`.
  std::vector<Range>::iterator After(uintptr_t address);
  // The range starting at `base`; end() when there is none.
  std::vector<Range>::iterator Starting(uintptr_t base);
  uint64_t allocated_ = 0;
  uint64_t layout_ = 1;
};

}  // namespace troupe::pjrt

#endif  // TROUPE_ENGINE_PJRT_DEVICE_MEMORY_H_
