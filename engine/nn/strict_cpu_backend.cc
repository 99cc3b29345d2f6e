#include "engine/nn/strict_cpu_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status_macros.h"

namespace troupe::nn {
namespace {

size_t PageSize() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }

// The arena: address space reserved PROT_NONE, handed out by a bump pointer
// with freed blocks reused by size, readable and writable only while open.
class StrictArena final : public CpuMemoryGuard {
 public:
  explicit StrictArena(size_t arena_bytes) {
    reserved_ = PageRound(arena_bytes);
    void* p = mmap(nullptr, reserved_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    TROUPE_CHECK(p != MAP_FAILED);
    arena_ = static_cast<char*>(p);
  }
  ~StrictArena() override { munmap(arena_, reserved_); }
  StrictArena(const StrictArena&) = delete;
  StrictArena& operator=(const StrictArena&) = delete;

  void* Allocate(size_t bytes) override {
    const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
    void* p = nullptr;
    // A freed block of the same size, or fresh arena.
    if (auto it = free_.find(rounded); it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
    } else {
      if (used_ + rounded > reserved_) {
        std::fprintf(stderr, "strict CPU device: out of arena: %zu bytes asked, %zu of %zu used\n", bytes, used_,
                     reserved_);
        std::abort();
      }
      p = arena_ + used_;
      // Newly handed out pages take the arena's current protection.
      if (open_) {
        const size_t was = PageRound(used_);
        used_ += rounded;
        if (PageRound(used_) > was) Protect(PROT_READ | PROT_WRITE);
      } else {
        used_ += rounded;
      }
    }
    sizes_[p] = rounded;
    return p;
  }

  void Free(void* p) override {
    if (p == nullptr) return;
    auto it = sizes_.find(p);
    TROUPE_CHECK(it != sizes_.end());  // not this device's, or freed twice
    free_[it->second].push_back(p);
    sizes_.erase(it);
  }

  bool Owns(const void* p) const override {
    const char* c = static_cast<const char*>(p);
    return c >= arena_ && c < arena_ + used_;
  }

  void Open() override {
    open_ = true;
    Protect(PROT_READ | PROT_WRITE);
  }
  void Close() override {
    open_ = false;
    Protect(PROT_NONE);
  }

 private:
  static size_t PageRound(size_t bytes) { return (bytes + PageSize() - 1) / PageSize() * PageSize(); }
  void Protect(int protection) {
    if (used_ == 0) return;
    TROUPE_CHECK(mprotect(arena_, PageRound(used_), protection) == 0);
  }

  char* arena_ = nullptr;
  size_t reserved_ = 0;
  size_t used_ = 0;                            // bump pointer: [arena_, arena_ + used_) handed out
  bool open_ = false;                          // inside a call of the backend's
  std::map<void*, size_t> sizes_;              // live allocations and their (rounded) sizes
  std::map<size_t, std::vector<void*>> free_;  // freed blocks by size, reused first
};

}  // namespace

StrictCpuBackend::StrictCpuBackend(int num_threads, size_t arena_bytes)
    : CpuBackend(num_threads, std::make_unique<StrictArena>(arena_bytes)) {}

}  // namespace troupe::nn
