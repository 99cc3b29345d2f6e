// Linked into each of troupe's programs that run a learner (troupe_program,
// cmake/TroupeHelpers.cmake), not into its libraries or tests: what such a
// process sets up before main.
//
// absl::Mutex's deadlock detector off where troupe is optimized (NDEBUG),
// as abseil's own optimized builds have it: Debian's shared abseil is built
// without NDEBUG, so each lock and unlock of an optimized troupe program
// looked itself up in the detector's global graph, cold after every
// execution on the device (docs/benchmarks/learner.md, the host's time per
// update). The tests, which are not troupe_programs, and Debug builds keep
// it: a lock-order inversion aborts there.
#include "absl/synchronization/mutex.h"

namespace {

#ifdef NDEBUG
[[maybe_unused]] const bool deadlock_detection_off = [] {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return true;
}();
#endif

}  // namespace
