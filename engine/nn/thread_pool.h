// A fixed pool of worker threads for data-parallel loops inside nn ops.
//
// `ParallelFor(n, fn)` splits [0, n) into contiguous ranges, runs them on the
// workers and the calling thread, and returns when all are done. It does not
// allocate: the body is passed by reference (FunctionRef), not std::function.
// One ParallelFor at a time per pool (calls from several threads are
// serialised by `call_mu_`); nested calls from inside a body run inline.
//
// Denormals: the workers, and every thread that calls ParallelFor or
// ParallelTasks (from then on), compute with subnormal floats flushed to
// zero (x86 FTZ and DAZ). Adam's second moments of weights that stop getting
// gradient decay into the subnormal range, where arithmetic is far slower
// (the README's D4PG-from-pixels section has the measured cost). TensorFlow
// sets the same mode.
//
// Locking: `mu_` (an absl::Mutex) guards the job description and counters;
// workers wait on it for a new job, the caller for the job's end. Threads are
// std::jthreads joined in the destructor.
#ifndef TROUPE_ENGINE_NN_THREAD_POOL_H_
#define TROUPE_ENGINE_NN_THREAD_POOL_H_

#include <cstdint>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace troupe::nn {

// A non-owning reference to a callable `void(int64_t begin, int64_t end)`.
class RangeFn {
 public:
  template <typename F, typename = std::enable_if_t<!std::is_same_v<std::decay_t<F>, RangeFn>>>
  RangeFn(F&& f)  // NOLINT: implicit on purpose, like absl::FunctionRef.
      : object_(const_cast<void*>(static_cast<const void*>(&f))),
        call_([](void* o, int64_t b, int64_t e) { (*static_cast<std::remove_reference_t<F>*>(o))(b, e); }) {}
  void operator()(int64_t begin, int64_t end) const { call_(object_, begin, end); }

 private:
  void* object_;
  void (*call_)(void*, int64_t, int64_t);
};

class ThreadPool {
 public:
  // `num_threads` >= 1 counts the caller: a pool of 2 starts one worker.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs fn over [0, n) in at most num_threads() ranges, each at least
  // `min_per_range` long (small loops run inline). Blocks until done.
  void ParallelFor(int64_t n, int64_t min_per_range, RangeFn fn);

  // Runs fn(task) for task in [0, num_tasks), one task per call, spread over
  // the threads; `fn(begin, end)` gets a range of tasks. Same as ParallelFor
  // with min_per_range 1 but ranges are handed out dynamically.
  void ParallelTasks(int64_t num_tasks, RangeFn fn);

 private:
  void WorkerLoop(int index);
  void RunJob(int64_t n, int64_t chunk, RangeFn fn);
  // Takes and runs ranges of the job until none are left to take; mu_ is
  // released while a range runs.
  void RunRanges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int num_threads_;
  absl::Mutex call_mu_;  // serialises callers
  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(call_mu_);
  // The job: fn over [0, n) in ranges of `chunk`, handed out from `next_`.
  const RangeFn* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t job_n_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t job_chunk_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_ ABSL_GUARDED_BY(mu_) = 0;
  int active_ ABSL_GUARDED_BY(mu_) = 0;         // ranges being run
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped per job: workers wait for a new one
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::jthread> workers_;
};

// True inside a ParallelFor body (nested calls run inline).
bool InsideThreadPool();
// 0 on a calling thread, i in [1, num_threads) on a pool's worker i: an index
// for per-thread scratch inside a ParallelFor body.
int CurrentWorkerIndex();

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_THREAD_POOL_H_
