// Sweeps: one experiment config run over the cross product of a grid of
// field values and seeds, each grid point and seed a normal run directory
// under one sweep directory, then a summary over seeds.
//
// This file: the grid, the plan (every run resolved and checked before
// anything is created) and the sweep directory it writes down. The runs go
// on this machine (sweep_local.h) or as a Slurm job array (sweep_slurm.h),
// each run one member (sweep_member.h); sweep_summary.h writes the summary.
//
//   troupe sweep CONFIG --grid gan.batch_size=64,256 --grid gan.lr_scaling=LINEAR,SQRT --seeds 2 --parallel 2
//
// Sweep directory (SweepPlan::sweep_dir; default RUNS_DIR/NAME-sweep, so that
// the same command reruns into the same place):
//   sweep.txt          the fields swept, the seeds, and one line per run
//   RUN/               one per grid point and seed, named for its values,
//                      e.g. "batch_size-64__lr_scaling-SQRT__seed-0": a
//                      normal run directory (config.textproto, eval.csv,
//                      metrics.csv, checkpoints/, ...) plus
//     log.txt          the run's stdout and stderr (appended per attempt)
//     done             written when the run reached its budget
//   runs.csv           run, point, seed, done, x_final, final, best
//   summary.csv        one row per grid point: its values, seeds done, mean
//                      and spread (sample standard deviation) over seeds of
//                      the final and the best metric
//   summary.md         the same as a Markdown table
//   curves.png         the metric against images (GAN) or env frames (RL),
//                      one line per grid point (the mean over its seeds) with
//                      its band (the lowest and highest seed, in a lighter
//                      shade)
// The metric: classifier-FID for GANs (lower is better; eval.csv column 3),
// the evaluator's return for RL (higher is better; eval.csv column 3).
//
// Resumable: a rerun skips runs that have `done`, resumes runs with a
// checkpoint, and starts the others afresh (clearing what an attempt killed
// before its first checkpoint left). A rerun whose config for an existing
// run differs (other than in its thread count) is refused.
#ifndef TROUPE_LAUNCH_SWEEP_PLAN_H_
#define TROUPE_LAUNCH_SWEEP_PLAN_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/config.pb.h"

namespace troupe::launch {

// One `--grid path.to.field=v1,v2,...`; or several fields stepped together,
// `--grid gan.batch_size:gan.total_images=64:128000,256:512000` (each value
// one entry per field, ':'-separated): what "at equal steps" needs.
struct GridAxis {
  std::string field;                // "gan.batch_size" or "gan.batch_size:gan.total_images"
  std::vector<std::string> values;  // "64" or "64:128000"
};

// The "field=value" overrides of one value of `axis`.
std::vector<std::string> AxisAssignments(const GridAxis& axis, const std::string& value);

// Parses `--grid` arguments. Errors: InvalidArgument naming the argument for
// one without '=', an empty field, an empty list or an empty value ("a=1,,2"),
// a value with another count of ':'-parts than the fields, a value given
// twice, a field given in two --grid. Field names and values are checked
// against the schema by PlanSweep.
absl::StatusOr<std::vector<GridAxis>> ParseGrid(const std::vector<std::string>& arguments);

struct SweepOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // `--set`, applied before the grid
  std::vector<GridAxis> grid;
  int seeds = 1;     // seed i adds i to the engine's seed (and to env.seed for RL)
  // The first seed index: seeds first_seed .. first_seed + seeds - 1 (more
  // seeds for a finished study, or a study's seeds split between machines).
  int first_seed = 0;
  int parallel = 1;  // runs at a time on this machine
  // Cores split between the `parallel` runs: a run whose engine.threads is 0
  // (all cores) gets max(1, cores / parallel). 0 = this machine's cores.
  int cores = 0;
  std::string sweep_dir;  // empty: RUNS_DIR/NAME-sweep
};

struct SweepRun {
  std::string name;                      // directory name under the sweep directory
  std::string point;                     // "gan.batch_size=64,gan.lr_scaling=SQRT" ("base" for no grid)
  std::vector<std::string> assignments;  // the point's "field=value"s
  int seed = 0;                          // index, first_seed .. first_seed + seeds - 1
  std::string run_dir;
  config::ExperimentConfig config;  // resolved: base, --set, the point, the seed, the threads
};

struct SweepPlan {
  std::string sweep_dir;
  config::ExperimentConfig::Mode mode = config::ExperimentConfig::GAN;
  std::vector<GridAxis> grid;
  int seeds = 1;
  int first_seed = 0;
  std::vector<SweepRun> runs;  // grid points in order (last axis fastest), seeds innermost
};

// Resolves and checks every run before anything is created: the config file
// and overrides (LoadExperimentConfigWithSource), each grid value applied to
// the config (an unknown field or a value that does not parse is refused
// naming the --grid), each run's whole config (ValidateExperiment, the error
// naming the grid point), the mode (GAN or RL: a SCRIPTED run has no metric),
// seeds and parallel >= 1, and existing run directories against their config.
// Creates nothing. Errors: InvalidArgument / NotFound / FailedPrecondition
// as ValidateExperiment, each saying which --grid or point.
absl::StatusOr<SweepPlan> PlanSweep(const SweepOptions& options);

// Writes the plan into its directory: makes the sweep directory, sweep.txt
// and each new run's directory and config.textproto, and (GAN) trains the
// FID classifier once where a run needs one that is missing, so that
// parallel runs do not each train (and write) it. Returns the runs not done
// yet, in plan order; `log` hears one line per run skipped as done and per
// classifier trained. Errors: PermissionDenied for a directory that cannot
// be made; those of writing a file or training the classifier.
absl::StatusOr<std::vector<const SweepRun*>> PrepareSweep(const SweepPlan& plan,
                                                          const std::function<void(const std::string&)>& log);

// Whether the run in `run_dir` reached its budget (RUN_DIR/done exists).
bool SweepRunDone(const std::string& run_dir);

// Whether the run in `run_dir` has a checkpoint to resume from: a committed
// generation, or the one file of the layout before them.
bool SweepRunHasCheckpoint(const std::string& run_dir, config::ExperimentConfig::Mode mode);

// The file a run directory holds once its run reached its budget.
inline constexpr char kSweepDoneFile[] = "done";

}  // namespace troupe::launch

#endif  // TROUPE_LAUNCH_SWEEP_PLAN_H_
