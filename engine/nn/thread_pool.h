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
// (docs/design.md, "Measured costs", has the figures). TensorFlow sets the same
// mode.
//
// Locking: `mu_` guards the job description and counters; workers sleep on
// `work_cv_`, the caller on `done_cv_`. Threads are std::jthreads joined in the
// destructor. std::mutex rather than absl::Mutex (the project's convention)
// on purpose: ThreadSanitizer sees std::mutex, and Debian's shared abseil is
// not built for it, so every hand-off through an absl::Mutex reads as a race
// there; this pool and the env pool are the code TSan is most needed for.
#ifndef TROUPE_ENGINE_NN_THREAD_POOL_H_
#define TROUPE_ENGINE_NN_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

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

  const int num_threads_;
  std::mutex call_mu_;  // serialises callers
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  // Job state, guarded by mu_.
  const RangeFn* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_chunk_ = 0;
  int64_t next_ = 0;
  int active_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::vector<std::jthread> workers_;
};

// True inside a ParallelFor body (nested calls run inline).
bool InsideThreadPool();
// 0 on a calling thread, i in [1, num_threads) on a pool's worker i: an index
// for per-thread scratch inside a ParallelFor body.
int CurrentWorkerIndex();

}  // namespace troupe::nn

#endif  // TROUPE_ENGINE_NN_THREAD_POOL_H_
