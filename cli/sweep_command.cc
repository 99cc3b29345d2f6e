// troupe sweep CONFIG --grid field=v1,v2,... [--grid ...] [--seeds N] [--parallel P] [--dir DIR]
// (launch/sweep_plan.h says what the sweep directory holds).
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "launch/sweep_local.h"
#include "launch/sweep_member.h"
#include "launch/sweep_plan.h"
#include "launch/sweep_slurm.h"
#include "launch/sweep_summary.h"

namespace troupe::cli {
namespace {

std::atomic<bool> stop_requested{false};
void OnSignal(int) { stop_requested = true; }

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "troupe sweep: %s\n", std::string(status.message()).c_str());
  if (absl::IsInvalidArgument(status) || absl::IsNotFound(status) || absl::IsFailedPrecondition(status)) return 2;
  return 1;
}

// This binary, to run each member as `troupe sweep --run-member RUN_DIR`.
std::string SelfPath() {
  std::error_code ec;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/proc/self/exe") : path.string();
}

}  // namespace

void AddSweepCommand(CLI::App& app, int* exit_code) {
  struct Args {
    std::string config;
    std::vector<std::string> grid;
    std::vector<std::string> overrides;
    int seeds = 1;
    int first_seed = 0;
    int parallel = 1;
    int cores = 0;
    std::string dir;
    bool summary_only = false;
    bool slurm = false;
    std::string run_member;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "sweep",
      "Run a config over a grid of field values and seeds, each a run directory under one sweep directory; "
      "resumable (a rerun skips finished runs, resumes the others); writes summary.csv/.md and curves.png");
  cmd->add_option("config", args->config, "Experiment config, protobuf text format (mode GAN or RL)");
  cmd->add_option("--grid", args->grid, "A swept field: path.to.field=v1,v2,... (repeatable; the cross product runs)");
  cmd->add_option("--set", args->overrides, "Override a config field for every run: path.to.field=value (repeatable)");
  cmd->add_option("--seeds", args->seeds, "Seeds per grid point (seed i adds i to the engine's seed)")
      ->capture_default_str();
  cmd->add_option("--first-seed", args->first_seed,
                  "Index of the first seed: runs seed-F .. seed-(F+N-1) (more seeds for a study, or its seeds split "
                  "between machines)")
      ->capture_default_str();
  cmd->add_option("--parallel", args->parallel, "Runs at a time on this machine, the cores split between them")
      ->capture_default_str();
  cmd->add_option("--cores", args->cores,
                  "Cores to split between parallel runs (0 = this machine's); with --slurm, the CPUs of each run's "
                  "array task")
      ->capture_default_str();
  cmd->add_option("--dir", args->dir, "The sweep directory (default RUNS_DIR/NAME-sweep)");
  cmd->add_flag("--summary-only", args->summary_only, "Write the summary of the runs as they are; start nothing");
  cmd->add_flag("--slurm", args->slurm,
                "Submit the sweep as a Slurm job array: one array task per run not done, --cores CPUs each, at most "
                "--parallel at a time, then a summary job; options troupe does not know (--partition=P, --time=60, "
                "...) go to sbatch");
  cmd->allow_extras();
  cmd->add_option("--run-member", args->run_member, "(internal) run one member of a sweep in RUN_DIR")
      ->group("");
  cmd->callback([args, exit_code, cmd] {
    std::signal(SIGINT, OnSignal);
    std::signal(SIGTERM, OnSignal);
    // A child of a sweep: one run.
    if (!args->run_member.empty()) {
      if (absl::Status s = launch::RunSweepMember(args->run_member, &stop_requested); !s.ok()) *exit_code = Fail(s);
      return;
    }
    if (args->config.empty()) {
      *exit_code = Fail(absl::InvalidArgumentError("give a CONFIG file (e.g. configs/gan_fashion_mnist.textproto)"));
      return;
    }
    const std::vector<std::string> sbatch_options = cmd->remaining();
    if (!sbatch_options.empty() && !args->slurm) {
      *exit_code = Fail(absl::InvalidArgumentError(absl::StrCat(
          "unknown arguments: ", absl::StrJoin(sbatch_options, " "), " (sbatch options go after --slurm)")));
      return;
    }
    if (args->slurm) {
      const absl::Status s = args->summary_only
                                 ? absl::InvalidArgumentError("--slurm and --summary-only: give one of them")
                                 : launch::CheckSlurmSweepOptions(sbatch_options);
      if (!s.ok()) {
        *exit_code = Fail(s);
        return;
      }
    }
    // Every check before anything is created.
    auto grid = launch::ParseGrid(args->grid);
    if (!grid.ok()) {
      *exit_code = Fail(grid.status());
      return;
    }
    launch::SweepOptions options;
    options.config_path = args->config;
    options.overrides = args->overrides;
    options.grid = *grid;
    options.seeds = args->seeds;
    options.first_seed = args->first_seed;
    // Under Slurm every run has its array task's CPUs to itself.
    const int slurm_cpus = args->cores > 0 ? args->cores : static_cast<int>(std::thread::hardware_concurrency());
    options.parallel = args->slurm ? 1 : args->parallel;
    options.cores = args->slurm ? slurm_cpus : args->cores;
    options.sweep_dir = args->dir;
    auto plan = launch::PlanSweep(options);
    if (!plan.ok()) {
      *exit_code = Fail(plan.status());
      return;
    }
    auto log = [](const std::string& line) { std::fprintf(stderr, "troupe sweep: %s\n", line.c_str()); };
    absl::Status status;
    if (args->summary_only) {
      std::error_code ec;
      status = std::filesystem::is_directory(plan->sweep_dir, ec)
                   ? launch::WriteSweepSummary(*plan)
                   : absl::NotFoundError(absl::StrCat("--summary-only: no sweep directory ", plan->sweep_dir,
                                                      " (run the sweep first, or give its --dir)"));
    } else if (args->slurm) {
      // The summary job: this sweep again, with --summary-only.
      std::vector<std::string> summary = {SelfPath(), "sweep", std::filesystem::absolute(args->config).string()};
      for (const std::string& o : args->overrides) summary.insert(summary.end(), {"--set", o});
      for (const std::string& g : args->grid) summary.insert(summary.end(), {"--grid", g});
      summary.insert(summary.end(), {"--seeds", std::to_string(args->seeds), "--first-seed",
                                     std::to_string(args->first_seed), "--dir",
                                     std::filesystem::absolute(plan->sweep_dir).string(), "--summary-only"});
      auto jobs = launch::SubmitSweepToSlurm(*plan, args->parallel, slurm_cpus, {SelfPath(), "sweep", "--run-member"},
                                             summary, sbatch_options, log);
      status = jobs.status();
      if (jobs.ok() && jobs->runs > 0) {
        log(absl::StrCat("submitted job array ", jobs->array_job, " (", jobs->runs, " runs, ", slurm_cpus,
                         " CPUs each, at most ", args->parallel, " at a time) and summary job ",
                         jobs->summary_job.empty() ? "(refused)" : jobs->summary_job, "; squeue -j ",
                         jobs->array_job, " to watch, the same command again to resubmit what is not done"));
        return;
      }
    } else {
      status = launch::RunSweep(*plan, args->parallel, {SelfPath(), "sweep", "--run-member"}, &stop_requested, log);
    }
    if (!status.ok()) {
      *exit_code = Fail(status);
      return;
    }
    log(absl::StrCat(plan->runs.size(), " runs in ", plan->sweep_dir, "; summary: ", plan->sweep_dir,
                     "/summary.md, curves: ", plan->sweep_dir, "/curves.png"));
  });
}

}  // namespace troupe::cli
