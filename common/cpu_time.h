// The calling thread's CPU clock.
#ifndef TROUPE_COMMON_CPU_TIME_H_
#define TROUPE_COMMON_CPU_TIME_H_

#include <time.h>

namespace troupe {

// The calling thread's CPU time, in seconds (CLOCK_THREAD_CPUTIME_ID): its
// work without its waits, which a loaded machine does not stretch.
inline double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace troupe

#endif  // TROUPE_COMMON_CPU_TIME_H_
