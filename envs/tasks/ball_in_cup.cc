// ball_in_cup.catch: swing a ball on a string up into a cup (Tassa et al.
// 2018, "DeepMind Control Suite", the Ball-in-cup domain).
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

constexpr char kBallInCupModelFile[] = "ball_in_cup.xml";

// The ball starts at joint positions x in [-0.2, 0.2], z in [0.2, 0.5] m
// (from its body's home 0.2 m up), redrawn until nothing touches
// (dm_control's catch task).
constexpr double kInitialX = 0.2, kInitialZLow = 0.2, kInitialZHigh = 0.5;
constexpr int kMaxInitialAttempts = 1000;

// Catching. Observation (dm_control's): position (4: cup x, z and ball x, z
// joint positions), velocity (4: their velocities).
class BallInCupCatchTask : public Task {
 public:
  absl::Status Bind(const mjModel* model) override {
    return BindIds(model, kBallInCupModelFile,
                   {{mjOBJ_JOINT, "ball_x", &ball_x_joint_},
                    {mjOBJ_JOINT, "ball_z", &ball_z_joint_},
                    {mjOBJ_GEOM, "ball", &ball_geom_},
                    {mjOBJ_SITE, "target", &target_site_}});
  }

  void InitializeEpisode(const mjModel* model, mjData* data, std::mt19937_64& rng) override {
    // The cup at rest at home; the ball at rest at a random place. The last
    // draw stands if none is free.
    for (int attempt = 0; attempt < kMaxInitialAttempts; ++attempt) {
      data->qpos[model->jnt_qposadr[ball_x_joint_]] = Uniform(rng, -kInitialX, kInitialX);
      data->qpos[model->jnt_qposadr[ball_z_joint_]] = Uniform(rng, kInitialZLow, kInitialZHigh);
      mj_forward(model, data);
      if (data->ncon == 0) break;
    }
  }

  std::vector<ObservationField> ObservationSpec() const override { return {{"position", 4}, {"velocity", 4}}; }

  void Observe(const mjModel* model, const mjData* data, float* out) const override {
    for (int i = 0; i < 4; ++i) out[i] = static_cast<float>(data->qpos[i]);
    for (int i = 0; i < 4; ++i) out[4 + i] = static_cast<float>(data->qvel[i]);
  }

  // 1 while the whole ball is inside the cup's target box, else 0
  // (Tassa et al. 2018: a sparse catch reward).
  double Reward(const mjModel* model, const mjData* data) const override {
    return BallInCup(model, data) ? 1.0 : 0.0;
  }

 private:
  // Whether the ball's centre lies within the target box shrunk by the ball's
  // radius, in x and z. The cup only translates, so the box stays axis-aligned.
  bool BallInCup(const mjModel* model, const mjData* data) const {
    const double* ball = data->geom_xpos + 3 * ball_geom_;
    const double* target = data->site_xpos + 3 * target_site_;
    const double* target_size = model->site_size + 3 * target_site_;
    const double radius = model->geom_size[3 * ball_geom_];
    return std::abs(ball[0] - target[0]) < target_size[0] - radius &&
           std::abs(ball[2] - target[2]) < target_size[2] - radius;
  }

  int ball_x_joint_ = -1;
  int ball_z_joint_ = -1;
  int ball_geom_ = -1;
  int target_site_ = -1;
};

}  // namespace

std::vector<TaskInfo> BallInCupTasks() {
  return {TaskInfo{.name = "ball_in_cup.catch",
                   .model_file = kBallInCupModelFile,
                   .control_substeps = 10,
                   .episode_steps = 1000,
                   .pixel_camera = "fixed",
                   .make = [] { return std::make_unique<BallInCupCatchTask>(); }}};
}

}  // namespace troupe::envs
