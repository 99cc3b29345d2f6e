// One validator for a whole experiment config, run before anything is
// created: each section by the validator of the module that runs it.
#ifndef TROUPE_LAUNCH_EXPERIMENT_H_
#define TROUPE_LAUNCH_EXPERIMENT_H_

#include "absl/status/status.h"
#include "proto/config.pb.h"

namespace troupe::launch {

// OK when every section the config's mode runs is valid:
//   GAN:      gan (gan::ValidateGanConfig, its engine section included);
//   SCRIPTED: total_frames, env (the task's spec is read: no env is built),
//             pool;
//   RL:       the above, then actors, evaluator, d4pg against the env's
//             spec, learner (its engine section included).
// Then the device the engine section asks for must be on this machine.
// Errors: InvalidArgument (NotFound for an unknown task) naming the field,
// its value and what would be right; FailedPrecondition for a device that is
// not here (engine::CheckDeviceAvailable); the first one found.
absl::Status ValidateExperiment(const config::ExperimentConfig& config);

}  // namespace troupe::launch

#endif  // TROUPE_LAUNCH_EXPERIMENT_H_
