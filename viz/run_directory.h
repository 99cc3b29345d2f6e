// What the viewer finds in a run directory (`troupe run` writes one):
// the resolved config, the metrics files, and the checkpoints.
//
// The layout is common/run_layout.h's. Checkpoints read here: each
// committed generation's agent.ckpt (common/generations.h), and
// checkpoints/agent*.ckpt put there by hand or by a run from before
// generations. The newest by modification time is the default; replay.ckpt
// and the counters beside them are not policies.
#ifndef TROUPE_VIZ_RUN_DIRECTORY_H_
#define TROUPE_VIZ_RUN_DIRECTORY_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/config.pb.h"

namespace troupe::viz {

struct RunDirectory {
  std::string path;
  config::ExperimentConfig config;
  std::vector<std::string> checkpoints;  // oldest first; may be empty
  std::string latest_checkpoint() const { return checkpoints.empty() ? "" : checkpoints.back(); }
};

// Reads `path`'s config and lists its checkpoints. Errors, each naming the
// directory: NotFound if it does not exist; InvalidArgument if it is not a
// directory or has no config.textproto (not a run directory); PermissionDenied
// if it cannot be read; the config parser's error (file:line:column).
absl::StatusOr<RunDirectory> OpenRunDirectory(const std::string& path);

// The checkpoint `troupe view RUN_DIR` loads: `explicit_path` if given (NotFound
// if that file is missing), else the run's newest. FailedPrecondition naming
// the directory and the files it looked for if there is none.
absl::StatusOr<std::string> ChooseCheckpoint(const RunDirectory& run, const std::string& explicit_path);

}  // namespace troupe::viz

#endif  // TROUPE_VIZ_RUN_DIRECTORY_H_
