// `troupe run` for RL on one machine: the learner (replay embedded) in this
// process, N actor processes (`troupe actor`) started from this binary, an
// actor that dies restarted (up to actors.max_restarts each), one live status
// line, and Ctrl-C stopping everything cleanly with a final checkpoint.
//
// Run directory: config.textproto (resolved), metrics.csv/jsonl, eval.csv,
// learning_curve.png, logs/actor-N.log, checkpoints/.
#ifndef TROUPE_CLI_LAUNCHER_H_
#define TROUPE_CLI_LAUNCHER_H_

#include <atomic>
#include <string>

#include "absl/status/status.h"
#include "proto/config.pb.h"

namespace troupe::cli {

// Runs until total_frames / max_updates or *stop. `run_dir` exists and holds
// config.textproto; with `resume`, training continues from its checkpoint.
// Errors: config errors naming the field, "port in use", learner errors.
absl::Status RunRlExperiment(const config::ExperimentConfig& config, const std::string& run_dir, bool resume,
                             const std::atomic<bool>* stop);

}  // namespace troupe::cli

#endif  // TROUPE_CLI_LAUNCHER_H_
