// One member of a sweep: the run in one run directory of a sweep
// (sweep_plan.h), as a child of the local runner or an array task of a
// Slurm sweep runs it (`troupe sweep --run-member RUN_DIR`).
#ifndef TROUPE_LAUNCH_SWEEP_MEMBER_H_
#define TROUPE_LAUNCH_SWEEP_MEMBER_H_

#include <atomic>
#include <string>

#include "absl/status/status.h"

namespace troupe::launch {

// What one child of RunSweep does: reads RUN_DIR/config.textproto, resumes
// from RUN_DIR/checkpoints when there is one (else clears everything but the
// config), trains (gan::RunGan or RunRlExperiment) until the budget or
// *stop, and writes RUN_DIR/done when the budget was reached. Errors: those
// of the run.
absl::Status RunSweepMember(const std::string& run_dir, const std::atomic<bool>* stop);

}  // namespace troupe::launch

#endif  // TROUPE_LAUNCH_SWEEP_MEMBER_H_
