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

constexpr char kModelFile[] = "ball_in_cup.xml";

// The ball starts within this box around the string's anchor (m)...
constexpr double kInitialHalfWidth = 0.3;
constexpr double kInitialBelow = 0.3;
constexpr double kInitialAbove = 0.05;
// ...redrawn until it is collision-free, within the string's reach and not
// already caught.
constexpr int kMaxInitialAttempts = 1000;

// Catching. Observation (dm_control's): position (4: cup x, z and ball x, z
// joint positions), velocity (4: their velocities).
class BallInCupCatchTask : public Task {
 public:
  absl::Status Bind(const mjModel* model) override {
    return BindIds(model, kModelFile,
                   {{mjOBJ_JOINT, "ball_x", &ball_x_joint_},
                    {mjOBJ_JOINT, "ball_z", &ball_z_joint_},
                    {mjOBJ_BODY, "ball", &ball_body_},
                    {mjOBJ_GEOM, "ball", &ball_geom_},
                    {mjOBJ_SITE, "target", &target_site_},
                    {mjOBJ_SITE, "anchor", &anchor_site_},
                    {mjOBJ_TENDON, "string", &string_tendon_}});
  }

  void InitializeEpisode(const mjModel* model, mjData* data, std::mt19937_64& rng) override {
    // The cup stays at its home position; the ball is placed at random near
    // the anchor, at rest. The last draw stands if none qualifies.
    mj_kinematics(model, data);
    const double anchor_x = data->site_xpos[3 * anchor_site_];
    const double anchor_z = data->site_xpos[3 * anchor_site_ + 2];
    const double* ball_home = model->body_pos + 3 * ball_body_;
    const double string_length = model->tendon_range[2 * string_tendon_ + 1];
    for (int attempt = 0; attempt < kMaxInitialAttempts; ++attempt) {
      const double x = anchor_x + Uniform(rng, -kInitialHalfWidth, kInitialHalfWidth);
      const double z = anchor_z + Uniform(rng, -kInitialBelow, kInitialAbove);
      data->qpos[model->jnt_qposadr[ball_x_joint_]] = x - ball_home[0];
      data->qpos[model->jnt_qposadr[ball_z_joint_]] = z - ball_home[2];
      mj_forward(model, data);
      if (data->ncon == 0 && data->ten_length[string_tendon_] < string_length && !BallInCup(model, data)) break;
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
    return std::abs(ball[0] - target[0]) <= target_size[0] - radius &&
           std::abs(ball[2] - target[2]) <= target_size[2] - radius;
  }

  int ball_x_joint_ = -1;
  int ball_z_joint_ = -1;
  int ball_body_ = -1;
  int ball_geom_ = -1;
  int target_site_ = -1;
  int anchor_site_ = -1;
  int string_tendon_ = -1;
};

}  // namespace

std::vector<TaskInfo> BallInCupTasks() {
  return {TaskInfo{.name = "ball_in_cup.catch",
                   .model_file = kModelFile,
                   .control_substeps = 2,
                   .episode_steps = 1000,
                   .pixel_camera = "fixed",
                   .make = [] { return std::make_unique<BallInCupCatchTask>(); }}};
}

}  // namespace troupe::envs
