// finger.spin: keep a free body on a hinge spinning fast by flicking it with
// a two-link finger (Tassa et al. 2018, "DeepMind Control Suite", the Finger
// domain, after Tassa and Todorov 2010).
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "envs/task.h"
#include "envs/tasks/task_util.h"
#include "envs/tasks/tasks.h"
#include "envs/tolerance.h"

namespace troupe::envs {
namespace {

constexpr char kFingerModelFile[] = "finger.xml";

// The spinner counts as spinning at angular velocities <= -15 rad/s.
constexpr double kSpinVelocity = 15.0;
// Initial states are redrawn until none has the finger touching the spinner.
constexpr int kMaxInitialAttempts = 1000;

// Spinning. Observation (dm_control's): position (4: proximal and distal
// angles, the spinner tip's x and z relative to its hinge), velocity (3: the
// three hinge velocities), touch (2: log(1 + force) of the fingertip's two
// touch sensors).
class FingerSpinTask : public Task {
 public:
  absl::Status Bind(const mjModel* model) override {
    return BindIds(model, kFingerModelFile,
                   {{mjOBJ_JOINT, "proximal", &proximal_joint_},
                    {mjOBJ_JOINT, "distal", &distal_joint_},
                    {mjOBJ_JOINT, "hinge", &hinge_joint_},
                    {mjOBJ_BODY, "spinner", &spinner_body_},
                    {mjOBJ_SITE, "tip", &tip_site_},
                    {mjOBJ_SENSOR, "touchtop", &touch_top_sensor_},
                    {mjOBJ_SENSOR, "touchbottom", &touch_bottom_sensor_}});
  }

  void InitializeEpisode(const mjModel* model, mjData* data, std::mt19937_64& rng) override {
    // Random finger angles and spinner angle, redrawn while any geoms touch
    // (dm_control does the same); the last draw stands if none is free.
    for (int attempt = 0; attempt < kMaxInitialAttempts; ++attempt) {
      RandomizeLimitedAndRotationalJoints(model, data, rng);
      mj_forward(model, data);
      if (data->ncon == 0) break;
    }
  }

  std::vector<ObservationField> ObservationSpec() const override {
    return {{"position", 4}, {"velocity", 3}, {"touch", 2}};
  }

  void Observe(const mjModel* model, const mjData* data, float* out) const override {
    // Finger angles, then the spinner tip relative to the hinge.
    out[0] = static_cast<float>(data->qpos[model->jnt_qposadr[proximal_joint_]]);
    out[1] = static_cast<float>(data->qpos[model->jnt_qposadr[distal_joint_]]);
    const double* tip = data->site_xpos + 3 * tip_site_;
    const double* hinge = data->xpos + 3 * spinner_body_;
    out[2] = static_cast<float>(tip[0] - hinge[0]);
    out[3] = static_cast<float>(tip[2] - hinge[2]);
    // Joint velocities.
    out[4] = static_cast<float>(data->qvel[model->jnt_dofadr[proximal_joint_]]);
    out[5] = static_cast<float>(data->qvel[model->jnt_dofadr[distal_joint_]]);
    out[6] = static_cast<float>(HingeVelocity(model, data));
    // Touch forces, compressed.
    out[7] = static_cast<float>(std::log1p(data->sensordata[model->sensor_adr[touch_top_sensor_]]));
    out[8] = static_cast<float>(std::log1p(data->sensordata[model->sensor_adr[touch_bottom_sensor_]]));
  }

  // 1 while the hinge turns at <= -15 rad/s, else 0 (Tassa et al. 2018).
  double Reward(const mjModel* model, const mjData* data) const override {
    return Tolerance(HingeVelocity(model, data), -mjMAXVAL, -kSpinVelocity);
  }

 private:
  double HingeVelocity(const mjModel* model, const mjData* data) const {
    return data->qvel[model->jnt_dofadr[hinge_joint_]];
  }

  int proximal_joint_ = -1;
  int distal_joint_ = -1;
  int hinge_joint_ = -1;
  int spinner_body_ = -1;
  int tip_site_ = -1;
  int touch_top_sensor_ = -1;
  int touch_bottom_sensor_ = -1;
};

}  // namespace

std::vector<TaskInfo> FingerTasks() {
  return {TaskInfo{.name = "finger.spin",
                   .model_file = kFingerModelFile,
                   .control_substeps = 2,
                   .episode_steps = 1000,
                   .pixel_camera = "fixed",
                   .make = [] { return std::make_unique<FingerSpinTask>(); }}};
}

}  // namespace troupe::envs
