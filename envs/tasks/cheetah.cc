// cheetah.run: run forward as fast as possible (Tassa et al. 2018,
// "DeepMind Control Suite", the Cheetah domain).
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "envs/task.h"
#include "envs/tasks/task_util.h"
#include "envs/tasks/tasks.h"
#include "envs/tolerance.h"

namespace troupe::envs {
namespace {

constexpr char kCheetahModelFile[] = "cheetah.xml";

// Forward speed (m/s) at and above which the reward is 1.
constexpr double kRunSpeed = 10.0;
// Physics steps the body is left to settle under gravity before an episode.
constexpr int kSettleSteps = 200;

// Running. Observation (dm_control's): position (8: every joint position but
// rootx, so the state does not grow with distance travelled), velocity (9).
class CheetahRunTask : public Task {
 public:
  absl::Status Bind(const mjModel* model) override {
    RETURN_IF_ERROR(BindIds(model, kCheetahModelFile,
                            {{mjOBJ_JOINT, "rootx", &rootx_joint_},
                             {mjOBJ_SENSOR, "torso_subtreelinvel", &speed_sensor_}}));
    if (model->nq != 9 || model->nv != 9) {
      return absl::InvalidArgumentError("model cheetah.xml must have 9 one-dof joints (rootx, rootz, rooty and six "
                                        "leg hinges); it has nq=" + std::to_string(model->nq));
    }
    return absl::OkStatus();
  }

  void InitializeEpisode(const mjModel* model, mjData* data, std::mt19937_64& rng) override {
    // Random leg angles within their limits (the root stays where it is).
    RandomizeLimitedJoints(model, data, rng);
    // Let the body fall and settle on the floor, then start the clock.
    for (int step = 0; step < kSettleSteps; ++step) mj_step(model, data);
    data->time = 0.0;
  }

  std::vector<ObservationField> ObservationSpec() const override { return {{"position", 8}, {"velocity", 9}}; }

  void Observe(const mjModel* model, const mjData* data, float* out) const override {
    // Positions without rootx, then every velocity.
    const int skipped = model->jnt_qposadr[rootx_joint_];
    int written = 0;
    for (int i = 0; i < model->nq; ++i) {
      if (i != skipped) out[written++] = static_cast<float>(data->qpos[i]);
    }
    for (int i = 0; i < model->nv; ++i) out[written++] = static_cast<float>(data->qvel[i]);
  }

  // tolerance(forward speed of the centre of mass, (10, inf), margin 10,
  // value_at_margin 0, linear): 0 standing still, rising linearly to 1 at
  // 10 m/s (Tassa et al. 2018).
  double Reward(const mjModel* model, const mjData* data) const override {
    const double speed = data->sensordata[model->sensor_adr[speed_sensor_]];
    return Tolerance(speed, kRunSpeed, mjMAXVAL, /*margin=*/kRunSpeed, Sigmoid::kLinear, /*value_at_margin=*/0.0);
  }

 private:
  int rootx_joint_ = -1;
  int speed_sensor_ = -1;
};

}  // namespace

std::vector<TaskInfo> CheetahTasks() {
  return {TaskInfo{.name = "cheetah.run",
                   .model_file = kCheetahModelFile,
                   .control_substeps = 1,
                   .episode_steps = 1000,
                   .pixel_camera = "fixed",
                   .make = [] { return std::make_unique<CheetahRunTask>(); }}};
}

}  // namespace troupe::envs
