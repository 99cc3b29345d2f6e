// Loading MJCF models with errors as absl::Status, and MuJoCo's error hooks.
#ifndef TROUPE_ENVS_MODEL_H_
#define TROUPE_ENVS_MODEL_H_

#include <mujoco/mujoco.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace troupe::envs {

// An immutable, loaded mjModel shared by every env of a task (MuJoCo's
// mjModel/mjData split: all mutable state lives in each env's mjData).
class Model {
 public:
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // Loads `path`. `multisample` sets the offscreen buffer's MSAA samples
  // (0 when off), which MuJoCo's renderer reads when it makes its context.
  // Errors: NotFound if the file is missing; InvalidArgument with MuJoCo's
  // message (element, line) prefixed by the path if the MJCF is malformed.
  static absl::StatusOr<std::shared_ptr<const Model>> Load(const std::string& path, bool multisample = false);

  const mjModel* get() const { return model_; }
  const std::string& path() const { return path_; }
  // Unique per loaded model in this process (a cache key that never repeats).
  uint64_t id() const { return id_; }

 private:
  Model(mjModel* model, std::string path, uint64_t id) : model_(model), path_(std::move(path)), id_(id) {}
  mjModel* model_;
  std::string path_;
  uint64_t id_;
};

// What MuJoCo's mju_user_error handler throws. Caught at the env boundary
// (Env, Renderer) and turned into absl::InternalError; it never crosses a
// thread or escapes troupe's public API.
class MujocoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Installs (once per process, thread-safe) mju_user_error, which throws
// MujocoError instead of exiting, and a mju_user_warning that stays quiet
// (warnings are counted in mjData::warning, which the env reads).
void InstallMujocoErrorHandlers();

}  // namespace troupe::envs

#endif  // TROUPE_ENVS_MODEL_H_
