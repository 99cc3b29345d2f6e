#include "launch/slurm_submit.h"

#include <chrono>
#include <filesystem>
#include <fstream>

#include <google/protobuf/text_format.h>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/generations.h"
#include "common/run_layout.h"
#include "common/status_macros.h"
#include "launch/launcher.h"
#include "launch/slurm.h"

namespace troupe::launch {
namespace {

namespace fs = std::filesystem;

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The partition named by sbatch options on the command line (-p P,
// --partition P, --partition=P), else `fallback`.
std::string PartitionOf(const std::vector<std::string>& sbatch_options, const std::string& fallback) {
  std::string partition = fallback;
  for (size_t i = 0; i < sbatch_options.size(); ++i) {
    const std::string& o = sbatch_options[i];
    if ((o == "-p" || o == "--partition") && i + 1 < sbatch_options.size()) partition = sbatch_options[i + 1];
    if (o.rfind("--partition=", 0) == 0) partition = o.substr(12);
    if (o.rfind("-p", 0) == 0 && o.size() > 2 && o[2] != '-') partition = o.substr(2);
  }
  return partition;
}

}  // namespace

absl::StatusOr<SlurmRunJob> SubmitRunToSlurm(const config::ExperimentConfig& config, const std::string& config_path,
                                             const std::string& resume_dir,
                                             const std::vector<std::string>& sbatch_options) {
  const bool resume = !resume_dir.empty();
  if (resume && RunLayout(resume_dir).NewestCheckpoint().empty()) {
    return absl::NotFoundError(
        absl::StrCat("--resume ", resume_dir, ": no checkpoint in ", RunLayout(resume_dir).checkpoints()));
  }
  RETURN_IF_ERROR(CheckSbatchOnPath());
  // The job's shape comes from the slurm section, which the job itself reads
  // to place its processes; sbatch options must not change it.
  RETURN_IF_ERROR(CheckSbatchOptionsAvoid(
      sbatch_options, {"-N", "--nodes", "-n", "--ntasks", "--ntasks-per-node", "-c", "--cpus-per-task"},
      "the job's nodes, tasks and CPUs come from the config's slurm section (--set slurm.nodes=N, "
      "slurm.tasks_per_node, slurm.cpus_per_actor, slurm.cpus_per_learner_rank)"));
  auto plan = PlanSlurmJob(config);
  if (!plan.ok()) return absl::InvalidArgumentError(absl::StrCat(config_path, ": ", plan.status().message()));
  const std::string partition_name = PartitionOf(sbatch_options, config.slurm().partition());
  auto partition = QuerySlurmPartition(partition_name);
  if (!partition.ok()) {
    return absl::Status(partition.status().code(),
                        absl::StrCat("--slurm: ", partition.status().message(), "; nothing was submitted"));
  }
  const std::string field = partition_name == config.slurm().partition()
                                ? (partition_name.empty() ? "the default partition" : "slurm.partition")
                                : "sbatch's --partition";
  if (absl::Status fits = CheckPlanFitsPartition(*plan, *partition, field); !fits.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(config_path, ": ", fits.message(), "; nothing was submitted"));
  }
  // A resumed run must not be running already.
  if (resume) {
    const std::map<std::string, std::string> launch = ReadKeyValues(RunLayout(resume_dir).launch());
    const std::string job_id = launch.count("job_id") ? launch.at("job_id") : "";
    const std::string state = job_id.empty() ? "" : SlurmJobState(job_id);
    if (state == "PENDING" || state == "RUNNING" || state == "REQUEUED" || state == "COMPLETING") {
      return absl::FailedPreconditionError(absl::StrCat("--resume ", resume_dir, ": Slurm job ", job_id,
                                                        " of this run is ", state, "; scancel ", job_id,
                                                        " first (it checkpoints)"));
    }
  }
  // The run directory, absolute: the nodes read and write it (shared storage).
  SlurmRunJob job;
  job.run_dir = resume_dir;
  if (!resume) {
    ASSIGN_OR_RETURN(job.run_dir, MakeRunDirectory(config.runs_dir(), config.name()));
    std::string text;
    google::protobuf::TextFormat::PrintToString(config, &text);
    RETURN_IF_ERROR(WriteFileAtomically(RunLayout(job.run_dir).config(), text));
  }
  job.run_dir = fs::absolute(job.run_dir).lexically_normal().string();
  if (!job.run_dir.empty() && job.run_dir.back() == '/') job.run_dir.pop_back();
  const RunLayout run(job.run_dir);
  fs::create_directories(run.slurm());
  fs::create_directories(run.logs());
  // Where the security work's token goes (never on a command line): owner only.
  fs::create_directories(run.secrets());
  fs::permissions(run.secrets(), fs::perms::owner_all);
  job.script = run.slurm_script();
  RETURN_IF_ERROR(WriteFileAtomically(job.script, SlurmJobScript(config, *plan, job.run_dir, SelfBinary())));
  fs::permissions(job.script, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
  auto job_id = SubmitSlurmJob(job.script, sbatch_options);
  if (!job_id.ok()) {
    return absl::Status(job_id.status().code(),
                        absl::StrCat("--slurm: ", job_id.status().message(), " (job script: ", job.script, ")"));
  }
  job.job_id = *job_id;
  job.output = run.slurm_output(job.job_id);
  // launch.txt: "KEY VALUE" lines saying how the run was started (troupe status).
  (void)WriteFileAtomically(run.launch(),
                            absl::StrCat("launcher slurm\njob_id ", job.job_id, "\nscript ", job.script, "\noutput ",
                                         job.output, "\nsubmitted ", UnixSeconds(), "\n"));
  std::ofstream(run.slurm_jobs(), std::ios::app) << job.job_id << "\n";
  return job;
}

}  // namespace troupe::launch
