// A sweep's runs on this machine: child processes, `parallel` at a time.
#ifndef TROUPE_LAUNCH_SWEEP_LOCAL_H_
#define TROUPE_LAUNCH_SWEEP_LOCAL_H_

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "launch/sweep_plan.h"

namespace troupe::launch {

// The runs of `plan` not done yet, `parallel` at a time, each as a child
// process `runner... RUN_DIR` (the CLI passes `troupe sweep --run-member`)
// with its output appended to RUN_DIR/log.txt; writes sweep.txt and each new
// run's config.textproto first (and, for GANs, trains the FID classifier
// once when its checkpoint is missing), and the summary after every run
// that ends.
// Blocks until every run ended or *stop; on stop, sends SIGTERM to the
// running children (they checkpoint) and waits for them. `log` hears one line
// per run started, skipped or ended. Errors: Cancelled when stopped (rerun to
// resume); Internal naming the runs that failed (the others still ran);
// PermissionDenied for a directory that cannot be written.
absl::Status RunSweep(const SweepPlan& plan, int parallel, const std::vector<std::string>& runner,
                      const std::atomic<bool>* stop, const std::function<void(const std::string&)>& log);

}  // namespace troupe::launch

#endif  // TROUPE_LAUNCH_SWEEP_LOCAL_H_
