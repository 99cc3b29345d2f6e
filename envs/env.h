// Environments: a control task stepped by MuJoCo, observed as a named state
// vector and/or rendered pixels, with the wrappers a pixel agent needs
// (action repeat, frame stacking). Envs are single-threaded; a pool
// (envs/env_pool.h) owns the threads.
#ifndef TROUPE_ENVS_ENV_H_
#define TROUPE_ENVS_ENV_H_

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "envs/model.h"
#include "envs/renderer.h"
#include "envs/task.h"
#include "proto/config.pb.h"

namespace troupe::envs {

// Where in an episode a timestep is (dm_env's FIRST/MID/LAST).
enum class StepType : uint8_t { kFirst = 0, kMid = 1, kLast = 2 };

struct TimeStep {
  StepType step_type = StepType::kFirst;
  float reward = 0;    // 0 on kFirst; per control step in [0, 1], summed over action repeats
  float discount = 1;  // 1: control tasks end by time limit (or physics error), never by termination
};

// Shapes and ranges of what an env takes and gives.
struct EnvSpec {
  std::string task;
  std::vector<ObservationField> state_fields;
  int state_size = 0;  // sum of state_fields sizes
  // Pixels: height x width x channels uint8, rows top-down, channels =
  // 3 * frame_stack (frames oldest first). All 0 when pixels are off.
  int height = 0;
  int width = 0;
  int channels = 0;
  int action_size = 0;
  std::vector<float> action_minimum;
  std::vector<float> action_maximum;
  int episode_steps = 0;  // agent steps per episode (control steps / action repeat, rounded up)
  int action_repeat = 1;

  size_t pixel_bytes() const { return size_t(height) * width * channels; }
};

struct EnvOptions {
  std::string task = "cartpole.swingup";
  uint64_t seed = 0;
  bool pixels = true;  // render pixel observations (the state vector is always available)
  RenderOptions render;
  std::string camera;  // empty: the task's pixel camera
  bool multisample = false;
  int action_repeat = 1;
  int frame_stack = 1;

  // From the experiment config's env section; Validate()d.
  static absl::StatusOr<EnvOptions> FromConfig(const config::EnvConfig& config);
  // InvalidArgument naming the field if anything is out of range, NotFound
  // (listing the known tasks) for an unknown task.
  absl::Status Validate() const;
};

// Caller-owned buffers an env writes an observation into. A null pointer
// means "don't produce this" (e.g. no render on inner action repeats).
struct ObservationBuffers {
  float* state = nullptr;     // spec().state_size floats
  uint8_t* pixels = nullptr;  // spec().pixel_bytes() bytes
};

// The environment interface every layer implements.
class Environment {
 public:
  virtual ~Environment() = default;
  virtual const EnvSpec& spec() const = 0;

  // Starts a new episode (initial state drawn from the env's seeded random
  // stream) and writes its first observation. Returns kFirst.
  virtual absl::StatusOr<TimeStep> Reset(ObservationBuffers out) = 0;

  // Applies `action` (spec().action_size values, clipped to the spec) and
  // writes the next observation. Errors, with the env left as it was:
  // InvalidArgument for a wrong size or a NaN/inf value (naming the index);
  // FailedPrecondition if the episode has ended or was never Reset.
  virtual absl::StatusOr<TimeStep> Step(std::span<const float> action, ObservationBuffers out) = 0;

  // Writes the current observation again (no stepping).
  virtual absl::Status Observe(ObservationBuffers out) = 0;

  // Episodes ended early by a physics blow-up (NaN/huge accelerations),
  // counted since creation. Such an episode ends with kLast and reward 0.
  virtual int64_t physics_errors() const = 0;

  // The innermost physics, read-only (viewers, tests, controllers).
  virtual const mjModel* model() const = 0;
  virtual const mjData* data() const = 0;
  virtual const Task& task() const = 0;
};

// Where a pool's env is in its episode, kept beside it by whoever steps it.
struct EpisodeProgress {
  int32_t episode_step = 0;  // agent steps since the episode's reset
  bool needs_reset = true;   // the episode ended (or never started)
};

// One pool step of `env`: a reset if `reset` is set or its episode has ended
// (the action is ignored and the result is kFirst), else a step with
// `action` (spec().action_size values). An error ends the episode: the
// result is kLast with reward 0, and the error is stored in `*error`
// (which is left alone otherwise).
TimeStep AdvanceEnv(Environment& env, EpisodeProgress& progress, bool reset, const float* action,
                    ObservationBuffers out, absl::Status* error);

// Builds the env `options` describe: the task's ControlEnv, then
// ActionRepeat if action_repeat > 1, then FrameStack if pixels and
// frame_stack > 1. `model` may be shared across envs of one task (a pool
// does); null loads the task's model (with options.multisample).
absl::StatusOr<std::unique_ptr<Environment>> MakeEnv(const EnvOptions& options,
                                                     std::shared_ptr<const Model> model = nullptr);

// The spec of the env MakeEnv(options) would build, without building it: the
// task's model is loaded and the task bound (no mjData, no renderer). Errors
// as MakeEnv's, except renderer errors (nothing is rendered).
absl::StatusOr<EnvSpec> DescribeEnv(const EnvOptions& options);
// The same for an experiment config's env section (EnvOptions::FromConfig).
absl::StatusOr<EnvSpec> DescribeEnv(const config::EnvConfig& config);

// Loads the model of `task` from AssetsDir(). Errors as Model::Load, plus
// NotFound for an unknown task.
absl::StatusOr<std::shared_ptr<const Model>> LoadTaskModel(const std::string& task, bool multisample);

}  // namespace troupe::envs

#endif  // TROUPE_ENVS_ENV_H_
