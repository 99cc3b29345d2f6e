// reacher.easy: bring a two-link arm's fingertip onto a randomly placed
// target (Tassa et al. 2018, "DeepMind Control Suite", the Reacher domain).
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

constexpr char kReacherModelFile[] = "reacher.xml";

// The target's radius in reacher.easy (reacher.hard would use 0.015).
constexpr double kEasyTargetRadius = 0.05;
// The target's distance from the shoulder is drawn from this range.
constexpr double kTargetMinDistance = 0.05;
constexpr double kTargetMaxDistance = 0.20;

// Reaching a target of a given radius. Observation (dm_control's):
// position (2 joint angles), to_target (2, target minus fingertip in the
// plane), velocity (2 joint velocities).
class ReacherTask : public Task {
 public:
  explicit ReacherTask(double target_radius) : target_radius_(target_radius) {}

  absl::Status Bind(const mjModel* model) override {
    return BindIds(model, kReacherModelFile,
                   {{mjOBJ_BODY, "target", &target_body_},
                    {mjOBJ_GEOM, "finger", &finger_geom_},
                    {mjOBJ_JOINT, "shoulder", &shoulder_joint_},
                    {mjOBJ_JOINT, "wrist", &wrist_joint_}});
  }

  void InitializeEpisode(const mjModel* model, mjData* data, std::mt19937_64& rng) override {
    // Random arm configuration: shoulder anywhere, wrist within its limits.
    RandomizeLimitedAndRotationalJoints(model, data, rng);
    // Target at a random angle and distance from the shoulder.
    const double angle = Uniform(rng, 0.0, 2.0 * M_PI);
    const double distance = Uniform(rng, kTargetMinDistance, kTargetMaxDistance);
    const int mocap = model->body_mocapid[target_body_];
    data->mocap_pos[3 * mocap + 0] = distance * std::cos(angle);
    data->mocap_pos[3 * mocap + 1] = distance * std::sin(angle);
  }

  std::vector<ObservationField> ObservationSpec() const override {
    return {{"position", 2}, {"to_target", 2}, {"velocity", 2}};
  }

  void Observe(const mjModel* model, const mjData* data, float* out) const override {
    out[0] = static_cast<float>(data->qpos[model->jnt_qposadr[shoulder_joint_]]);
    out[1] = static_cast<float>(data->qpos[model->jnt_qposadr[wrist_joint_]]);
    const double* target = TargetPosition(model, data);
    const double* finger = data->geom_xpos + 3 * finger_geom_;
    out[2] = static_cast<float>(target[0] - finger[0]);
    out[3] = static_cast<float>(target[1] - finger[1]);
    out[4] = static_cast<float>(data->qvel[model->jnt_dofadr[shoulder_joint_]]);
    out[5] = static_cast<float>(data->qvel[model->jnt_dofadr[wrist_joint_]]);
  }

  // 1 while the fingertip sphere touches the target sphere, else 0:
  // tolerance(distance, (0, target radius + finger radius)) with no margin.
  double Reward(const mjModel* model, const mjData* data) const override {
    const double* target = TargetPosition(model, data);
    const double* finger = data->geom_xpos + 3 * finger_geom_;
    const double distance = std::hypot(target[0] - finger[0], target[1] - finger[1]);
    const double radii = target_radius_ + model->geom_size[3 * finger_geom_];
    return Tolerance(distance, 0.0, radii);
  }

 private:
  // The target's centre, which the episode set in mocap_pos.
  const double* TargetPosition(const mjModel* model, const mjData* data) const {
    return data->mocap_pos + 3 * model->body_mocapid[target_body_];
  }

  double target_radius_;
  int target_body_ = -1;
  int finger_geom_ = -1;
  int shoulder_joint_ = -1;
  int wrist_joint_ = -1;
};

}  // namespace

std::vector<TaskInfo> ReacherTasks() {
  return {TaskInfo{.name = "reacher.easy",
                   .model_file = kReacherModelFile,
                   .control_substeps = 1,
                   .episode_steps = 1000,
                   .pixel_camera = "fixed",
                   .make = [] { return std::make_unique<ReacherTask>(kEasyTargetRadius); }}};
}

}  // namespace troupe::envs
