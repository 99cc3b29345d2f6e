#include "envs/control_env.h"

#include <cmath>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace troupe::envs {

ControlEnv::ControlEnv(const TaskInfo& info, std::shared_ptr<const Model> model, std::unique_ptr<Task> task,
                       const EnvOptions& options)
    : info_(info), model_(std::move(model)), task_(std::move(task)), render_(options.render),
      pixels_(options.pixels), rng_(options.seed) {}

ControlEnv::~ControlEnv() {
  if (data_) mj_deleteData(data_);
}

absl::StatusOr<std::unique_ptr<ControlEnv>> ControlEnv::Create(const TaskInfo& info, std::shared_ptr<const Model> model,
                                                               const EnvOptions& options) {
  const mjModel* m = model->get();
  auto task = info.make();
  RETURN_IF_ERROR(task->Bind(m));
  std::unique_ptr<ControlEnv> env(new ControlEnv(info, model, std::move(task), options));
  try {
    env->data_ = mj_makeData(m);
  } catch (const MujocoError& e) {
    return absl::ResourceExhaustedError(absl::StrCat(info.name, ": mj_makeData: ", e.what()));
  }

  ASSIGN_OR_RETURN(env->spec_, Describe(info, *model, *env->task_, options));
  if (options.pixels) {
    ASSIGN_OR_RETURN(env->camera_id_, PixelCamera(info, *model, options));
    // Surface size and EGL errors now, not at the first step.
    mj_forward(m, env->data_);
    std::vector<uint8_t> probe(env->spec_.pixel_bytes());
    RETURN_IF_ERROR(RenderPixels(env->model_, env->data_, env->camera_id_, env->render_, probe.data()));
  }
  return env;
}

absl::StatusOr<int> ControlEnv::PixelCamera(const TaskInfo& info, const Model& model, const EnvOptions& options) {
  const std::string camera = options.camera.empty() ? info.pixel_camera : options.camera;
  const int id = mj_name2id(model.get(), mjOBJ_CAMERA, camera.c_str());
  if (id < 0) {
    return absl::InvalidArgumentError(absl::StrCat("env.render.camera: ", info.name, ": no camera named '",
                                                   absl::CHexEscape(camera.substr(0, 64)),
                                                   camera.size() > 64 ? "...'" : "'", " in ", model.path()));
  }
  return id;
}

absl::StatusOr<EnvSpec> ControlEnv::Describe(const TaskInfo& info, const Model& model, const Task& task,
                                             const EnvOptions& options) {
  const mjModel* m = model.get();
  EnvSpec spec;
  spec.task = info.name;
  spec.state_fields = task.ObservationSpec();
  for (const auto& field : spec.state_fields) spec.state_size += field.size;
  spec.action_size = m->nu;
  for (int i = 0; i < m->nu; ++i) {
    const bool limited = m->actuator_ctrllimited[i];
    spec.action_minimum.push_back(limited ? float(m->actuator_ctrlrange[2 * i]) : -INFINITY);
    spec.action_maximum.push_back(limited ? float(m->actuator_ctrlrange[2 * i + 1]) : INFINITY);
  }
  spec.episode_steps = info.episode_steps;
  if (options.pixels) {
    RETURN_IF_ERROR(PixelCamera(info, model, options).status());
    // What the renderer can draw: the model's offscreen buffer (checked here,
    // before any buffer of this size is made, as well as when rendering).
    if (options.render.width < 1 || options.render.height < 1 || options.render.width > m->vis.global.offwidth ||
        options.render.height > m->vis.global.offheight) {
      return absl::InvalidArgumentError(absl::StrCat(
          "env.render: size ", options.render.width, "x", options.render.height, " is outside the offscreen buffer ",
          m->vis.global.offwidth, "x", m->vis.global.offheight, " of task ", info.name,
          "'s model (raise <visual><global offwidth= offheight=> in the model, or render smaller)"));
    }
    spec.height = options.render.height;
    spec.width = options.render.width;
    spec.channels = 3;
  }
  return spec;
}

int ControlEnv::InstabilityWarnings() const {
  return data_->warning[mjWARN_BADQPOS].number + data_->warning[mjWARN_BADQVEL].number +
         data_->warning[mjWARN_BADQACC].number;
}

absl::Status ControlEnv::Observe(ObservationBuffers out) {
  if (out.state) task_->Observe(model_->get(), data_, out.state);
  if (out.pixels && pixels_) return RenderPixels(model_, data_, camera_id_, render_, out.pixels);
  return absl::OkStatus();
}

absl::StatusOr<TimeStep> ControlEnv::Reset(ObservationBuffers out) {
  const mjModel* m = model_->get();
  try {
    mj_resetData(m, data_);
    task_->InitializeEpisode(m, data_, rng_);
    mj_forward(m, data_);
  } catch (const MujocoError& e) {
    return absl::InternalError(absl::StrCat(info_.name, ": reset: ", e.what()));
  }
  step_ = 0;
  needs_reset_ = false;
  RETURN_IF_ERROR(Observe(out));
  return TimeStep{StepType::kFirst, 0.0f, 1.0f};
}

absl::StatusOr<TimeStep> ControlEnv::Step(std::span<const float> action, ObservationBuffers out) {
  const mjModel* m = model_->get();
  // Check everything before touching the state.
  if (needs_reset_) {
    return absl::FailedPreconditionError(absl::StrCat(info_.name, ": Step after the episode ended; call Reset"));
  }
  if (static_cast<int>(action.size()) != m->nu) {
    return absl::InvalidArgumentError(
        absl::StrCat(info_.name, ": action has ", action.size(), " values, the task takes ", m->nu));
  }
  for (int i = 0; i < m->nu; ++i) {
    if (!std::isfinite(action[i])) {
      return absl::InvalidArgumentError(absl::StrCat(info_.name, ": action[", i, "] is ", action[i],
                                                     "; actions must be finite"));
    }
  }
  // Clip to the spec and step the physics.
  for (int i = 0; i < m->nu; ++i) {
    data_->ctrl[i] = std::clamp(action[i], spec_.action_minimum[i], spec_.action_maximum[i]);
  }
  const int warnings_before = InstabilityWarnings();
  try {
    // As dm_control's Physics.step: the first step finishes the mj_step1
    // already done, except with RK4, which mj_step2 does not do (its
    // substeps are whole mj_steps); mj_step1 leaves positions and sensors
    // up to date for the reward and the observation.
    if (m->opt.integrator == mjINT_RK4) {
      for (int i = 0; i < info_.control_substeps; ++i) mj_step(m, data_);
    } else {
      mj_step2(m, data_);
      for (int i = 1; i < info_.control_substeps; ++i) mj_step(m, data_);
    }
    mj_step1(m, data_);
  } catch (const MujocoError& e) {
    return absl::InternalError(absl::StrCat(info_.name, ": physics: ", e.what()));
  }
  ++step_;

  // A blow-up (MuJoCo resets the state itself) ends the episode, counted.
  TimeStep timestep{StepType::kMid, 0.0f, 1.0f};
  if (InstabilityWarnings() != warnings_before) {
    ++physics_errors_;
    timestep.step_type = StepType::kLast;
  } else {
    timestep.reward = static_cast<float>(task_->Reward(m, data_));
    if (step_ >= info_.episode_steps) timestep.step_type = StepType::kLast;
  }
  needs_reset_ = timestep.step_type == StepType::kLast;
  RETURN_IF_ERROR(Observe(out));
  return timestep;
}

}  // namespace troupe::envs
