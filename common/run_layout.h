// The run directory's one owner: its layout (every path in a run directory
// is derived here, and its file names are spelled only here), the schemas of
// its logs (metrics.csv / metrics.jsonl, eval.csv, episodes.csv of each mode)
// with typed rows, their writer (the header once, then whole rows appended),
// the resume cut (a resumed run drops the rows past its checkpoint), and the
// reader. docs/running.md describes the same layout and columns; the Python
// package takes its file names from RunFileNames (python/run_bindings.cc).
//
//   RUN_DIR/config.textproto          the resolved config (troupe run, sweeps, Slurm)
//   RUN_DIR/launch.txt                how the run was started: "KEY VALUE" lines
//   RUN_DIR/status.txt                the status line, then "updated UNIX_SECONDS"
//   RUN_DIR/learner.address           the learner's HOST:PORT
//   RUN_DIR/metrics.csv, .jsonl       RL: RlMetricsRow; GAN: GanMetricsRow (CSV only)
//   RUN_DIR/eval.csv                  RL: RlEvalRow; GAN: GanEvalRow
//   RUN_DIR/episodes.csv              scripted runs: EpisodeRow
//   RUN_DIR/learning_curve.png        RL; fid_curve.png, samples.png, samples/samples-N.png GAN;
//                                     returns.png scripted
//   RUN_DIR/checkpoints/generation-N/ agent.ckpt, counters.txt, replay.ckpt (common/generations.h;
//                                     a run from before generations has them in checkpoints/)
//   RUN_DIR/logs/actor-N.log          each actor's output
//   RUN_DIR/videos/eval-FRAMES.mp4    the first episode of the evaluation at FRAMES
//   RUN_DIR/slurm/                    troupe run --slurm: job.sh, job-JOBID.out, jobs.txt
//   RUN_DIR/secrets/                  troupe run --slurm: the job's token (owner only)
//   RUN_DIR/report.html               troupe report
#ifndef TROUPE_COMMON_RUN_LAYOUT_H_
#define TROUPE_COMMON_RUN_LAYOUT_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/files.h"

namespace troupe {

// The names of a run directory's files and folders.
inline constexpr char kConfigFile[] = "config.textproto";
inline constexpr char kLaunchFile[] = "launch.txt";
inline constexpr char kStatusFile[] = "status.txt";
inline constexpr char kLearnerAddressFile[] = "learner.address";
inline constexpr char kMetricsCsvFile[] = "metrics.csv";
inline constexpr char kMetricsJsonlFile[] = "metrics.jsonl";
inline constexpr char kEvalCsvFile[] = "eval.csv";
inline constexpr char kEpisodesCsvFile[] = "episodes.csv";
inline constexpr char kLearningCurveFile[] = "learning_curve.png";
inline constexpr char kFidCurveFile[] = "fid_curve.png";
inline constexpr char kReturnsFile[] = "returns.png";
inline constexpr char kSamplesFile[] = "samples.png";
inline constexpr char kSamplesFolder[] = "samples";
inline constexpr char kReportFile[] = "report.html";
inline constexpr char kCheckpointsFolder[] = "checkpoints";
inline constexpr char kLogsFolder[] = "logs";
inline constexpr char kVideosFolder[] = "videos";
inline constexpr char kSlurmFolder[] = "slurm";
inline constexpr char kSecretsFolder[] = "secrets";  // the security token of a Slurm job (owner only)
// troupe run --slurm's files in slurm/: the job script, the ids of the jobs
// submitted (one a line), and each job's output (job-JOBID.out).
inline constexpr char kSlurmScriptFile[] = "job.sh";
inline constexpr char kSlurmJobsFile[] = "jobs.txt";
// A checkpoint's files (one generation of checkpoints/): the RL learner's
// agent, its replay, and the counters file of either mode.
inline constexpr char kAgentCheckpointFile[] = "agent.ckpt";
inline constexpr char kReplayCheckpointFile[] = "replay.ckpt";
inline constexpr char kCountersFile[] = "counters.txt";

// Every name above as (key, file name): the Python package's one source of
// them (troupe.runs.FILES).
std::vector<std::pair<std::string, std::string>> RunFileNames();

// The paths of one run directory.
class RunLayout {
 public:
  explicit RunLayout(std::string dir) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }
  // DIR/NAME.
  std::string File(const char* name) const { return dir_ + "/" + name; }

  std::string config() const { return File(kConfigFile); }
  std::string launch() const { return File(kLaunchFile); }
  std::string status() const { return File(kStatusFile); }
  std::string learner_address() const { return File(kLearnerAddressFile); }
  std::string metrics_csv() const { return File(kMetricsCsvFile); }
  std::string metrics_jsonl() const { return File(kMetricsJsonlFile); }
  std::string eval_csv() const { return File(kEvalCsvFile); }
  std::string episodes_csv() const { return File(kEpisodesCsvFile); }
  std::string learning_curve() const { return File(kLearningCurveFile); }
  std::string fid_curve() const { return File(kFidCurveFile); }
  std::string returns_plot() const { return File(kReturnsFile); }  // a scripted run's
  std::string samples() const { return File(kSamplesFile); }  // the latest GAN sample grid
  std::string samples_folder() const { return File(kSamplesFolder); }
  std::string report() const { return File(kReportFile); }
  std::string checkpoints() const { return File(kCheckpointsFolder); }
  std::string logs() const { return File(kLogsFolder); }
  std::string videos() const { return File(kVideosFolder); }
  std::string slurm() const { return File(kSlurmFolder); }
  std::string secrets() const { return File(kSecretsFolder); }
  std::string slurm_script() const { return slurm() + "/" + kSlurmScriptFile; }
  std::string slurm_jobs() const { return slurm() + "/" + kSlurmJobsFile; }
  // slurm/job-JOB_ID.out (JOB_ID "%j": sbatch's own placeholder for it).
  std::string slurm_output(const std::string& job_id) const;
  // logs/actor-INDEX.log.
  std::string actor_log(int index) const;
  // videos/eval-FRAMES.mp4: the evaluation video at FRAMES env frames.
  std::string eval_video(int64_t frames) const;
  // samples/samples-NNNNNNNNN.png: the GAN sample grid at `images` images
  // (zero-padded, so the largest name is the newest).
  std::string samples_at(int64_t images) const;
  // Whether `dir` looks like a run directory: it has a config.textproto.
  bool HasConfig() const;
  // The newest checkpoint's file that marks it (the RL learner's
  // agent.ckpt; with `gan`, a GAN run's counters.txt), in a committed
  // generation or the layout before generations; "" when the run has none
  // (common/generations.h's NewestCheckpointFile).
  std::string NewestCheckpoint(bool gan = false) const;

 private:
  std::string dir_;
};

// The frames of an evaluation video's path (.../eval-FRAMES.mp4), nullopt
// for another name.
std::optional<int64_t> EvalVideoFrames(const std::string& path);

// One column of a run log: its name and how its numbers are printed
// (decimals; kSignificant: 6 significant digits, %.6g). `csv` false: the
// column is in the JSON lines only.
struct LogColumn {
  static constexpr int kSignificant = -1;
  const char* name;
  int decimals;
  bool csv = true;
};

// A run log: its CSV file, its JSON lines twin (nullptr: none), the column
// that measures progress (frames, images; the resume cut reads it), and the
// columns in order.
struct LogSchema {
  const char* csv_file;
  const char* jsonl_file;
  const char* progress;
  std::span<const LogColumn> columns;
  // The CSV's column names (those with `csv`), in order.
  std::vector<std::string> CsvColumns() const;
  // The CSV header line ("a,b,c\n").
  std::string Header() const;
};

// The typed rows of each log, with their schema; Values() lists the fields
// in the schema's column order.
struct RlMetricsRow {  // the RL learner's metrics.csv and metrics.jsonl
  // The platform's columns with the agent's own after samples_per_insert:
  // `agent_columns`, the names of its metrics (agents::Agent::metric_names:
  // a critic's loss, say). One schema per list, made once
  // and kept for the process's life; thread-safe.
  static const LogSchema& Schema(std::span<const std::string> agent_columns);
  // The platform's columns alone (an agent without metrics of its own).
  static const LogSchema& Schema() { return Schema({}); }
  std::vector<double> Values() const;
  double seconds = 0;  // wall time over all of the run's pieces
  int64_t frames = 0, updates = 0;
  double updates_per_s = 0, frames_per_s = 0;
  int64_t replay_size = 0;
  double samples_per_insert = 0;
  std::vector<double> agent;  // the agent's metrics, in its schema's agent column order
  double eval_return = -1;  // the last evaluation's; -1 before the first
  int64_t parameter_version = 0;
  double checkpoint_s = 0;  // metrics.jsonl only
  double input_wait_ms = 0, frames_uploaded_per_update = 0;
  // Per update, what the device sat idle between executions waiting for
  // the host (Backend::device_idle_seconds: PJRT; 0 where none is measured).
  double device_idle_ms = 0;
};
struct RlEvalRow {  // the RL learner's eval.csv
  static const LogSchema& Schema();
  std::vector<double> Values() const;
  int64_t frames = 0, updates = 0;
  double eval_return = 0, actions_at_bound = 0;
};
struct GanMetricsRow {  // a GAN run's metrics.csv
  static const LogSchema& Schema();
  std::vector<double> Values() const;
  double seconds = 0;
  int64_t images = 0, steps = 0;
  double images_per_s = 0, d_loss = 0, g_loss = 0, d_lr = 0, g_lr = 0;
};
struct GanEvalRow {  // a GAN run's eval.csv
  static const LogSchema& Schema();
  std::vector<double> Values() const;
  int64_t images = 0, steps = 0;
  double classifier_fid = 0, classifier_score = 0, seconds = 0;
};
struct EpisodeRow {  // a scripted run's episodes.csv
  static const LogSchema& Schema();
  std::vector<double> Values() const;
  int64_t episode = 0, env = 0, frames = 0;
  double episode_return = 0, seconds = 0;
};

// The writer of one run log (AppendLog underneath: whole rows or none, a
// failing disk warned about and the run going on). The CSV's header is
// written once, when the file is empty; a file that already has a header
// (a resumed run, maybe of an older troupe with fewer columns) gets rows of
// its header's columns, in its order, so every row matches the header above
// it (a column the writer does not know stays empty; the difference is said
// once on stderr). Not thread-safe: one thread appends to one log.
class RunLog {
 public:
  RunLog(const RunLayout& run, const LogSchema& schema);
  // Appends one row: `values` in the schema's column order (all of them,
  // JSON-only ones included). Whether the CSV row was written.
  bool Append(std::span<const double> values);
  // Writes the CSV's header now when the file has none, so that a log that
  // may get no row still names its columns. Errors: AppendToFile's.
  absl::Status WriteHeader();
  // The resume cut: drops every row whose progress is past `limit` (or
  // cannot be read, or was cut off by a killed writer) from the CSV file
  // and its JSON lines (DropRowsPast), the CSV's progress column found by
  // name in its header. Returns the progress of each CSV row dropped, in
  // order (NaN for one that could not be read); errors name the file.
  absl::StatusOr<std::vector<double>> DropRowsPast(double limit);

 private:
  // The CSV row of `values` for the file's header (read at the first append).
  std::string CsvRow(std::span<const double> values);

  const LogSchema* schema_;
  AppendLog csv_, jsonl_;
  // For each column of the file's header, the schema column it is (-1:
  // unknown); set at the first Append.
  std::optional<std::vector<int>> file_columns_;
};

// RunLog for one row type.
template <typename Row>
class RowLog : public RunLog {
 public:
  explicit RowLog(const RunLayout& run) : RunLog(run, Row::Schema()) {}
  RowLog(const RunLayout& run, const LogSchema& schema) : RunLog(run, schema) {}
  bool Append(const Row& row) { return RunLog::Append(row.Values()); }
};

// A CSV file of a run as text cells, numbers parsed where they are numbers.
struct CsvTable {
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;  // complete lines only
  // The index of column `name` in the header, -1 when there is none.
  int Index(const std::string& name) const;
  // The column called `name`, as numbers (NaN where a cell is not one);
  // empty if there is no such column.
  std::vector<double> Column(const std::string& name) const;
  // The rows' (x, y) from columns `x` and `y` where both cells are numbers,
  // in row order (a curve; empty when a column is missing).
  std::vector<std::pair<double, double>> Points(const std::string& x, const std::string& y) const;
};

// Reads the CSV at `path`. A last line without its newline (a row being
// written) is skipped, and so are empty lines. Errors: NotFound for a
// missing file.
absl::StatusOr<CsvTable> ReadCsvTable(const std::string& path);

// "KEY VALUE" lines (launch.txt, counters.txt) as key -> value (the rest of
// the line); empty for a missing file.
std::map<std::string, std::string> ReadKeyValues(const std::string& path);

// The `seconds` (first column) of the last whole row of a run's metrics
// CSV; 0 when the file is missing or has no such row. A resumed run starts
// its clock from it, so a run's seconds count all of its pieces.
double LastRunSeconds(const std::string& metrics_csv);

// The last whole row of a CSV file as column name -> cell, read from its
// header line and its last 64 KB (for a log that grows all run, polled
// while it runs); empty when the file is missing or has no whole row.
std::map<std::string, std::string> LastCsvRow(const std::string& path);

// When the clock of the run in `run` started: now, less the seconds its
// metrics.csv already counts when `resume` (LastRunSeconds).
std::chrono::steady_clock::time_point RunClockStart(const RunLayout& run, bool resume);

}  // namespace troupe

#endif  // TROUPE_COMMON_RUN_LAYOUT_H_
