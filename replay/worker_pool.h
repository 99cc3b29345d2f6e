// A fixed set of threads running queued closures in FIFO order. The replay
// service uses it for work a gRPC reaction must not do itself: waiting on a
// rate limiter, building a sample batch, writing a checkpoint.
//
// Locking: the queue is guarded by an absl::Mutex; tasks run without it.
// Threads are std::jthreads joined by the destructor, which first runs every
// task already queued.
#ifndef TROUPE_REPLAY_WORKER_POOL_H_
#define TROUPE_REPLAY_WORKER_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace troupe::replay {

class WorkerPool {
 public:
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `task`; never blocks.
  void Schedule(std::function<void()> task);

 private:
  void Loop();
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); }

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::jthread> threads_;
};

}  // namespace troupe::replay

#endif  // TROUPE_REPLAY_WORKER_POOL_H_
