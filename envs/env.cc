#include "envs/env.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "envs/control_env.h"
#include "envs/wrappers.h"

namespace troupe::envs {

absl::StatusOr<EnvOptions> EnvOptions::FromConfig(const config::EnvConfig& config) {
  EnvOptions options;
  options.task = config.task();
  options.seed = config.seed();
  options.pixels = config.observation() == config::EnvConfig::PIXELS;
  options.render.width = config.render().width();
  options.render.height = config.render().height();
  options.render.shadows = config.render().shadows();
  options.render.reflections = config.render().reflections();
  options.multisample = config.render().multisample();
  options.camera = config.render().camera();
  options.action_repeat = config.action_repeat();
  options.frame_stack = config.frame_stack();
  RETURN_IF_ERROR(options.Validate());
  return options;
}

absl::Status EnvOptions::Validate() const {
  if (absl::Status found = FindTask(task).status(); !found.ok()) {
    return absl::Status(found.code(), absl::StrCat("env.task: ", found.message()));
  }
  if (action_repeat < 1 || action_repeat > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("env.action_repeat: ", action_repeat, " is outside [1, 1000]"));
  }
  if (frame_stack < 1 || frame_stack > 16) {
    return absl::InvalidArgumentError(absl::StrCat("env.frame_stack: ", frame_stack, " is outside [1, 16]"));
  }
  if (pixels && (render.width < 1 || render.height < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("env.render: size ", render.width, "x", render.height, " must be positive"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Model>> LoadTaskModel(const std::string& task, bool multisample) {
  ASSIGN_OR_RETURN(const TaskInfo* info, FindTask(task));
  return Model::Load(AssetsDir() + "/" + info->model_file, multisample);
}

TimeStep AdvanceEnv(Environment& env, EpisodeProgress& progress, bool reset, const float* action,
                    ObservationBuffers out, absl::Status* error) {
  absl::StatusOr<TimeStep> timestep;
  if (reset || progress.needs_reset) {
    timestep = env.Reset(out);
    progress.episode_step = 0;
  } else {
    timestep = env.Step(std::span<const float>(action, env.spec().action_size), out);
    ++progress.episode_step;
  }
  if (!timestep.ok()) {
    *error = timestep.status();
    timestep = TimeStep{StepType::kLast, 0.0f, 1.0f};
  }
  progress.needs_reset = timestep->step_type == StepType::kLast;
  return *timestep;
}

absl::StatusOr<EnvSpec> DescribeEnv(const EnvOptions& options) {
  RETURN_IF_ERROR(options.Validate());
  ASSIGN_OR_RETURN(const TaskInfo* info, FindTask(options.task));
  ASSIGN_OR_RETURN(std::shared_ptr<const Model> model, LoadTaskModel(options.task, /*multisample=*/false));
  const std::unique_ptr<Task> task = info->make();
  RETURN_IF_ERROR(task->Bind(model->get()));
  ASSIGN_OR_RETURN(EnvSpec spec, ControlEnv::Describe(*info, *model, *task, options));
  if (options.action_repeat > 1) spec = ActionRepeat::WrapSpec(std::move(spec), options.action_repeat);
  if (options.pixels && options.frame_stack > 1) spec = FrameStack::WrapSpec(std::move(spec), options.frame_stack);
  return spec;
}

absl::StatusOr<EnvSpec> DescribeEnv(const config::EnvConfig& config) {
  ASSIGN_OR_RETURN(const EnvOptions options, EnvOptions::FromConfig(config));
  return DescribeEnv(options);
}

absl::StatusOr<std::unique_ptr<Environment>> MakeEnv(const EnvOptions& options, std::shared_ptr<const Model> model) {
  RETURN_IF_ERROR(options.Validate());
  ASSIGN_OR_RETURN(const TaskInfo* info, FindTask(options.task));
  if (!model) {
    ASSIGN_OR_RETURN(model, LoadTaskModel(options.task, options.multisample));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Environment> env, ControlEnv::Create(*info, std::move(model), options));
  if (options.action_repeat > 1) env = std::make_unique<ActionRepeat>(std::move(env), options.action_repeat);
  if (options.pixels && options.frame_stack > 1) env = std::make_unique<FrameStack>(std::move(env), options.frame_stack);
  return env;
}

}  // namespace troupe::envs
