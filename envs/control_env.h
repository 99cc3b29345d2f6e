// The innermost env: one task on one mjData, one control step per Step.
#ifndef TROUPE_ENVS_CONTROL_ENV_H_
#define TROUPE_ENVS_CONTROL_ENV_H_

#include "envs/env.h"

namespace troupe::envs {

// Steps `task` with `control_substeps` physics steps per control step, as
// dm_control does: ctrl is set, the remaining half of the last mj_step runs
// (mj_step2), the other substeps run whole, and mj_step1 leaves positions,
// sensors and the scene consistent with the new state for observations.
class ControlEnv : public Environment {
 public:
  // `model` must be the model of `info`. Errors: Bind's NotFound naming the
  // missing element; InvalidArgument for an unknown camera; renderer errors
  // when pixels are on (the first frame is rendered here to surface them).
  static absl::StatusOr<std::unique_ptr<ControlEnv>> Create(const TaskInfo& info, std::shared_ptr<const Model> model,
                                                            const EnvOptions& options);
  ~ControlEnv() override;

  // The spec of a ControlEnv of `info` on `model` with `task` bound to it:
  // state fields from the task, pixels from the options, actions from the
  // actuators' control ranges. InvalidArgument for an unknown camera.
  static absl::StatusOr<EnvSpec> Describe(const TaskInfo& info, const Model& model, const Task& task,
                                          const EnvOptions& options);

  const EnvSpec& spec() const override { return spec_; }
  absl::StatusOr<TimeStep> Reset(ObservationBuffers out) override;
  absl::StatusOr<TimeStep> Step(std::span<const float> action, ObservationBuffers out) override;
  absl::Status Observe(ObservationBuffers out) override;
  int64_t physics_errors() const override { return physics_errors_; }
  const mjModel* model() const override { return model_->get(); }
  const mjData* data() const override { return data_; }
  const Task& task() const override { return *task_; }

 private:
  ControlEnv(const TaskInfo& info, std::shared_ptr<const Model> model, std::unique_ptr<Task> task,
             const EnvOptions& options);
  // The id of the camera pixels are rendered from (options.camera, else the
  // task's), or InvalidArgument naming the camera and the model file.
  static absl::StatusOr<int> PixelCamera(const TaskInfo& info, const Model& model, const EnvOptions& options);
  // Sum of MuJoCo's instability warnings (bad qpos/qvel/qacc) so far.
  int InstabilityWarnings() const;

  const TaskInfo& info_;
  std::shared_ptr<const Model> model_;
  std::unique_ptr<Task> task_;
  mjData* data_ = nullptr;
  RenderOptions render_;
  bool pixels_;
  int camera_id_ = -1;
  EnvSpec spec_;
  std::mt19937_64 rng_;
  int step_ = 0;
  bool needs_reset_ = true;
  int64_t physics_errors_ = 0;
};

}  // namespace troupe::envs

#endif  // TROUPE_ENVS_CONTROL_ENV_H_
