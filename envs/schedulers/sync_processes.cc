#include "envs/schedulers/sync_processes.h"

#include <utility>

namespace troupe::envs {

SyncProcessScheduler::SyncProcessScheduler(Options options) : options_(std::move(options)) {}

void SyncProcessScheduler::RunBatch(bool reset, const float* actions) {
  // Every worker gets its share at once. (A worker whose Send failed fails
  // its Wait with the same error, at once.)
  for (EnvWorker* worker : options_.workers) {
    jobs_.clear();
    for (int32_t id = worker->first(); id < worker->first() + worker->count(); ++id) jobs_.push_back({id, reset});
    if (const absl::Status status = worker->Send(jobs_, actions); !status.ok()) options_.on_error(status);
  }
  // This thread steps its own meanwhile, then collects the answers.
  options_.run_own(0, options_.own_envs);
  for (EnvWorker* worker : options_.workers) {
    if (const absl::Status status = worker->Wait(); !status.ok()) options_.on_error(status);
    for (int32_t id = worker->first(); id < worker->first() + worker->count(); ++id) options_.collect(*worker, id);
  }
}

}  // namespace troupe::envs
