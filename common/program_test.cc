// What a troupe program sets up before main (common/program.cc). Built
// twice: program_test as every test binary, and program_main_test linked as
// troupe's programs are (troupe_program; TROUPE_EXPECT_PROGRAM).
#include "absl/synchronization/mutex.h"

#include <gtest/gtest.h>

namespace troupe {
namespace {

#ifdef TROUPE_EXPECT_PROGRAM
constexpr bool kProgram = true;
#else
constexpr bool kProgram = false;
#endif
#ifdef NDEBUG
constexpr bool kOptimized = true;
#else
constexpr bool kOptimized = false;
#endif

// Two mutexes taken in one order, then in the other (no thread waits: a
// cycle in the order only, which absl's deadlock detector refuses).
void LockBothWaysRound() {
  absl::Mutex a, b;
  {
    absl::MutexLock first(&a);
    absl::MutexLock second(&b);
  }
  {
    absl::MutexLock first(&b);
    absl::MutexLock second(&a);
  }
}

TEST(ProgramTest, AbslsDeadlockDetectorIsOffOnlyInOptimizedPrograms) {
  if (kProgram && kOptimized) {
    LockBothWaysRound();  // no abort: the detector is off
    SUCCEED();
  } else {
    // Debian's abseil (built without NDEBUG) aborts on the cycle: the
    // tests, and Debug builds of the programs, keep the check.
    EXPECT_DEATH(LockBothWaysRound(), "potential deadlock");
  }
}

}  // namespace
}  // namespace troupe
