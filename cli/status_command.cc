// `troupe status RUN_DIR` (where a run stands, local or on Slurm) and
// `troupe slurm-job RUN_DIR` (what the job script of `troupe run --slurm`
// runs inside the allocation; not for typing by hand).
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cli/commands.h"
#include "common/event_writer.h"
#include "common/host.h"
#include "common/run_layout.h"
#include "launch/launcher.h"
#include "launch/slurm.h"

namespace troupe::cli {
namespace {

namespace fs = std::filesystem;

std::atomic<bool> job_stop{false};
std::atomic<bool> job_requeue{false};
void OnJobStop(int) { job_stop = true; }
void OnTimeLimitWarning(int) {
  job_requeue = true;
  job_stop = true;
}

std::string Ago(int64_t seconds) {
  if (seconds < 120) return absl::StrCat(seconds, " s ago");
  if (seconds < 7200) return absl::StrCat(seconds / 60, " min ago");
  return absl::StrCat(seconds / 3600, " h ago");
}

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int64_t FileAge(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return -1;
  return Now() - st.st_mtime;
}

// Prints where the run in `run_dir` stands; false when it is no run directory.
bool PrintStatus(const std::string& run_dir) {
  const RunLayout run(run_dir);
  if (!run.HasConfig()) {
    std::fprintf(stderr, "troupe status: %s is no run directory (no %s)\n", run_dir.c_str(), kConfigFile);
    return false;
  }
  std::printf("run directory %s\n", run_dir.c_str());
  // How it was started, and whether that is still going.
  const auto launch = ReadKeyValues(run.launch());
  const std::string launcher = launch.count("launcher") ? launch.at("launcher") : "";
  if (launcher == "slurm") {
    const std::string& id = launch.at("job_id");
    std::string state = launch::SlurmJobState(id);
    if (state.empty()) state = launch::FindOnPath("squeue").empty() ? "unknown here (no squeue on the PATH)"
                                                                     : "no longer known to Slurm (ended)";
    std::printf("slurm job %s: %s\n", id.c_str(), state.c_str());
    std::printf("job output %s\n", launch.count("output") ? launch.at("output").c_str() : "-");
  } else if (launcher == "local") {
    const std::string host = launch.count("host") ? launch.at("host") : "";
    const std::string pid = launch.count("pid") ? launch.at("pid") : "";
    std::string state = "ended";
    if (host != HostName()) {
      state = absl::StrCat("on another machine (", host, ")");
    } else if (!pid.empty() && fs::exists("/proc/" + pid)) {
      std::ifstream cmdline("/proc/" + pid + "/cmdline");
      std::string command;
      std::getline(cmdline, command, '\0');
      if (command.find("troupe") != std::string::npos || command.find("/proc/self/exe") != std::string::npos) {
        state = "running";
      }
    }
    std::printf("local run: troupe run (pid %s on %s): %s\n", pid.c_str(), host.c_str(), state.c_str());
  } else {
    std::printf("started by hand (troupe learner), or before troupe wrote %s\n", kLaunchFile);
  }
  // The status line the launcher keeps in the run directory.
  std::ifstream status_file(run.status());
  std::string line, updated;
  if (std::getline(status_file, line)) {
    std::getline(status_file, updated);
    int64_t when = 0;
    const std::vector<std::string> parts = absl::StrSplit(updated, ' ');
    if (parts.size() == 2) when = std::atoll(parts[1].c_str());
    std::printf("status (%s): %s\n", when > 0 ? Ago(Now() - when).c_str() : "?", line.c_str());
  } else {
    std::printf("status: none yet\n");
  }
  std::ifstream address_file(run.learner_address());
  std::string address;
  if (std::getline(address_file, address)) std::printf("learner %s\n", address.c_str());
  // The last checkpoint: the newest committed generation, else the one
  // checkpoint of a run from before generations (its counters.txt marks it).
  const std::string counters_file = run.NewestCheckpoint(/*gan=*/true);
  const std::string checkpoint = fs::path(counters_file).parent_path().string();
  const auto counters = ReadKeyValues(counters_file);
  const int64_t age = FileAge(counters_file);
  if (age >= 0) {
    std::printf("checkpoint %s (%s, at %s env frames)\n", checkpoint.c_str(), Ago(age).c_str(),
                counters.count("frames") ? counters.at("frames").c_str() : "?");
  } else {
    std::printf("checkpoint: none yet\n");
  }
  std::printf("metrics %s; actor logs %s/\n", run.metrics_csv().c_str(), run.logs().c_str());
  // Its TensorBoard event files (config `tensorboard`), if it has any.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(run_dir, ec)) {
    if (IsEventFileName(entry.path().filename().string())) {
      std::printf("tensorboard: tensorboard --logdir %s\n", run_dir.c_str());
      break;
    }
  }
  return true;
}

}  // namespace

void AddStatusCommand(CLI::App& app, int* exit_code) {
  auto run_dir = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "status", "Where a run stands (local or on Slurm): its job, status line, checkpoint, logs");
  cmd->add_option("run_dir", *run_dir, "The run directory (runs/NAME-DATE-TIME)")->required();
  cmd->callback([run_dir, exit_code] { *exit_code = PrintStatus(*run_dir) ? 0 : 2; });
}

void AddSlurmJobCommand(CLI::App& app, int* exit_code) {
  auto run_dir = std::make_shared<std::string>();
  // No group: hidden from --help; the job script of troupe run --slurm runs it.
  CLI::App* cmd = app.add_subcommand("slurm-job", "Inside a Slurm allocation: run the experiment in RUN_DIR")->group("");
  cmd->add_option("run_dir", *run_dir, "The run directory troupe run --slurm made")->required();
  cmd->callback([run_dir, exit_code] {
    // scancel and preemption send SIGTERM; sbatch --signal=B:USR1@N warns
    // before the time limit.
    std::signal(SIGINT, OnJobStop);
    std::signal(SIGTERM, OnJobStop);
    std::signal(SIGUSR1, OnTimeLimitWarning);
    if (absl::Status s = launch::RunSlurmJob(*run_dir, launch::SelfBinary(), &job_stop, &job_requeue); !s.ok()) {
      const char* job = std::getenv("SLURM_JOB_ID");
      const RunLayout run(*run_dir);
      std::fprintf(stderr, "troupe slurm-job: %s\nthe job failed; its logs: %s (this output), %s/\n", s.ToString().c_str(),
                   run.slurm_output(job ? job : "JOBID").c_str(), run.logs().c_str());
      *exit_code = 1;
    }
  });
}

}  // namespace troupe::cli
