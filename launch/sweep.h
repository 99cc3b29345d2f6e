// Sweeps: one experiment config run over the cross product of a grid of
// field values and seeds, each grid point and seed a normal run directory
// under one sweep directory, then a summary over seeds.
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
#ifndef TROUPE_LAUNCH_SWEEP_H_
#define TROUPE_LAUNCH_SWEEP_H_

#include <atomic>
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

// The runs of `plan` not done yet, `parallel` at a time, each as a child
// process `runner... RUN_DIR` (the CLI passes `troupe sweep --run-member`)
// with its output appended to RUN_DIR/log.txt; writes sweep.txt and each new
// run's config.textproto first (and, for GANs, trains the FID classifier
// once when its checkpoint is missing), and the summary after every run
// that ends.
// Blocks until every run ended or *stop; on stop, sends SIGTERM to the
// running children (they checkpoint) and waits for them. `log` hears one line
// per run started, skipped or ended. Errors: Cancelled when stopped (rerun to
// resume); Internal naming the runs that failed (the others still ran);
// PermissionDenied for a directory that cannot be written.
absl::Status RunSweep(const SweepPlan& plan, int parallel, const std::vector<std::string>& runner,
                      const std::atomic<bool>* stop, const std::function<void(const std::string&)>& log);

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

// What one child of RunSweep does: reads RUN_DIR/config.textproto, resumes
// from RUN_DIR/checkpoints when there is one (else clears everything but the
// config), trains (gan::RunGan or RunRlExperiment) until the budget or
// *stop, and writes RUN_DIR/done when the budget was reached. Errors: those
// of the run.
absl::Status RunSweepMember(const std::string& run_dir, const std::atomic<bool>* stop);

// One run's metric curve as its eval.csv has it (x: images or env frames),
// rows a resumed run evaluated twice taken from the later attempt.
struct RunCurve {
  std::vector<double> x, y;
  bool done = false;
};
RunCurve ReadRunCurve(const std::string& run_dir);

// Writes runs.csv, summary.csv, summary.md and curves.png for the runs as
// they are now (runs without an evaluation are listed with no metric).
// Errors: PermissionDenied naming a file that cannot be written.
absl::Status WriteSweepSummary(const SweepPlan& plan);

}  // namespace troupe::launch

#endif  // TROUPE_LAUNCH_SWEEP_H_
