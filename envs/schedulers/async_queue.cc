#include "envs/schedulers/async_queue.h"

#include <algorithm>
#include <utility>

#include "envs/schedulers/spin.h"

namespace troupe::envs {

AsyncQueueScheduler::AsyncQueueScheduler(Options options)
    : options_(std::move(options)),
      num_threads_(int(options_.home.size()) - 1),
      written_(options_.ring),
      queues_(options_.queue_per_thread ? num_threads_ : 1) {
  for (int t = 1; t < num_threads_; ++t) {
    workers_.emplace_back([this, t](std::stop_token stop) {
      if (options_.on_start) options_.on_start(t);
      WorkerLoop(stop, t);
    });
  }
}

AsyncQueueScheduler::~AsyncQueueScheduler() {
  for (auto& worker : workers_) worker.request_stop();  // wakes them: work_ready_ waits on the stop token
  workers_.clear();                                     // joins
}

AsyncQueueScheduler::Queue& AsyncQueueScheduler::QueueOfEnv(int32_t id) {
  if (queues_.size() == 1) return queues_[0];
  const int home = int(std::upper_bound(options_.home.begin(), options_.home.end(), id) - options_.home.begin()) - 1;
  return queues_[home];
}

void AsyncQueueScheduler::Enqueue(std::span<const int32_t> env_ids, bool reset) {
  {
    std::lock_guard lock(mutex_);
    for (int32_t id : env_ids) {
      Queue& queue = QueueOfEnv(id);
      queue.jobs.push_back({id, reset});
      queue.queued.fetch_add(1, std::memory_order_relaxed);
    }
  }
  // With one queue any worker will do; with a queue per thread, only its own.
  if (env_ids.size() == 1 && queues_.size() == 1) {
    work_ready_.notify_one();
  } else {
    work_ready_.notify_all();
  }
}

void AsyncQueueScheduler::TakeShare(Queue& queue, std::vector<Job>& jobs) {
  // A share shrinks with the queue: big ones cost one lock for many cheap
  // steps, small ones at the end keep the threads finishing together. A
  // queue of its own goes to its thread whole (one request to its worker).
  const size_t share = queues_.size() > 1 ? queue.jobs.size()
                                          : std::max<size_t>(1, queue.jobs.size() / (2 * size_t(num_threads_)));
  for (size_t i = 0; i < share; ++i) {
    jobs.push_back(queue.jobs.front());
    queue.jobs.pop_front();
  }
  queue.queued.fetch_sub(int(share), std::memory_order_relaxed);
}

void AsyncQueueScheduler::RunJobs(int thread, std::span<const Job> jobs) {
  if (options_.start) options_.start(thread, jobs);
  // Each env claims its result slot as it is taken up (rows in that order)
  // and is published at once: WaitBatch returns the first envs done. A
  // slot's row was last written a ring ago, by any thread; the claims'
  // chain of acq_rel adds orders this write after that one and after the
  // WaitBatch that returned it (some claim before this one is of a job sent
  // after it).
  const int batch_size = options_.batch_size;
  for (const Job& job : jobs) {
    const int64_t slot = next_slot_.fetch_add(1, std::memory_order_acq_rel);
    const int buffer = int((slot / batch_size) % options_.ring);
    options_.finish(thread, job, buffer, int(slot % batch_size));
    // The last row of a batch wakes the caller.
    if (written_[buffer].written.fetch_add(1, std::memory_order_acq_rel) + 1 == batch_size) {
      std::lock_guard lock(mutex_);
      batch_ready_.notify_one();
    }
  }
}

void AsyncQueueScheduler::WorkerLoop(std::stop_token stop, int thread) {
  Queue& queue = QueueOfThread(thread);
  std::vector<Job> jobs;
  for (;;) {
    jobs.clear();
    SpinFor(kSpin, [&] { return queue.queued.load(std::memory_order_relaxed) != 0 || stop.stop_requested(); });
    {
      std::unique_lock lock(mutex_);
      if (!work_ready_.wait(lock, stop, [&] { return queue.queued.load(std::memory_order_relaxed) > 0; })) return;
      TakeShare(queue, jobs);
    }
    RunJobs(thread, jobs);
  }
}

int AsyncQueueScheduler::WaitBatch() {
  // The buffer returned before is free again.
  if (next_batch_ > 0) written_[(next_batch_ - 1) % options_.ring].written.store(0, std::memory_order_relaxed);
  const int buffer = int(next_batch_ % options_.ring);
  std::atomic<int>& written = written_[buffer].written;
  // The caller works too: it runs queued jobs until none are left, then
  // sleeps until the workers finish the batch. (Only the caller enqueues, so
  // no job can arrive while it waits.)
  auto full = [&] { return written.load(std::memory_order_acquire) == options_.batch_size; };
  {
    std::unique_lock lock(mutex_);
    Queue& own = QueueOfThread(0);
    while (!full() && own.queued.load(std::memory_order_relaxed) > 0) {
      TakeShare(own, caller_jobs_);
      lock.unlock();
      RunJobs(/*thread=*/0, caller_jobs_);
      caller_jobs_.clear();
      lock.lock();
    }
    if (!full()) {
      // The workers are finishing the last envs: look before sleeping.
      lock.unlock();
      SpinFor(kSpin, full);
      lock.lock();
    }
    batch_ready_.wait(lock, full);
  }
  ++next_batch_;
  return buffer;
}

}  // namespace troupe::envs
