#include "launch/sweep_slurm.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/shell.h"
#include "common/status_macros.h"
#include "launch/slurm.h"
#include "launch/sweep_summary.h"

namespace troupe::launch {

namespace fs = std::filesystem;

absl::Status CheckSlurmSweepOptions(const std::vector<std::string>& sbatch_options) {
  RETURN_IF_ERROR(CheckSbatchOnPath());
  return CheckSbatchOptionsAvoid(sbatch_options,
                                 {"-a", "--array", "-n", "--ntasks", "-c", "--cpus-per-task", "-o", "--output"},
                                 "troupe shapes the job array (one task per run, --cores CPUs each, at most "
                                 "--parallel at a time, output in SWEEP_DIR/slurm/)");
}

absl::StatusOr<SlurmSweepJobs> SubmitSweepToSlurm(const SweepPlan& plan, int parallel, int cpus_per_run,
                                                  const std::vector<std::string>& runner,
                                                  const std::vector<std::string>& summary_command,
                                                  const std::vector<std::string>& sbatch_options,
                                                  const std::function<void(const std::string&)>& log) {
  if (parallel < 1 || cpus_per_run < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--slurm: --parallel ", parallel, " and CPUs per run ", cpus_per_run, " must be >= 1"));
  }
  ASSIGN_OR_RETURN(const std::vector<const SweepRun*> pending, PrepareSweep(plan, log));
  SlurmSweepJobs jobs;
  if (pending.empty()) {
    log("every run is done: nothing to submit");
    RETURN_IF_ERROR(WriteSweepSummary(plan));
    return jobs;
  }
  // Absolute paths: the jobs may start elsewhere than here.
  const std::string dir = (fs::absolute(plan.sweep_dir) / "slurm").string();
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::PermissionDeniedError(absl::StrCat("cannot make ", dir, ": ", ec.message()));
  // Array task i runs line i + 1 of members.txt.
  std::string members;
  for (const SweepRun* run : pending) absl::StrAppend(&members, fs::absolute(run->run_dir).string(), "\n");
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/members.txt", members));
  const std::string name = fs::path(plan.sweep_dir).filename().string();
  std::string array = "#!/bin/bash\n";
  absl::StrAppend(&array, "# troupe sweep --slurm: one run of ", plan.sweep_dir, " per array task.\n");
  absl::StrAppend(&array, "#SBATCH --job-name=troupe-", name, "\n");
  absl::StrAppend(&array, "#SBATCH --array=0-", pending.size() - 1, "%", parallel, "\n");
  absl::StrAppend(&array, "#SBATCH --ntasks=1\n#SBATCH --cpus-per-task=", cpus_per_run, "\n");
  absl::StrAppend(&array, "#SBATCH --output=", dir, "/job-%A_%a.out\n#SBATCH --open-mode=append\n");
  absl::StrAppend(&array, "set -euo pipefail\n");
  absl::StrAppend(&array, "run_dir=$(sed -n \"$((SLURM_ARRAY_TASK_ID + 1))p\" ", ShellQuote(dir + "/members.txt"),
                  ")\n");
  absl::StrAppend(&array, "echo \"troupe sweep: array task $SLURM_ARRAY_TASK_ID on ",
                  "${SLURMD_NODENAME:-$(hostname)}: $run_dir\"\n");
  std::string command;
  for (const std::string& word : runner) absl::StrAppend(&command, ShellQuote(word), " ");
  absl::StrAppend(&array, "exec ", command, "\"$run_dir\" >> \"$run_dir/log.txt\" 2>&1\n");
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/array.sh", array));
  std::string summary = "#!/bin/bash\n";
  absl::StrAppend(&summary, "# troupe sweep --slurm: the summary of ", plan.sweep_dir, " once its array ended.\n");
  absl::StrAppend(&summary, "#SBATCH --job-name=troupe-", name, "-summary\n#SBATCH --ntasks=1\n");
  absl::StrAppend(&summary, "#SBATCH --output=", dir, "/summary-%j.out\n");
  std::string summary_words;
  for (const std::string& word : summary_command) absl::StrAppend(&summary_words, " ", ShellQuote(word));
  absl::StrAppend(&summary, "exec", summary_words, "\n");
  RETURN_IF_ERROR(WriteFileAtomically(dir + "/summary.sh", summary));

  ASSIGN_OR_RETURN(jobs.array_job, SubmitSlurmJob(dir + "/array.sh", sbatch_options));
  jobs.runs = static_cast<int>(pending.size());
  std::vector<std::string> after = sbatch_options;
  after.push_back("--dependency=afterany:" + jobs.array_job);
  auto summary_job = SubmitSlurmJob(dir + "/summary.sh", after);
  if (!summary_job.ok()) {
    log(absl::StrCat("the array is job ", jobs.array_job, ", but its summary job was refused (",
                     summary_job.status().message(), "): rerun with --summary-only once it ends"));
  } else {
    jobs.summary_job = *summary_job;
  }
  RETURN_IF_ERROR(WriteFileAtomically(
      dir + "/jobs.txt", absl::StrCat("array ", jobs.array_job, "\nsummary ", jobs.summary_job, "\n")));
  return jobs;
}

}  // namespace troupe::launch
