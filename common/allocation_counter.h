// Counts the heap allocations (operator new) one thread makes, for tests
// that a path allocates nothing once warm. Test-only: a binary that links
// troupe_allocation_counter has the global operator new replaced by one
// that counts (common/allocation_counter.cc); one counter at a time.
//
//   AllocationCounter counter;  // this thread, from now
//   RunTheWarmPath();
//   EXPECT_EQ(counter.Stop(), 0);
#ifndef TROUPE_COMMON_ALLOCATION_COUNTER_H_
#define TROUPE_COMMON_ALLOCATION_COUNTER_H_

#include <cstdint>

namespace troupe {

class AllocationCounter {
 public:
  AllocationCounter();   // starts counting this thread's operator new calls from 0
  ~AllocationCounter();  // stops, if Stop() was not called
  AllocationCounter(const AllocationCounter&) = delete;
  AllocationCounter& operator=(const AllocationCounter&) = delete;

  // Stops counting; the calls counted since the constructor.
  int64_t Stop();
};

}  // namespace troupe

#endif  // TROUPE_COMMON_ALLOCATION_COUNTER_H_
