// pendulum.swingup (Tassa et al. 2018, sec. 4, "Pendulum"): swing a
// torque-limited pendulum up and keep it within 30 degrees of upright; the
// reward is sparse (1 inside the cone, 0 outside).
#include <cmath>

#include "envs/tasks/tasks.h"
#include "envs/tolerance.h"

namespace troupe::envs {
namespace {

class PendulumSwingup : public Task {
 public:
  absl::Status Bind(const mjModel* model) override {
    hinge_ = mj_name2id(model, mjOBJ_JOINT, "hinge");
    pole_ = mj_name2id(model, mjOBJ_BODY, "pole");
    if (hinge_ < 0 || pole_ < 0) return absl::NotFoundError("pendulum.xml: needs joint 'hinge' and body 'pole'");
    // Inertia about the hinge and m*g*l, for the energy controller.
    mjData* data = mj_makeData(model);
    mj_forward(model, data);
    inertia_ = data->qM[model->dof_Madr[model->jnt_dofadr[hinge_]]];
    const double* com = data->subtree_com + 3 * pole_;
    mgl_ = model->body_subtreemass[pole_] * -model->opt.gravity[2] * std::abs(com[2] - data->xanchor[3 * hinge_ + 2]);
    mj_deleteData(data);
    return absl::OkStatus();
  }

  void InitializeEpisode(const mjModel* model, mjData* data, std::mt19937_64& rng) override {
    std::uniform_real_distribution<double> angle(-M_PI, M_PI);
    data->qpos[model->jnt_qposadr[hinge_]] = angle(rng);
  }

  std::vector<ObservationField> ObservationSpec() const override { return {{"orientation", 2}, {"velocity", 1}}; }

  void Observe(const mjModel* model, const mjData* data, float* out) const override {
    // The pole's direction in the x-z plane: (cos, sin) of its angle from upright.
    const double* xmat = data->xmat + 9 * pole_;
    out[0] = float(xmat[8]);  // zz
    out[1] = float(xmat[2]);  // xz
    out[2] = float(data->qvel[model->jnt_dofadr[hinge_]]);
  }

  double Reward(const mjModel* model, const mjData* data) const override {
    return Tolerance(data->xmat[9 * pole_ + 8], std::cos(8.0 * M_PI / 180.0), 1.0);
  }

  // Energy pumping toward the upright energy, then PD within the cone.
  bool Controller(const mjModel* model, const mjData* data, double* action) const override {
    const double angle = std::remainder(data->qpos[model->jnt_qposadr[hinge_]], 2 * M_PI);
    const double velocity = data->qvel[model->jnt_dofadr[hinge_]];
    double u;
    if (std::cos(angle) > std::cos(0.5)) {
      u = -8.0 * angle - 1.5 * velocity;
    } else {
      const double energy = 0.5 * inertia_ * velocity * velocity + mgl_ * (std::cos(angle) - 1.0);
      u = -4.0 * energy * (velocity >= 0 ? 1.0 : -1.0);
    }
    action[0] = std::clamp(u, -1.0, 1.0);
    return true;
  }

 private:
  int hinge_ = -1, pole_ = -1;
  double inertia_ = 0, mgl_ = 0;
};

}  // namespace

std::vector<TaskInfo> PendulumTasks() {
  return {{"pendulum.swingup", "pendulum.xml", /*control_substeps=*/1, /*episode_steps=*/1000, "fixed",
           [] { return std::make_unique<PendulumSwingup>(); }}};
}

}  // namespace troupe::envs
