// walker.walk: stand up tall and walk forward at 1 m/s (Tassa et al. 2018,
// "DeepMind Control Suite", the Walker domain).
#include <memory>
#include <random>
#include <vector>

#include "common/status_macros.h"
#include "envs/task.h"
#include "envs/tasks/task_util.h"
#include "envs/tasks/tasks.h"
#include "envs/tolerance.h"

namespace troupe::envs {
namespace {

constexpr char kWalkerModelFile[] = "walker.xml";

// Torso height (m) at and above which the walker counts as standing.
constexpr double kStandHeight = 1.2;
// Forward speed (m/s) at and above which the walker counts as walking.
constexpr double kWalkSpeed = 1.0;

// The seven bodies whose orientations are observed, torso first.
constexpr const char* kBodies[] = {"torso",    "right_thigh", "right_leg", "right_foot",
                                   "left_thigh", "left_leg",  "left_foot"};
constexpr int kNumBodies = 7;

// Walking at a target speed. Observation (dm_control's): orientations (14:
// the xx and xz entries of each body's rotation matrix, torso first), height
// (1: torso z), velocity (9: every joint velocity).
class WalkerWalkTask : public Task {
 public:
  explicit WalkerWalkTask(double move_speed) : move_speed_(move_speed) {}

  absl::Status Bind(const mjModel* model) override {
    for (int i = 0; i < kNumBodies; ++i) {
      RETURN_IF_ERROR(BindIds(model, kWalkerModelFile, {{mjOBJ_BODY, kBodies[i], &bodies_[i]}}));
    }
    return BindIds(model, kWalkerModelFile, {{mjOBJ_SENSOR, "torso_subtreelinvel", &speed_sensor_}});
  }

  void InitializeEpisode(const mjModel* model, mjData* data, std::mt19937_64& rng) override {
    // Random joint angles within limits and a random pitch of the whole body:
    // the walker usually starts falling and has to get up.
    RandomizeLimitedAndRotationalJoints(model, data, rng);
  }

  std::vector<ObservationField> ObservationSpec() const override {
    return {{"orientations", 2 * kNumBodies}, {"height", 1}, {"velocity", 9}};
  }

  void Observe(const mjModel* model, const mjData* data, float* out) const override {
    // Each body's xx and xz: the in-plane direction of its local x axis.
    for (int i = 0; i < kNumBodies; ++i) {
      const double* rotation = data->xmat + 9 * bodies_[i];
      out[2 * i] = static_cast<float>(rotation[0]);
      out[2 * i + 1] = static_cast<float>(rotation[2]);
    }
    out[2 * kNumBodies] = static_cast<float>(TorsoHeight(data));
    for (int i = 0; i < model->nv; ++i) out[2 * kNumBodies + 1 + i] = static_cast<float>(data->qvel[i]);
  }

  // As defined by Tassa et al. 2018:
  //   standing = tolerance(torso height, (1.2, inf), margin 0.6)
  //   upright  = (1 + torso zz) / 2
  //   stand    = (3 standing + upright) / 4
  //   move     = tolerance(speed, (1, inf), margin 0.5, value_at_margin 0.5, linear)
  //   reward   = stand (5 move + 1) / 6
  double Reward(const mjModel* model, const mjData* data) const override {
    const double standing = Tolerance(TorsoHeight(data), kStandHeight, mjMAXVAL, /*margin=*/kStandHeight / 2);
    const double upright = (1.0 + data->xmat[9 * bodies_[0] + 8]) / 2.0;
    const double stand = (3.0 * standing + upright) / 4.0;
    const double speed = data->sensordata[model->sensor_adr[speed_sensor_]];
    const double move = Tolerance(speed, move_speed_, mjMAXVAL, /*margin=*/move_speed_ / 2, Sigmoid::kLinear,
                                  /*value_at_margin=*/0.5);
    return stand * (5.0 * move + 1.0) / 6.0;
  }

 private:
  double TorsoHeight(const mjData* data) const { return data->xpos[3 * bodies_[0] + 2]; }

  double move_speed_;
  int bodies_[kNumBodies] = {};
  int speed_sensor_ = -1;
};

}  // namespace

std::vector<TaskInfo> WalkerTasks() {
  return {TaskInfo{.name = "walker.walk",
                   .model_file = kWalkerModelFile,
                   .control_substeps = 10,
                   .episode_steps = 1000,
                   .pixel_camera = "fixed",
                   .make = [] { return std::make_unique<WalkerWalkTask>(kWalkSpeed); }}};
}

}  // namespace troupe::envs
