// `troupe report DIR`: one self-contained HTML page of a run, or of a
// directory of runs (a sweep: a folder whose subfolders are run
// directories), that a person opens in a browser. Everything but the videos
// is inside the file: curves as inline SVG, the metrics tables, the config;
// videos (videos/eval-FRAMES.mp4) are linked by relative path, so the page
// works where it is written (by default DIR/report.html) and moved with the
// runs.
//
// Read from each run directory (common/run_layout.h: the layout and the
// logs' columns): config.textproto, eval.csv, metrics.csv, episodes.csv,
// videos/*.mp4. Missing files are left out of the page.
#ifndef TROUPE_VIZ_REPORT_H_
#define TROUPE_VIZ_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/run_layout.h"

namespace troupe::viz {

// One run's summary line in a report.
struct RunSummary {
  std::string path;        // the run directory
  std::string name;        // its folder name
  std::string task;        // config env.task ("" if the config does not parse)
  std::string mode;        // "RL", "GAN", "SCRIPTED"
  int evaluations = 0;     // rows of eval.csv
  double final_eval = 0;   // eval.csv's last eval_return (or fid for GAN runs)
  double best_eval = 0;    // its best (highest return; lowest FID)
  double frames = 0;       // eval.csv's last frames
  std::string last_video;  // the newest videos/eval-*.mp4, "" if none
};

// Reads what a report says of run directory `path`. Errors: InvalidArgument
// if it has no config.textproto (not a run directory).
absl::StatusOr<RunSummary> SummarizeRun(const std::string& path);

// Writes the report of `dir` to `output` ("" = DIR/report.html) via a
// temporary file and rename. `dir` is a run directory (it has a
// config.textproto) or a directory of them (its subfolders with one, sorted
// by name). Returns the path written. Errors: NotFound for a missing `dir`;
// InvalidArgument naming `dir` when it is neither; PermissionDenied when the
// output cannot be written.
absl::StatusOr<std::string> WriteReport(const std::string& dir, const std::string& output = "");

}  // namespace troupe::viz

#endif  // TROUPE_VIZ_REPORT_H_
