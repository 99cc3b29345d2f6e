// An actor with a scripted policy (a task's hand-written controller, zero,
// or uniform random actions) stepping a batched env pool: what `troupe run`
// does until a learner is in the loop. Prints a live status line and writes
// a run directory: the resolved config, episodes.csv (one row per finished
// episode), returns.png (the returns against env frames) and frames.png
// (the pixel observations of env 0 at the end).
#ifndef TROUPE_ACTORS_SCRIPTED_ACTOR_H_
#define TROUPE_ACTORS_SCRIPTED_ACTOR_H_

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/config.pb.h"

namespace troupe::actors {

// The scripted policies (policy.kind): the task's hand-written controller
// (random where the task has none), zero actions, or uniform random actions.
using ScriptedPolicyKind = config::ScriptedPolicyConfig::Kind;

// A kind as a command line gives it: "controller", "zero" or "random" (any
// case); InvalidArgument naming `field` and the choices otherwise.
absl::StatusOr<ScriptedPolicyKind> ParseScriptedPolicyKind(const std::string& kind, const std::string& field);

struct ScriptedRunResult {
  std::string run_dir;
  int64_t frames = 0;               // env frames: control steps, summed over envs
  std::vector<double> returns;      // finished episodes, in order
  double frames_per_second = 0;
  int64_t physics_errors = 0;
};

// Runs `config` until config.total_frames env frames or until *stop turns
// true (Ctrl-C). Errors: config errors naming the field, env errors, and
// PermissionDenied if the run directory cannot be written.
absl::StatusOr<ScriptedRunResult> RunScripted(const config::ExperimentConfig& config, const std::atomic<bool>* stop);

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_SCRIPTED_ACTOR_H_
