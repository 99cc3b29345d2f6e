// The env pool's sync batches with env worker processes (envs/env_worker.h):
// pixel envs past the caller's home range live in T - 1 processes, which
// step and render them, a request per batch. No worker threads: the
// caller's thread hands every process its whole share at once, runs its
// own envs meanwhile, then collects the answers (one hand-off per process
// and batch).
#ifndef TROUPE_ENVS_SCHEDULERS_SYNC_PROCESSES_H_
#define TROUPE_ENVS_SCHEDULERS_SYNC_PROCESSES_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "envs/env_worker.h"

namespace troupe::envs {

class SyncProcessScheduler {
 public:
  struct Options {
    std::vector<EnvWorker*> workers;  // not owned; outlive the scheduler
    int32_t own_envs = 0;             // the caller's envs are [0, own_envs)
    // Runs the caller's envs [begin, end) of the batch.
    std::function<void(int32_t begin, int32_t end)> run_own;
    // Takes env `id`'s result of the batch from `worker`.
    std::function<void(const EnvWorker& worker, int32_t id)> collect;
    // Hears a worker's error (EnvWorker::Send / Wait); its envs are still
    // collected (an env's error row is kLast, a dead worker's are stale).
    std::function<void(const absl::Status&)> on_error;
  };

  explicit SyncProcessScheduler(Options options);

  // Resets (`reset`) or steps every env once, env e with
  // actions[e * action_size ...] (pool ids; unread for resets); blocks until
  // every worker has answered and every env is collected.
  void RunBatch(bool reset, const float* actions);

 private:
  const Options options_;
  std::vector<EnvWorker::Job> jobs_;  // a worker's share, reused
};

}  // namespace troupe::envs

#endif  // TROUPE_ENVS_SCHEDULERS_SYNC_PROCESSES_H_
