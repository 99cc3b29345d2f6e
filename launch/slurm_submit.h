// `troupe run CONFIG --slurm [sbatch options]` (and `troupe run --resume
// RUN_DIR --slurm`) on a login node: an RL experiment submitted as one Slurm
// batch job (slurm.h says what the job does once it runs).
//
// Everything is checked before anything is created or submitted: sbatch on
// the PATH, sbatch options that would reshape the job, the config's slurm
// section as a plan, the partition sinfo reports and its size, and, when
// resuming, a checkpoint and no job of the run still queued or running.
// Then the run directory (absolute: the nodes read and write it on shared
// storage) gets slurm/job.sh, logs/, secrets/ (owner only), and once sbatch
// accepted the job, launch.txt (how the run was started, for troupe status)
// and a line in slurm/jobs.txt.
#ifndef TROUPE_LAUNCH_SLURM_SUBMIT_H_
#define TROUPE_LAUNCH_SLURM_SUBMIT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/config.pb.h"

namespace troupe::launch {

// A submitted run.
struct SlurmRunJob {
  std::string job_id;
  std::string run_dir;  // absolute, without a trailing '/'
  std::string script;   // RUN_DIR/slurm/job.sh
  std::string output;   // RUN_DIR/slurm/job-JOB_ID.out: the job's stdout and stderr
};

// Submits `config` (valid, mode RL; read from `config_path`, which errors
// name) as a fresh run under its runs_dir, or, when `resume_dir` is not
// empty, the run in that directory to resume from its checkpoint.
// `sbatch_options` go to sbatch, before the script. Errors, nothing
// submitted: FailedPrecondition with no sbatch on the PATH, or for a resumed
// run whose job is still PENDING, RUNNING, REQUEUED or COMPLETING;
// InvalidArgument for an sbatch option that sets the job's nodes, tasks or
// CPUs (the slurm section does), a slurm section that cannot be planned, or
// a plan larger than the partition; NotFound for a resumed run without a
// checkpoint, or a partition sinfo does not list; Unavailable when sinfo
// fails; those of making the run directory and writing its files; sbatch's
// refusal (FailedPrecondition, its message and the script's path).
absl::StatusOr<SlurmRunJob> SubmitRunToSlurm(const config::ExperimentConfig& config, const std::string& config_path,
                                             const std::string& resume_dir,
                                             const std::vector<std::string>& sbatch_options);

}  // namespace troupe::launch

#endif  // TROUPE_LAUNCH_SLURM_SUBMIT_H_
