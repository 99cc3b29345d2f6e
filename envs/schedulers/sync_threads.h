// The env pool's sync batches on threads: every env of a batch run once, by
// T threads, T - 1 workers this scheduler owns and the caller's own, which
// takes envs while it waits (no hand-off latency, no oversubscription).
// Each env is run by one thread at a time, so envs need no locks.
//
// Thread t has a contiguous range of home envs, whose state stays in its
// core's cache from batch to batch. A batch is published by setting every
// thread's range of envs still to take (one atomic word: front and back)
// and bumping an epoch the workers spin (then sleep) on. A thread takes
// chunks from the front of its own range and, once that is empty, single
// envs from the back of the fullest other one. Finished envs are counted
// with one atomic add per chunk; the caller spins, then sleeps, until all
// are done. No lock and, while batches follow each other within the spin
// time, no system call: a batch of cheap state envs is over in tens of
// microseconds.
#ifndef TROUPE_ENVS_SCHEDULERS_SYNC_THREADS_H_
#define TROUPE_ENVS_SCHEDULERS_SYNC_THREADS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace troupe::envs {

class SyncThreadScheduler {
 public:
  // Runs envs [begin, end) of the batch in flight on thread `thread` (0 is
  // the caller's).
  using RunEnvs = std::function<void(int thread, int32_t begin, int32_t end)>;

  // Thread t's home envs are [home[t], home[t + 1]): home holds T + 1
  // ascending bounds from 0 to the number of envs, T >= 1. Starts the T - 1
  // worker threads; each calls on_start(t) before its first batch (e.g. to
  // make its GL context).
  SyncThreadScheduler(std::vector<int32_t> home, std::function<void(int thread)> on_start, RunEnvs run);
  // Stops and joins the workers (between batches).
  ~SyncThreadScheduler();
  SyncThreadScheduler(const SyncThreadScheduler&) = delete;
  SyncThreadScheduler& operator=(const SyncThreadScheduler&) = delete;

  int num_threads() const { return int(home_.size()) - 1; }

  // Runs every env once, each by one thread, in chunks handed to `run`;
  // blocks until all have run. What the caller wrote before the call is
  // visible to `run` on every thread. The caller's thread only.
  void RunBatch();

 private:
  // The envs of a thread's home range not yet taken in the batch in flight,
  // [front, back), in one word (front in the low half) so the owner of the
  // range (from the front) and a thief (from the back) claim envs with one
  // compare-and-swap each.
  struct alignas(64) Range {
    std::atomic<uint64_t> bounds{0};
  };

  void WorkerLoop(std::stop_token stop, int thread);
  // Takes and runs envs of the batch in flight until none are left to take.
  void RunJobs(int thread);
  // A chunk [begin, end) from the front of `thread`'s own range, or one env
  // from the back of the fullest other range; false when all are taken.
  bool TakeJobs(int thread, int32_t& begin, int32_t& end);

  const std::vector<int32_t> home_;
  const int32_t num_envs_;
  const RunEnvs run_;
  std::vector<Range> ranges_;                   // per thread
  alignas(64) std::atomic<uint32_t> epoch_{0};  // bumped by the caller to start a batch
  std::atomic<int> sleeping_workers_{0};        // workers waiting on epoch_ in the kernel
  alignas(64) std::atomic<int> done_{0};        // envs of the batch in flight finished
  std::atomic<bool> owner_sleeping_{false};     // the caller waits on done_ in the kernel
  std::vector<std::jthread> workers_;           // last: joined before the rest goes
};

}  // namespace troupe::envs

#endif  // TROUPE_ENVS_SCHEDULERS_SYNC_THREADS_H_
