// One validator for a whole experiment config, run before anything is
// created: each section by the validator of the module that runs it.
#ifndef TROUPE_LAUNCH_EXPERIMENT_H_
#define TROUPE_LAUNCH_EXPERIMENT_H_

#include "absl/status/status.h"
#include "proto/config.pb.h"

namespace troupe::launch {

// OK when every section the config's mode runs is valid:
//   all:      name (one plain path component), runs_dir (a directory or
//             nothing yet);
//   GAN:      gan (gan::ValidateGanConfig, its engine section included),
//             its step within this machine's memory, the data files there;
//   SCRIPTED: total_frames, env (the task's spec is read: no env is built;
//             render size within the model's offscreen buffer), pool (sync),
//             the pool's buffers within memory;
//   RL:       total_frames, env, pool, then actors (and every actor's pool
//             within memory), evaluator, the agent's settings against the
//             env's spec, learner (its engine section included), the
//             agent's step within memory, replay (replay::ValidateReplayConfig; no table needed).
// Then the device the engine section asks for must be on this machine.
// Nothing is created, bound or allocated beyond the config's own size: a
// config that passes cannot fail later for a reason checked here.
// Errors: InvalidArgument (NotFound for an unknown task or missing file)
// whose message starts with the field path ("learner.batch_size 10: ..."),
// so that ConfigSource::Locate can say where it was set; FailedPrecondition
// for a device that is not here (engine::CheckDeviceAvailable); the first
// one found.
absl::Status ValidateExperiment(const config::ExperimentConfig& config);

}  // namespace troupe::launch

#endif  // TROUPE_LAUNCH_EXPERIMENT_H_
