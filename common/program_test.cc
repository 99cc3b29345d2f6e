// What a troupe program sets up before main (common/program.cc). Built
// twice: program_test as every test binary, and program_main_test linked as
// troupe's programs are (troupe_program; TROUPE_EXPECT_PROGRAM).
#include "absl/synchronization/mutex.h"

#include <gtest/gtest.h>

namespace troupe {
namespace {

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

#if defined(TROUPE_EXPECT_PROGRAM) && defined(NDEBUG)
// A troupe program, optimized: the detector is off.
TEST(ProgramTest, AbslsDeadlockDetectorIsOffWhereOptimized) {
  LockBothWaysRound();  // no abort
  SUCCEED();
}
#elif defined(TROUPE_EXPECT_PROGRAM)
// A troupe program built for debugging keeps the check.
TEST(ProgramTest, AbslsDeadlockDetectorAbortsOnALockOrderCycleInDebugBuilds) {
  EXPECT_DEATH(LockBothWaysRound(), "potential deadlock");
}
#else
// Any test binary (not a troupe program) keeps it: Debian's abseil, built
// without NDEBUG, aborts on the cycle.
TEST(TestBinaryTest, AbslsDeadlockDetectorAbortsOnALockOrderCycle) {
  EXPECT_DEATH(LockBothWaysRound(), "potential deadlock");
}
#endif

}  // namespace
}  // namespace troupe
