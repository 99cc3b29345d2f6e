#include "envs/tasks/task_util.h"

#include <cmath>
#include <string>

namespace troupe::envs {
namespace {

// A readable name for the kinds of element tasks look up.
const char* ObjectKind(mjtObj type) {
  switch (type) {
    case mjOBJ_BODY: return "body";
    case mjOBJ_JOINT: return "joint";
    case mjOBJ_GEOM: return "geom";
    case mjOBJ_SITE: return "site";
    case mjOBJ_CAMERA: return "camera";
    case mjOBJ_ACTUATOR: return "actuator";
    case mjOBJ_SENSOR: return "sensor";
    case mjOBJ_TENDON: return "tendon";
    default: return "element";
  }
}

// Draws each 1-dof joint's position: limited ones in their range, unlimited
// hinges in [-pi, pi) when `rotational` is set.
void RandomizeJoints(const mjModel* model, mjData* data, std::mt19937_64& rng, bool rotational) {
  for (int j = 0; j < model->njnt; ++j) {
    const int type = model->jnt_type[j];
    if (type != mjJNT_HINGE && type != mjJNT_SLIDE) continue;
    const int address = model->jnt_qposadr[j];
    if (model->jnt_limited[j]) {
      data->qpos[address] = Uniform(rng, model->jnt_range[2 * j], model->jnt_range[2 * j + 1]);
    } else if (rotational && type == mjJNT_HINGE) {
      data->qpos[address] = Uniform(rng, -M_PI, M_PI);
    }
  }
}

}  // namespace

absl::Status BindIds(const mjModel* model, std::string_view model_file, std::initializer_list<IdRequest> requests) {
  for (const IdRequest& request : requests) {
    const int id = mj_name2id(model, request.type, request.name);
    if (id < 0) {
      // (Debian's abseil has its own string_view, so the message is built
      // with std::string.)
      return absl::NotFoundError(std::string(ObjectKind(request.type)) + " '" + request.name +
                                 "' not found in model " + std::string(model_file) +
                                 "; the task needs an element of that name");
    }
    *request.id = id;
  }
  return absl::OkStatus();
}

void RandomizeLimitedAndRotationalJoints(const mjModel* model, mjData* data, std::mt19937_64& rng) {
  RandomizeJoints(model, data, rng, /*rotational=*/true);
}

void RandomizeLimitedJoints(const mjModel* model, mjData* data, std::mt19937_64& rng) {
  RandomizeJoints(model, data, rng, /*rotational=*/false);
}

double Uniform(std::mt19937_64& rng, double low, double high) {
  return std::uniform_real_distribution<double>(low, high)(rng);
}

}  // namespace troupe::envs
