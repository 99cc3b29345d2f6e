#include "engine/nn/thread_pool.h"

#include <algorithm>

#if defined(__SSE__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#endif

#include "common/status_macros.h"

namespace troupe::nn {
namespace {
thread_local bool inside_pool = false;
thread_local int worker_index = 0;

// Flush-to-zero and denormals-are-zero on the calling thread (x86; a no-op
// elsewhere). See thread_pool.h, "Denormals".
void FlushDenormalsOnThisThread() {
#if defined(__SSE__)
  constexpr unsigned int kFlush = _MM_FLUSH_ZERO_ON | _MM_DENORMALS_ZERO_ON;
  const unsigned int csr = _mm_getcsr();
  if ((csr & kFlush) != kFlush) _mm_setcsr(csr | kFlush);
#endif
}
}  // namespace

bool InsideThreadPool() { return inside_pool; }
int CurrentWorkerIndex() { return worker_index; }

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  workers_.clear();  // joins
}

void ThreadPool::WorkerLoop(int index) {
  FlushDenormalsOnThisThread();
  inside_pool = true;
  worker_index = index;
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    // Take ranges until none are left.
    while (next_ < job_n_) {
      const int64_t begin = next_;
      const int64_t end = std::min(job_n_, begin + job_chunk_);
      next_ = end;
      ++active_;
      const RangeFn* fn = job_;
      lock.unlock();
      (*fn)(begin, end);
      lock.lock();
      if (--active_ == 0 && next_ >= job_n_) done_cv_.notify_all();
    }
  }
}

void ThreadPool::RunJob(int64_t n, int64_t chunk, RangeFn fn) {
  std::lock_guard<std::mutex> call_lock(call_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  job_ = &fn;
  job_n_ = n;
  job_chunk_ = chunk;
  next_ = 0;
  active_ = 0;
  ++generation_;
  work_cv_.notify_all();
  // The caller takes ranges too.
  inside_pool = true;
  while (next_ < job_n_) {
    const int64_t begin = next_;
    const int64_t end = std::min(job_n_, begin + job_chunk_);
    next_ = end;
    ++active_;
    lock.unlock();
    fn(begin, end);
    lock.lock();
    --active_;
  }
  inside_pool = false;
  done_cv_.wait(lock, [&] { return active_ == 0; });
  job_ = nullptr;
  job_n_ = 0;
}

void ThreadPool::ParallelFor(int64_t n, int64_t min_per_range, RangeFn fn) {
  FlushDenormalsOnThisThread();
  if (n <= 0) return;
  const int64_t ranges = std::min<int64_t>(num_threads_, std::max<int64_t>(1, n / std::max<int64_t>(1, min_per_range)));
  if (ranges <= 1 || inside_pool) {
    fn(0, n);
    return;
  }
  RunJob(n, (n + ranges - 1) / ranges, fn);
}

void ThreadPool::ParallelTasks(int64_t num_tasks, RangeFn fn) {
  FlushDenormalsOnThisThread();
  if (num_tasks <= 0) return;
  if (num_threads_ == 1 || num_tasks == 1 || inside_pool) {
    fn(0, num_tasks);
    return;
  }
  RunJob(num_tasks, 1, fn);
}

}  // namespace troupe::nn
