// troupe sweep CONFIG --grid field=v1,v2,... [--grid ...] [--seeds N] [--parallel P] [--dir DIR]
// (launch/sweep.h says what the sweep directory holds).
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "cli/commands.h"
#include "launch/sweep.h"

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
  cmd->add_option("--parallel", args->parallel, "Runs at a time on this machine, the cores split between them")
      ->capture_default_str();
  cmd->add_option("--cores", args->cores, "Cores to split between parallel runs (0 = this machine's)")
      ->capture_default_str();
  cmd->add_option("--dir", args->dir, "The sweep directory (default RUNS_DIR/NAME-sweep)");
  cmd->add_flag("--summary-only", args->summary_only, "Write the summary of the runs as they are; start nothing");
  cmd->add_flag("--slurm", args->slurm, "Submit the sweep as a Slurm job array (not available yet)");
  cmd->add_option("--run-member", args->run_member, "(internal) run one member of a sweep in RUN_DIR")
      ->group("");
  cmd->callback([args, exit_code] {
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
    if (args->slurm) {
      *exit_code = Fail(absl::InvalidArgumentError(
          "--slurm: submitting a sweep as a Slurm job array is not implemented yet (it waits for troupe's Slurm "
          "launcher); run it here with --parallel P, or submit one `troupe sweep` job per node"));
      return;
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
    options.parallel = args->parallel;
    options.cores = args->cores;
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
