// The env pool's async mode: jobs (step or reset an env) wait in FIFO
// queues; T threads, T - 1 workers this scheduler owns and the caller's
// own (inside WaitBatch), take them up; each result claims the next slot of
// a ring of batch buffers, and WaitBatch returns a buffer once it is full,
// so the first envs done are the first returned while the others run.
//
// With one queue for all threads no env waits behind a thread that is slow
// to run; a thread takes a share that shrinks with the queue. With a queue
// per thread (each thread's envs live in an env worker process of its own),
// an env waits in its home thread's queue and a thread takes all of it at
// once, one request to its process.
//
// Threading: Enqueue and WaitBatch are the caller's (one thread); jobs run
// on any thread, each env's jobs one at a time (an env is queued again only
// after WaitBatch returned its result).
#ifndef TROUPE_ENVS_SCHEDULERS_ASYNC_QUEUE_H_
#define TROUPE_ENVS_SCHEDULERS_ASYNC_QUEUE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "envs/env_worker.h"

namespace troupe::envs {

class AsyncQueueScheduler {
 public:
  using Job = EnvWorker::Job;
  struct Options {
    // Thread t's home envs are [home[t], home[t + 1]): T + 1 ascending
    // bounds from 0 to the number of envs, T >= 1.
    std::vector<int32_t> home;
    bool queue_per_thread = false;  // else one queue for all threads
    int batch_size = 1;             // rows of a buffer, >= 1
    int ring = 2;                   // buffers in the ring, >= 2
    // Before a thread's first job (e.g. to make its GL context).
    std::function<void(int thread)> on_start;
    // Runs `jobs` on thread `thread` before their results are claimed (a
    // worker process runs them all in one request); may do nothing.
    std::function<void(int thread, std::span<const Job> jobs)> start;
    // Writes `job`'s result (running it, or copying what `start` made) into
    // row `row` of ring buffer `buffer`.
    std::function<void(int thread, const Job& job, int buffer, int row)> finish;
  };

  // Starts the T - 1 worker threads.
  explicit AsyncQueueScheduler(Options options);
  // Stops and joins the workers; jobs still queued are dropped.
  ~AsyncQueueScheduler();
  AsyncQueueScheduler(const AsyncQueueScheduler&) = delete;
  AsyncQueueScheduler& operator=(const AsyncQueueScheduler&) = delete;

  // Queues a job per env id (each in [0, number of envs), none in flight)
  // and returns at once.
  void Enqueue(std::span<const int32_t> env_ids, bool reset);

  // Blocks until the next buffer of the ring holds batch_size results and
  // returns its index; the caller's thread runs queued jobs of its own
  // meanwhile. The buffer returned before is free again from this call on.
  // Needs batch_size jobs in flight (else it would wait for ever).
  int WaitBatch();

 private:
  // Env ids waiting for a thread.
  struct alignas(64) Queue {
    std::deque<Job> jobs;        // guarded by mutex_
    std::atomic<int> queued{0};  // jobs.size(), written under mutex_, read by spinning workers
  };
  // Results written into a buffer, on a line of its own.
  struct alignas(64) Count {
    std::atomic<int> written{0};
  };

  void WorkerLoop(std::stop_token stop, int thread);
  // The queue thread `thread` takes from / env `id` waits in.
  Queue& QueueOfThread(int thread) { return queues_[queues_.size() == 1 ? 0 : thread]; }
  Queue& QueueOfEnv(int32_t id);
  // Moves a share of the queue's front into `jobs`. mutex_ held.
  void TakeShare(Queue& queue, std::vector<Job>& jobs);
  // Runs thread `thread`'s jobs, each into the next result slot, publishing
  // each as soon as it is written.
  void RunJobs(int thread, std::span<const Job> jobs);

  const Options options_;
  const int num_threads_;
  // Slot k of the stream of results is buffer (k / batch_size) % ring, row
  // k % batch_size.
  std::atomic<int64_t> next_slot_{0};
  std::vector<Count> written_;       // per buffer
  int64_t next_batch_ = 0;           // the next buffer WaitBatch returns (caller only)
  // std::mutex rather than absl::Mutex, as EnvPool's (engine/nn/thread_pool.h:
  // ThreadSanitizer sees it).
  std::mutex mutex_;
  std::vector<Queue> queues_;        // one for all threads; or one per thread
  std::condition_variable_any work_ready_;  // workers wait for jobs (or a stop request)
  std::condition_variable batch_ready_;     // WaitBatch waits for a full buffer
  std::vector<Job> caller_jobs_;     // the caller's share inside WaitBatch
  std::vector<std::jthread> workers_;  // last: joined before the rest goes
};

}  // namespace troupe::envs

#endif  // TROUPE_ENVS_SCHEDULERS_ASYNC_QUEUE_H_
