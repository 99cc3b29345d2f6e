#include "actors/evaluator.h"

#include <cmath>
#include <memory>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "actors/actor.h"
#include "actors/observation_stack.h"
#include "common/status_macros.h"
#include "envs/env.h"
#include "envs/env_pool.h"
#include "envs/model.h"

namespace troupe::actors {

namespace {
// Whether MakeEvaluationRecorder makes a recorder.
bool MakesVideos(const config::EvaluatorConfig& evaluator) {
  return evaluator.record_video() && evaluator.every_frames() > 0;
}
}  // namespace

absl::Status ValidateEvaluatorConfig(const config::EvaluatorConfig& evaluator) {
  if (evaluator.every_frames() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("evaluator.every_frames ", evaluator.every_frames(), ": must be >= 0 (0 = never)"));
  }
  if (evaluator.episodes() < 1 || evaluator.episodes() > kMaxEpisodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("evaluator.episodes ", evaluator.episodes(), ": must be in [1, ", kMaxEpisodes, "]"));
  }
  // The video's size, where videos are made: H.264 (4:2:0) needs even sides.
  // Checked here, before anything starts, as well as by the recorder
  // (ValidateEvaluationVideoSize holds it to the task model's buffer).
  if (MakesVideos(evaluator)) {
    for (const auto& [field, size] : {std::pair{"video_width", evaluator.video_width()},
                                      std::pair{"video_height", evaluator.video_height()}}) {
      if (size < 2 || size % 2 != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "evaluator.", field, " ", size,
            ": must be even and at least 2 (H.264; evaluator.record_video: false turns evaluation videos off)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateEvaluationVideoSize(const config::ExperimentConfig& config) {
  const config::EvaluatorConfig& evaluator = config.evaluator();
  if (!MakesVideos(evaluator)) return absl::OkStatus();
  ASSIGN_OR_RETURN(const std::shared_ptr<const envs::Model> model,
                   envs::LoadTaskModel(config.env().task(), /*multisample=*/false));
  const mjModel* m = model->get();
  for (const auto& [field, size, most] : {std::tuple{"video_width", evaluator.video_width(), m->vis.global.offwidth},
                                          std::tuple{"video_height", evaluator.video_height(), m->vis.global.offheight}}) {
    if (size > most) {
      return absl::InvalidArgumentError(absl::StrCat(
          "evaluator.", field, " ", size, ": must be at most ", most, " (the offscreen buffer of task ",
          config.env().task(), "'s model ", model->path(),
          "; evaluator.record_video: false turns evaluation videos off)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<EpisodeRecorder>> MakeEvaluationRecorder(
    const config::ExperimentConfig& config, std::function<void(const std::string& path)> on_video_written) {
  const config::EvaluatorConfig& evaluator = config.evaluator();
  if (!evaluator.record_video() || evaluator.every_frames() <= 0) return std::unique_ptr<EpisodeRecorder>();
  RecorderOptions options;
  options.task = config.env().task();
  options.action_repeat = config.env().action_repeat();
  options.width = evaluator.video_width();
  options.height = evaluator.video_height();
  options.on_video_written = std::move(on_video_written);
  // At most three evaluations' videos wait (a few minutes of a 2-core
  // machine's spare time); a fourth is dropped, and the learner's final
  // flush waits for no more than three.
  ASSIGN_OR_RETURN(const envs::EnvSpec spec, envs::DescribeEnv(config.env()));
  options.max_queued_states = 3 * size_t(spec.episode_steps + 1);
  auto recorder = EpisodeRecorder::Create(options);
  if (!recorder.ok()) {
    return absl::Status(recorder.status().code(),
                        absl::StrCat("evaluator.record_video: ", recorder.status().message(),
                                     " (evaluator.record_video: false turns evaluation videos off)"));
  }
  return std::move(*recorder);
}

absl::StatusOr<Evaluation> Evaluate(const config::ExperimentConfig& config, agents::Policy& policy, int episodes,
                                    uint64_t seed, EpisodePublisher* publisher, int64_t parameter_version,
                                    EpisodeRecorder* recorder, const std::string& video_path) {
  // The env as the agent observes it (frames stacked; the pool renders single frames).
  ASSIGN_OR_RETURN(const envs::EnvSpec observed, envs::DescribeEnv(config.env()));
  const agents::ObservationSpec spec = agents::ObservationSpecOf(observed);
  const int action_size = observed.action_size;
  config::EnvConfig env_config = config.env();
  env_config.set_frame_stack(1);
  env_config.set_seed(seed);
  config::EnvPoolConfig pool_config;
  pool_config.set_num_envs(episodes);
  pool_config.set_num_threads(1);
  ASSIGN_OR_RETURN(auto options, envs::EnvPoolOptions::FromConfig(env_config, pool_config));
  ASSIGN_OR_RETURN(auto pool, envs::EnvPool::Create(options));
  const envs::EnvSpec& env_spec = pool->spec();
  const bool pixels = spec.pixels();
  ObservationStack stack(episodes, std::max(spec.frames, 1), spec.height, spec.width);
  std::vector<float> actions(size_t(episodes) * action_size);
  std::vector<double> returns(episodes, 0.0);
  std::vector<bool> done(episodes, false);

  ASSIGN_OR_RETURN(envs::EnvBatch batch, pool->Reset());
  if (pixels) {
    for (int i = 0; i < episodes; ++i) stack.Reset(i, batch.pixels.data() + size_t(i) * env_spec.pixel_bytes());
  }
  // The first env's episode goes to the live viewers, if any.
  if (publisher) {
    publisher->BeginEpisode();
    publisher->Publish(pool->model(), pool->data(0), /*step=*/0, /*last=*/false, {}, 0.0,
                       parameter_version);
  }
  // The first env's episode is also the video, if one is asked for.
  if (recorder) {
    recorder->BeginVideo(video_path);
    recorder->Record(pool->data(0));
  }
  int64_t step = 0, at_bound = 0, counted = 0;
  int remaining = episodes;
  while (remaining > 0) {
    RETURN_IF_ERROR(policy.Act(pixels ? nullptr : batch.state.data(), pixels ? stack.Stacked() : nullptr, episodes,
                               actions.data()));
    ASSIGN_OR_RETURN(batch, pool->Step(actions));
    if (publisher && !done[0]) {
      const bool last = batch.step_type[0] == uint8_t(envs::StepType::kLast);
      publisher->Publish(pool->model(), pool->data(0), ++step, last,
                         std::span<const float>(actions.data(), action_size), batch.reward[0], parameter_version);
    }
    if (recorder && !done[0]) {
      recorder->Record(pool->data(0));
      if (batch.step_type[0] == uint8_t(envs::StepType::kLast)) recorder->EndVideo();
    }
    for (int i = 0; i < episodes; ++i) {
      if (pixels) stack.Push(i, batch.pixels.data() + size_t(i) * env_spec.pixel_bytes());
      if (done[i]) continue;  // finished envs idle (they auto-reset) until all are done
      returns[i] += batch.reward[i];
      for (int a = 0; a < action_size; ++a) {
        at_bound += std::fabs(actions[size_t(i) * action_size + a]) >= Evaluation::kAtBound;
      }
      counted += action_size;
      if (batch.step_type[i] == uint8_t(envs::StepType::kLast)) {
        done[i] = true;
        --remaining;
      }
    }
  }
  Evaluation result;
  for (double r : returns) result.mean_return += r / episodes;
  result.actions_at_bound = counted > 0 ? double(at_bound) / double(counted) : 0.0;
  return result;
}

}  // namespace troupe::actors
