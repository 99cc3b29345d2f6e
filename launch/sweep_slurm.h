// A sweep's runs as a Slurm job array, and its summary as a job after it.
#ifndef TROUPE_LAUNCH_SWEEP_SLURM_H_
#define TROUPE_LAUNCH_SWEEP_SLURM_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "launch/sweep_plan.h"

namespace troupe::launch {

// Checked before anything is created or submitted: sbatch on the PATH
// (FailedPrecondition), and sbatch options that would reshape the job array
// troupe sets (one task per run, its CPUs, at most --parallel at a time,
// output in SWEEP_DIR/slurm/): InvalidArgument naming the option.
absl::Status CheckSlurmSweepOptions(const std::vector<std::string>& sbatch_options);

// `troupe sweep ... --slurm [sbatch options]`: the runs of `plan` not done
// yet as one Slurm job array, one array task of `cpus_per_run` CPUs per run
// (at most `parallel` at a time), each running `runner... RUN_DIR` with its
// output appended to RUN_DIR/log.txt; then a second job that runs
// `summary_command` (the same sweep with --summary-only) once the array has
// ended, however its tasks ended (afterany). Prepares the sweep directory as
// RunSweep does, then writes SWEEP_DIR/slurm/: members.txt (array task i
// runs line i + 1), array.sh, summary.sh, jobs.txt (the job ids), and the
// array tasks' job-%A_%a.out. A member is an ordinary run: scancel makes it
// checkpoint, and a rerun of the same command submits what is not done,
// resuming from checkpoints. Errors: FailedPrecondition with sbatch's message
// when it refuses a job; PermissionDenied for a directory that cannot be
// written. With every run done, submits nothing and writes the summary.
struct SlurmSweepJobs {
  int runs = 0;             // array tasks submitted
  std::string array_job;    // "" when nothing was left to run
  std::string summary_job;  // "" likewise
};
absl::StatusOr<SlurmSweepJobs> SubmitSweepToSlurm(const SweepPlan& plan, int parallel, int cpus_per_run,
                                                  const std::vector<std::string>& runner,
                                                  const std::vector<std::string>& summary_command,
                                                  const std::vector<std::string>& sbatch_options,
                                                  const std::function<void(const std::string&)>& log);

}  // namespace troupe::launch

#endif  // TROUPE_LAUNCH_SWEEP_SLURM_H_
