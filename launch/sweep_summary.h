// A sweep's summary over seeds: runs.csv, summary.csv, summary.md and
// curves.png in the sweep directory (sweep_plan.h says what each holds).
#ifndef TROUPE_LAUNCH_SWEEP_SUMMARY_H_
#define TROUPE_LAUNCH_SWEEP_SUMMARY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "launch/sweep_plan.h"

namespace troupe::launch {

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

#endif  // TROUPE_LAUNCH_SWEEP_SUMMARY_H_
