// cartpole.balance and cartpole.swingup (Tassa et al. 2018, sec. 4,
// "Cart-pole"): keep the pole upright with a force on the cart, starting
// near upright (balance) or hanging down (swingup).
#include <cmath>

#include <Eigen/Dense>

#include "absl/strings/str_cat.h"
#include "envs/tasks/tasks.h"
#include "envs/tolerance.h"

namespace troupe::envs {
namespace {

class CartpoleTask : public Task {
 public:
  explicit CartpoleTask(bool swing_up) : swing_up_(swing_up) {}

  absl::Status Bind(const mjModel* model) override {
    slider_ = mj_name2id(model, mjOBJ_JOINT, "slider");
    hinge_ = mj_name2id(model, mjOBJ_JOINT, "hinge");
    pole_ = mj_name2id(model, mjOBJ_BODY, "pole");
    if (slider_ < 0 || hinge_ < 0 || pole_ < 0) {
      return absl::NotFoundError("cartpole.xml: needs joints 'slider', 'hinge' and body 'pole'");
    }
    return ComputeBalanceGain(model);
  }

  void InitializeEpisode(const mjModel* model, mjData* data, std::mt19937_64& rng) override {
    std::normal_distribution<double> noise(0.0, 0.01);
    if (swing_up_) {
      // Pole hanging down, cart near the middle.
      data->qpos[model->jnt_qposadr[slider_]] = noise(rng);
      data->qpos[model->jnt_qposadr[hinge_]] = M_PI + noise(rng);
    } else {
      // Pole near upright anywhere on a short stretch of rail.
      std::uniform_real_distribution<double> cart(-0.1, 0.1), pole(-0.034, 0.034);
      data->qpos[model->jnt_qposadr[slider_]] = cart(rng);
      data->qpos[model->jnt_qposadr[hinge_]] = pole(rng);
    }
    for (int i = 0; i < model->nv; ++i) data->qvel[i] = noise(rng);
  }

  std::vector<ObservationField> ObservationSpec() const override { return {{"position", 3}, {"velocity", 2}}; }

  void Observe(const mjModel* model, const mjData* data, float* out) const override {
    const double angle = data->qpos[model->jnt_qposadr[hinge_]];
    out[0] = float(data->qpos[model->jnt_qposadr[slider_]]);
    out[1] = float(std::cos(angle));
    out[2] = float(std::sin(angle));
    out[3] = float(data->qvel[model->jnt_dofadr[slider_]]);
    out[4] = float(data->qvel[model->jnt_dofadr[hinge_]]);
  }

  // The smooth reward of the paper: upright x centered x small control x
  // small angular velocity, each shaped with the tolerance function.
  double Reward(const mjModel* model, const mjData* data) const override {
    const double upright = (std::cos(data->qpos[model->jnt_qposadr[hinge_]]) + 1.0) / 2.0;
    const double centered = (1.0 + Tolerance(data->qpos[model->jnt_qposadr[slider_]], 0, 0, /*margin=*/2.0)) / 2.0;
    const double small_control =
        (4.0 + Tolerance(data->ctrl[0], 0, 0, /*margin=*/1.0, Sigmoid::kQuadratic, /*value_at_margin=*/0.0)) / 5.0;
    const double small_velocity =
        (1.0 + Tolerance(data->qvel[model->jnt_dofadr[hinge_]], 0, 0, /*margin=*/5.0)) / 2.0;
    return upright * centered * small_control * small_velocity;
  }

  // Swing-up by pumping the pole's energy toward that of standing upright
  // (Astrom & Furuta 2000, "Swinging up a pendulum by energy control"),
  // then LQR balancing near the top.
  bool Controller(const mjModel* model, const mjData* data, double* action) const override {
    const double x = data->qpos[model->jnt_qposadr[slider_]];
    const double angle = std::remainder(data->qpos[model->jnt_qposadr[hinge_]], 2 * M_PI);
    const double x_dot = data->qvel[model->jnt_dofadr[slider_]];
    const double angle_dot = data->qvel[model->jnt_dofadr[hinge_]];
    double u;
    if (std::cos(angle) > 0.85) {
      const Eigen::Vector4d state(x, angle, x_dot, angle_dot);
      u = -balance_gain_.dot(state);
    } else {
      // Pole energy relative to upright (0 at rest upright, < 0 below).
      const double energy = 0.5 * pole_inertia_ * angle_dot * angle_dot + pole_mgl_ * (std::cos(angle) - 1.0);
      u = 2.0 * energy * angle_dot * std::cos(angle) - 0.3 * x - 0.3 * x_dot;
    }
    action[0] = std::clamp(u, -1.0, 1.0);
    return true;
  }

 private:
  // LQR gain for balancing, from a finite-difference linearization of one
  // control step about upright and the discrete Riccati recursion.
  absl::Status ComputeBalanceGain(const mjModel* model) {
    mjData* data = mj_makeData(model);
    const int qs = model->jnt_qposadr[slider_], qh = model->jnt_qposadr[hinge_];
    const int vs = model->jnt_dofadr[slider_], vh = model->jnt_dofadr[hinge_];
    auto step = [&](const Eigen::Vector4d& s, double u) {
      mj_resetData(model, data);
      data->qpos[qs] = s[0];
      data->qpos[qh] = s[1];
      data->qvel[vs] = s[2];
      data->qvel[vh] = s[3];
      data->ctrl[0] = u;
      mj_step(model, data);
      return Eigen::Vector4d(data->qpos[qs], data->qpos[qh], data->qvel[vs], data->qvel[vh]);
    };
    const double eps = 1e-6;
    Eigen::Matrix4d a;
    Eigen::Vector4d b;
    for (int i = 0; i < 4; ++i) {
      Eigen::Vector4d plus = Eigen::Vector4d::Zero(), minus = Eigen::Vector4d::Zero();
      plus[i] = eps;
      minus[i] = -eps;
      a.col(i) = (step(plus, 0) - step(minus, 0)) / (2 * eps);
    }
    b = (step(Eigen::Vector4d::Zero(), eps) - step(Eigen::Vector4d::Zero(), -eps)) / (2 * eps);
    // Pole inertia about the hinge and m*g*l, for the energy controller.
    mj_resetData(model, data);
    mj_forward(model, data);
    pole_inertia_ = data->qM[model->dof_Madr[vh]];
    const double* com = data->subtree_com + 3 * pole_;
    const double* anchor = data->xanchor + 3 * hinge_;
    pole_mgl_ = model->body_subtreemass[pole_] * -model->opt.gravity[2] * std::abs(com[2] - anchor[2]);
    mj_deleteData(data);

    const Eigen::Matrix4d q = Eigen::Vector4d(1.0, 10.0, 0.1, 0.1).asDiagonal();
    const double r = 1.0;
    Eigen::Matrix4d p = q;
    for (int i = 0; i < 5000; ++i) {
      const double s = r + b.dot(p * b);
      const Eigen::RowVector4d k = (b.transpose() * p * a) / s;
      const Eigen::Matrix4d next = q + a.transpose() * p * a - a.transpose() * p * b * k;
      const bool converged = (next - p).norm() < 1e-10 * p.norm();
      p = next;
      if (converged) break;
    }
    balance_gain_ = ((b.transpose() * p * a) / (r + b.dot(p * b))).transpose();
    if (!balance_gain_.allFinite()) {
      return absl::InternalError("cartpole.xml: LQR gain is not finite (is the model's actuator on the cart?)");
    }
    return absl::OkStatus();
  }

  bool swing_up_;
  int slider_ = -1, hinge_ = -1, pole_ = -1;
  Eigen::Vector4d balance_gain_ = Eigen::Vector4d::Zero();
  double pole_inertia_ = 0, pole_mgl_ = 0;
};

}  // namespace

std::vector<TaskInfo> CartpoleTasks() {
  return {
      {"cartpole.balance", "cartpole.xml", /*control_substeps=*/1, /*episode_steps=*/1000, "fixed",
       [] { return std::make_unique<CartpoleTask>(/*swing_up=*/false); }},
      {"cartpole.swingup", "cartpole.xml", /*control_substeps=*/1, /*episode_steps=*/1000, "fixed",
       [] { return std::make_unique<CartpoleTask>(/*swing_up=*/true); }},
  };
}

}  // namespace troupe::envs
