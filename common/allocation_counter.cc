#include "common/allocation_counter.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace {
std::atomic<int64_t> g_allocations{0};
thread_local bool g_count_allocations = false;
}  // namespace

// The binary's operator new, counting while this thread's counter runs.
// (GCC sees free() meet operator new where std::allocator's calls are inlined.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t bytes) {
  if (g_count_allocations) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop

namespace troupe {

AllocationCounter::AllocationCounter() {
  g_allocations = 0;
  g_count_allocations = true;
}

AllocationCounter::~AllocationCounter() { g_count_allocations = false; }

int64_t AllocationCounter::Stop() {
  g_count_allocations = false;
  return g_allocations.load();
}

}  // namespace troupe
