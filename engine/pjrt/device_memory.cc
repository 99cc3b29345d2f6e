#include "engine/pjrt/device_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/pjrt/fatal.h"

namespace troupe::pjrt {

namespace {

size_t PageRound(size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return (std::max<size_t>(bytes, 1) + page - 1) / page * page;
}

}  // namespace

DeviceMemory::~DeviceMemory() {
  for (const Range& r : allocations_) {
    client_->Destroy(buffer(*r.allocation));
    munmap(reinterpret_cast<void*>(r.base), r.allocation->reserved);
  }
}

std::vector<DeviceMemory::Range>::iterator DeviceMemory::After(uintptr_t address) {
  return std::upper_bound(allocations_.begin(), allocations_.end(), address,
                          [](uintptr_t a, const Range& r) { return a < r.base; });
}

std::vector<DeviceMemory::Range>::iterator DeviceMemory::Starting(uintptr_t base) {
  auto it = After(base);
  return it == allocations_.begin() || std::prev(it)->base != base ? allocations_.end() : std::prev(it);
}

DeviceMemory::Allocation* DeviceMemory::At(uintptr_t base) {
  auto it = Starting(base);
  return it == allocations_.end() ? nullptr : it->allocation.get();
}

void* DeviceMemory::Allocate(size_t bytes, bool scratch) {
  Allocation a;
  a.bytes = bytes;
  a.reserved = PageRound(bytes);
  a.words = static_cast<int64_t>(std::max<size_t>(1, (bytes + 3) / 4));
  // Addresses only: PROT_NONE and never backed, so the host cannot use them.
  void* base = mmap(nullptr, a.reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    std::fprintf(stderr, "PJRT backend: no address range for an allocation of %zu bytes\n", bytes);
    std::abort();
  }
  // Contents are undefined by the contract; zeros are what the device gets.
  const std::vector<float> zeros(static_cast<size_t>(a.words), 0.0f);
  const int64_t dims[] = {a.words};
  auto buffer = client_->BufferFromHost(zeros.data(), capi::kF32, dims, device_);
  if (!buffer.ok()) Fatal(buffer.status(), absl::StrCat("allocating ", bytes, " bytes").c_str());
  if (free_slots_.empty()) {
    a.slot = static_cast<uint32_t>(buffers_.size());
    buffers_.push_back(nullptr);
  } else {
    a.slot = free_slots_.back();
    free_slots_.pop_back();
  }
  buffers_[a.slot] = *buffer;
  a.scratch = scratch;
  a.id = ++allocated_;
  ++layout_;
  const auto address = reinterpret_cast<uintptr_t>(base);
  allocations_.insert(After(address), Range{address, address + bytes, std::make_unique<Allocation>(a)});
  return base;
}

void DeviceMemory::Free(void* p) {
  auto it = Starting(reinterpret_cast<uintptr_t>(p));
  if (it == allocations_.end()) {
    std::fprintf(stderr, "PJRT backend: Free(%p): not an allocation of this backend\n", p);
    std::abort();
  }
  capi::Buffer*& freed = buffer(*it->allocation);
  client_->Destroy(freed);
  freed = nullptr;
  free_slots_.push_back(it->allocation->slot);
  munmap(p, it->allocation->reserved);
  allocations_.erase(it);
  ++layout_;
}

std::pair<uintptr_t, DeviceMemory::Allocation*> DeviceMemory::Find(const void* p, int64_t* byte_offset) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  auto it = After(address);
  if (p == nullptr || it == allocations_.begin() || address >= std::prev(it)->end) {
    std::fprintf(stderr, "PJRT backend: %p is not this device's memory (host memory given to a kernel?)\n", p);
    std::abort();
  }
  --it;
  *byte_offset = static_cast<int64_t>(address - it->base);
  return {it->base, it->allocation.get()};
}

void DeviceMemory::BeginStep() {
  for (Range& r : allocations_) r.allocation->live_in_step = false;
}

absl::Status DeviceMemory::Await() {
  for (const Range& r : allocations_) {
    if (absl::Status s = client_->Await(buffer(*r.allocation)); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace troupe::pjrt
