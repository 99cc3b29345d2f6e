// `troupe run CONFIG --slurm`: an RL experiment as one Slurm batch job.
//
// Submission (on a login node): the config's `slurm` section becomes a plan
// (task slots per node, where each learner rank and actor goes), checked
// against the partition sinfo reports, then a job script in
// RUN_DIR/slurm/job.sh, submitted with `sbatch --parsable`.
//
// Inside the job, the script runs `troupe slurm-job RUN_DIR` on the
// allocation's first node (RunSlurmJob): the learner (in that process, or its
// MPI ranks through mpirun / srun --mpi=pmix), and one `srun` job step per
// actor on its node, restarted when it dies, stopped when the learner ends.
// The learner's address is written to RUN_DIR/learner.address (HOST:PORT).
// SIGTERM (scancel, preemption) and SIGUSR1 (sbatch --signal=B:USR1@N before
// the time limit) make the learner checkpoint and stop; after SIGUSR1 the job
// requeues itself (slurm.requeue), and a job that starts over a checkpoint
// resumes from it.
#ifndef TROUPE_LAUNCH_SLURM_H_
#define TROUPE_LAUNCH_SLURM_H_

#include <atomic>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/config.pb.h"

namespace troupe::launch {

// Where a Slurm job's processes go: `nodes` nodes of `tasks_per_node` task
// slots of `cpus_per_task` CPUs; learner ranks take the first slots (rank 0
// on node 0), actors the rest, round-robin over the nodes.
struct SlurmPlan {
  int learner_ranks = 1;  // K MPI ranks (collectives MPI / NCCL_MPI), else 1
  bool mpi = false;       // the learner's ranks are MPI processes
  int actors = 0;
  int nodes = 1;
  int tasks_per_node = 1;
  int cpus_per_task = 1;
  std::vector<int> learner_rank_nodes;  // node index of each rank
  std::vector<int> actor_nodes;         // node index of each actor
};

// InvalidArgument naming the field for a slurm section sbatch would refuse
// or misread: a count out of range; a time_limit not in one of Slurm's
// formats (SlurmTimeLimitSeconds), zero or negative; warn_before_end_s not
// shorter than the time limit; a partition name that is not one plain word.
// Checked for every run (ValidateExperiment), with or without --slurm.
absl::Status ValidateSlurmConfig(const config::SlurmConfig& slurm);

// The seconds of a Slurm time limit (sbatch --time): "MINUTES",
// "MINUTES:SECONDS", "HOURS:MINUTES:SECONDS", "DAYS-HOURS",
// "DAYS-HOURS:MINUTES", "DAYS-HOURS:MINUTES:SECONDS"; -1 for "UNLIMITED" or
// "INFINITE"; nullopt for anything else (a word, a sign, an empty field).
std::optional<int64_t> SlurmTimeLimitSeconds(std::string_view text);

// The plan for `config` (mode RL). Errors: InvalidArgument naming the field
// for a slurm section that cannot be (nodes < 1, ...) or an allocation too
// small for the learner ranks and actors.
absl::StatusOr<SlurmPlan> PlanSlurmJob(const config::ExperimentConfig& config);

// A partition as sinfo reports it.
struct SlurmPartition {
  std::string name;
  int nodes = 0;          // nodes in the partition
  int cpus_per_node = 0;  // the smallest node's CPUs
};

// Asks sinfo about `partition` (empty = the default partition). Errors:
// NotFound naming the partition and those that exist; Unavailable with
// sinfo's own message when it fails (no controller answers).
absl::StatusOr<SlurmPartition> QuerySlurmPartition(const std::string& partition);

// InvalidArgument saying what does not fit when `plan` asks for more nodes
// or CPUs per node than `partition` has.
absl::Status CheckPlanFitsPartition(const SlurmPlan& plan, const SlurmPartition& partition,
                                    const std::string& partition_field);

// The batch script for a run directory (absolute path on storage every node
// sees) and the troupe binary the nodes run.
std::string SlurmJobScript(const config::ExperimentConfig& config, const SlurmPlan& plan,
                           const std::string& run_dir, const std::string& troupe_binary);

// `program`'s path on $PATH, or "" when it is not there.
std::string FindOnPath(const std::string& program);

// What a program printed (stdout and stderr together) and its exit status
// (128 + signal when killed).
struct ProgramResult {
  int exit_code = 0;
  std::string output;
};

// Runs argv (no shell) to completion. Errors: NotFound when it cannot be
// started.
absl::StatusOr<ProgramResult> RunProgram(const std::vector<std::string>& argv);

// `sbatch --parsable OPTIONS... SCRIPT`; returns the job id. Errors:
// FailedPrecondition with sbatch's message when it refuses the job.
absl::StatusOr<std::string> SubmitSlurmJob(const std::string& script, const std::vector<std::string>& sbatch_options);

// OK when sbatch is on the PATH; else FailedPrecondition saying where
// Slurm's commands are to be found (checked before anything is submitted).
absl::Status CheckSbatchOnPath();

// InvalidArgument "--slurm OPTION: `why`; nothing was submitted" for the
// first of `sbatch_options` that sets one of `reserved` (options troupe sets
// itself, e.g. {"-N", "--nodes"}): the option alone or as "--name=VALUE",
// or a short one with its value attached ("-N2"). OK when none does.
absl::Status CheckSbatchOptionsAvoid(const std::vector<std::string>& sbatch_options,
                                     const std::vector<std::string>& reserved, const std::string& why);

// The job's state as Slurm reports it ("PENDING", "RUNNING", "COMPLETED",
// "CANCELLED", ...; squeue, then scontrol), or "" once Slurm has forgotten
// the job.
std::string SlurmJobState(const std::string& job_id);

// Inside the allocation (the batch script): runs the experiment in
// `run_dir` as the file comment says until it ends or *stop; *requeue turns
// the stop into a checkpoint followed by `scontrol requeue` of this job (when
// slurm.requeue). Errors: config and learner errors; FailedPrecondition
// outside a Slurm allocation.
absl::Status RunSlurmJob(const std::string& run_dir, const std::string& troupe_binary,
                         const std::atomic<bool>* stop, const std::atomic<bool>* requeue);

}  // namespace troupe::launch

#endif  // TROUPE_LAUNCH_SLURM_H_
