// A control task: what a domain's MJCF model is asked to do. A Task binds to
// an immutable mjModel, sets up each episode's initial state, writes the
// named state observation and computes the reward. It holds no mutable
// per-episode state of its own beyond what it reads from mjData, so one Env
// owns one Task and nothing is shared between threads.
#ifndef TROUPE_ENVS_TASK_H_
#define TROUPE_ENVS_TASK_H_

#include <mujoco/mujoco.h>

#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace troupe::envs {

// One named slice of the state observation vector.
struct ObservationField {
  std::string name;
  int size = 0;
};

class Task {
 public:
  virtual ~Task() = default;

  // Looks up the joints, bodies, sites, etc. this task reads, by name.
  // Returns NotFound naming the missing element (and the model file) if the
  // model lacks one. Called once, before anything else.
  virtual absl::Status Bind(const mjModel* model) = 0;

  // Sets qpos/qvel (and anything else) for a new episode, drawing all
  // randomness from `rng`. `data` has just been reset with mj_resetData; the
  // env calls mj_forward afterwards.
  virtual void InitializeEpisode(const mjModel* model, mjData* data, std::mt19937_64& rng) = 0;

  // The fields of the state observation, in the order Observe writes them.
  virtual std::vector<ObservationField> ObservationSpec() const = 0;

  // Writes the state observation (the sum of the field sizes, as float).
  // `data` has consistent derived quantities (positions, sensors).
  virtual void Observe(const mjModel* model, const mjData* data, float* out) const = 0;

  // The reward of the current state and the last control, in [0, 1].
  virtual double Reward(const mjModel* model, const mjData* data) const = 0;

  // A hand-written controller (e.g. energy-based swing-up + LQR) writing
  // model->nu actions in the action spec. Returns false where the task has
  // none. Used by tests and by `troupe run` without a learner.
  virtual bool Controller(const mjModel* model, const mjData* data, double* action) const { return false; }
};

// What the registry knows of a task.
struct TaskInfo {
  std::string name;              // "domain.task", e.g. "cartpole.swingup"
  std::string model_file;        // MJCF file in envs/assets/, e.g. "cartpole.xml"
  int control_substeps = 1;      // physics steps (model timestep) per control step
  int episode_steps = 1000;      // control steps per episode
  std::string pixel_camera;      // the fixed camera pixels are rendered from
  std::function<std::unique_ptr<Task>()> make;
};

// Every task troupe knows, in a fixed order.
const std::vector<TaskInfo>& Tasks();

// The task called `name`, or NotFound listing every known task name.
absl::StatusOr<const TaskInfo*> FindTask(std::string_view name);

// The folder holding the MJCF models: $TROUPE_ASSETS_DIR if set, else
// ProjectPath("envs/assets") (common/files.h: the source tree's, or a
// relocated bundle's).
std::string AssetsDir();

}  // namespace troupe::envs

#endif  // TROUPE_ENVS_TASK_H_
