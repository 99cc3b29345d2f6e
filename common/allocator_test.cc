// The malloc a process runs on, and handing its free memory back. Built
// twice: allocator_test on glibc's malloc (as every test binary) and, where
// TROUPE_TCMALLOC, allocator_tcmalloc_test linked as troupe's programs are
// (TROUPE_EXPECT_TCMALLOC).
#include "common/allocator.h"

#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace troupe {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

#ifdef TROUPE_EXPECT_TCMALLOC
constexpr bool kTcmalloc = true;
#else
constexpr bool kTcmalloc = false;
#endif

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitizer = true;
#else
constexpr bool kSanitizer = false;
#endif

// This process's resident memory, from /proc/self/statm.
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

TEST(AllocatorTest, NamesTheMallocThisProcessRunsOn) {
  if (kSanitizer) GTEST_SKIP() << "AddressSanitizer's malloc: no glibc or tcmalloc to name";
  if (kTcmalloc) {
    EXPECT_THAT(Allocator(), StartsWith("tcmalloc (gperftools "));
    EXPECT_THAT(AllocatorLibrary(), HasSubstr("libtcmalloc"));
    EXPECT_TRUE(std::filesystem::is_regular_file(AllocatorLibrary())) << AllocatorLibrary();
  } else {
    EXPECT_EQ(Allocator(), "glibc");
    EXPECT_EQ(AllocatorLibrary(), "");
  }
}

// 64 MiB in blocks each allocator keeps when freed (glibc: 64 KiB chunks
// in the heap, below its mmap threshold, a live block above them so that
// free cannot shrink the heap's top; tcmalloc: 1 MiB spans in its page
// heap), touched, freed: resident until ReleaseFreeMemory hands them back.
TEST(AllocatorTest, ReleaseFreeMemoryHandsWhatWasFreedBackToTheSystem) {
  if (kSanitizer) GTEST_SKIP() << "AddressSanitizer's malloc: it quarantines what is freed";
  constexpr int64_t kTotal = 64 << 20;
  const int64_t block = kTcmalloc ? 1 << 20 : 64 << 10;
  std::vector<void*> blocks;
  for (int64_t i = 0; i < kTotal / block; ++i) {
    void* p = std::malloc(block);
    ASSERT_NE(p, nullptr);
    std::memset(p, 1, block);
    blocks.push_back(p);
  }
  void* above = std::malloc(1024);
  ASSERT_NE(above, nullptr);
  const int64_t allocated = ResidentBytes();
  for (void* p : blocks) std::free(p);
  const int64_t freed = ResidentBytes();
  ReleaseFreeMemory();
  const int64_t released = ResidentBytes();
  std::free(above);
  // Freeing alone keeps (most of) it; the release gives at least half back.
  EXPECT_GT(freed, allocated - kTotal / 2) << "freeing alone gave most of it back: nothing left to test";
  EXPECT_LT(released, freed - kTotal / 2) << "resident " << freed << " -> " << released << " bytes";
}

}  // namespace
}  // namespace troupe
