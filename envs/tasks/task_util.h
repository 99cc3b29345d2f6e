// Helpers the domain tasks share: binding element names to ids with errors
// that name the model file, and dm_control-style joint randomization.
#ifndef TROUPE_ENVS_TASKS_TASK_UTIL_H_
#define TROUPE_ENVS_TASKS_TASK_UTIL_H_

#include <mujoco/mujoco.h>

#include <initializer_list>
#include <random>
#include <string_view>

#include "absl/status/status.h"

namespace troupe::envs {

// One element a task reads: its kind, its MJCF name, and where its id goes.
struct IdRequest {
  mjtObj type;
  const char* name;
  int* id;
};

// Looks up every request in `model` with mj_name2id and writes the ids.
// Returns NotFound naming the first missing element's kind and name and
// `model_file` (e.g. "joint 'rootx' not found in model cheetah.xml"); ids of
// requests before it are written, the rest are left untouched.
absl::Status BindIds(const mjModel* model, std::string_view model_file, std::initializer_list<IdRequest> requests);

// Sets each limited hinge or slide joint to a uniform draw from its range and
// each unlimited hinge to a uniform angle in [-pi, pi), drawing from `rng` in
// joint order; other joints (unlimited slides, ball, free) keep their qpos.
// After dm_control's randomize_limited_and_rotational_joints for planar
// models (Tassa et al. 2018, "DeepMind Control Suite").
void RandomizeLimitedAndRotationalJoints(const mjModel* model, mjData* data, std::mt19937_64& rng);

// Sets each limited hinge or slide joint to a uniform draw from its range;
// all other joints keep their qpos.
void RandomizeLimitedJoints(const mjModel* model, mjData* data, std::mt19937_64& rng);

// A uniform draw from [low, high).
double Uniform(std::mt19937_64& rng, double low, double high);

}  // namespace troupe::envs

#endif  // TROUPE_ENVS_TASKS_TASK_UTIL_H_
