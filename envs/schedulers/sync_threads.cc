#include "envs/schedulers/sync_threads.h"

#include <algorithm>
#include <utility>

#include "envs/schedulers/spin.h"

namespace troupe::envs {
namespace {

uint64_t PackRange(uint32_t front, uint32_t back) { return uint64_t(back) << 32 | front; }
uint32_t Front(uint64_t bounds) { return uint32_t(bounds); }
uint32_t Back(uint64_t bounds) { return uint32_t(bounds >> 32); }

}  // namespace

SyncThreadScheduler::SyncThreadScheduler(std::vector<int32_t> home, std::function<void(int thread)> on_start,
                                         RunEnvs run)
    : home_(std::move(home)), num_envs_(home_.back()), run_(std::move(run)), ranges_(home_.size() - 1) {
  for (int t = 1; t < num_threads(); ++t) {
    workers_.emplace_back([this, on_start, t](std::stop_token stop) {
      if (on_start) on_start(t);
      WorkerLoop(stop, t);
    });
  }
}

SyncThreadScheduler::~SyncThreadScheduler() {
  for (auto& worker : workers_) worker.request_stop();
  // Workers sleep on the epoch rather than on a condition variable.
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  epoch_.notify_all();
  workers_.clear();  // joins
}

void SyncThreadScheduler::RunBatch() {
  // Publish the batch: every range (release: a thread that claims an env
  // sees what the caller wrote before), then the epoch the workers wait on.
  done_.store(0, std::memory_order_relaxed);
  for (size_t t = 0; t < ranges_.size(); ++t) {
    ranges_[t].bounds.store(PackRange(home_[t], home_[t + 1]), std::memory_order_release);
  }
  epoch_.fetch_add(1, std::memory_order_seq_cst);
  if (sleeping_workers_.load(std::memory_order_seq_cst) > 0) epoch_.notify_all();

  RunJobs(/*thread=*/0);
  // The workers are finishing the last envs: look before sleeping. (Either
  // the caller's load after announcing its sleep sees the last count, or the
  // last thread's load of owner_sleeping_ sees it asleep; both seq_cst.)
  auto all_done = [&] { return done_.load(std::memory_order_acquire) == num_envs_; };
  if (!SpinFor(kSpin, all_done)) {
    owner_sleeping_.store(true, std::memory_order_seq_cst);
    for (int d; (d = done_.load(std::memory_order_seq_cst)) != num_envs_;) done_.wait(d, std::memory_order_seq_cst);
    owner_sleeping_.store(false, std::memory_order_relaxed);
  }
}

bool SyncThreadScheduler::TakeJobs(int thread, int32_t& begin, int32_t& end) {
  // Own range, from the front, in chunks that shrink with what is left: big
  // ones cost one atomic for many cheap steps, small ones at the end keep
  // the threads finishing together.
  std::atomic<uint64_t>& own = ranges_[thread].bounds;
  uint64_t bounds = own.load(std::memory_order_acquire);
  while (Front(bounds) < Back(bounds)) {
    const uint32_t chunk = std::max(1u, (Back(bounds) - Front(bounds)) / 4);
    if (own.compare_exchange_weak(bounds, PackRange(Front(bounds) + chunk, Back(bounds)), std::memory_order_acq_rel)) {
      begin = int32_t(Front(bounds));
      end = begin + int32_t(chunk);
      return true;
    }
  }
  // Steal one env from the back of the fullest other range (its owner works
  // from the front): a stolen env's state moves to this core and back, so
  // move only as many as it takes to finish together.
  for (;;) {
    int victim = -1;
    uint32_t most = 0;
    for (size_t t = 0; t < ranges_.size(); ++t) {
      const uint64_t b = ranges_[t].bounds.load(std::memory_order_relaxed);
      if (Back(b) - Front(b) > most) {
        most = Back(b) - Front(b);
        victim = int(t);
      }
    }
    if (victim < 0) return false;
    std::atomic<uint64_t>& range = ranges_[victim].bounds;
    bounds = range.load(std::memory_order_acquire);
    if (Front(bounds) < Back(bounds) &&
        range.compare_exchange_strong(bounds, PackRange(Front(bounds), Back(bounds) - 1), std::memory_order_acq_rel)) {
      end = int32_t(Back(bounds));
      begin = end - 1;
      return true;
    }
  }
}

void SyncThreadScheduler::RunJobs(int thread) {
  int32_t begin, end;
  while (TakeJobs(thread, begin, end)) {
    run_(thread, begin, end);
    // One atomic add per chunk; the last one wakes a sleeping caller.
    const int count = end - begin;
    if (done_.fetch_add(count, std::memory_order_seq_cst) + count == num_envs_ &&
        owner_sleeping_.load(std::memory_order_seq_cst)) {
      done_.notify_one();
    }
  }
}

void SyncThreadScheduler::WorkerLoop(std::stop_token stop, int thread) {
  uint32_t seen = 0;  // the epoch before the first batch
  for (;;) {
    auto next_batch = [&] { return epoch_.load(std::memory_order_acquire) != seen || stop.stop_requested(); };
    if (!SpinFor(kSpin, next_batch)) {
      sleeping_workers_.fetch_add(1, std::memory_order_seq_cst);
      while (!stop.stop_requested() && epoch_.load(std::memory_order_seq_cst) == seen) {
        epoch_.wait(seen, std::memory_order_seq_cst);
      }
      sleeping_workers_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (stop.stop_requested()) return;
    seen = epoch_.load(std::memory_order_acquire);
    RunJobs(thread);
  }
}

}  // namespace troupe::envs
