#include "actors/scripted_actor.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>

#include <google/protobuf/text_format.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/files.h"
#include "common/image.h"
#include "common/plot.h"
#include "common/run_layout.h"
#include "common/status_line.h"
#include "common/status_macros.h"
#include "envs/env_pool.h"

namespace troupe::actors {
namespace {

}  // namespace

absl::StatusOr<ScriptedPolicyKind> ParseScriptedPolicyKind(const std::string& kind, const std::string& field) {
  ScriptedPolicyKind parsed;
  if (config::ScriptedPolicyConfig::Kind_Parse(absl::AsciiStrToUpper(kind), &parsed)) return parsed;
  return absl::InvalidArgumentError(absl::StrCat(field, ": '", kind, "' is not one of controller, zero, random"));
}

absl::StatusOr<ScriptedRunResult> RunScripted(const config::ExperimentConfig& config, const std::atomic<bool>* stop) {
  const ScriptedPolicyKind policy = config.policy().kind();
  ASSIGN_OR_RETURN(auto options, envs::EnvPoolOptions::FromConfig(config.env(), config.pool()));
  if (options.batch_size != 0 && options.batch_size != options.num_envs) {
    return absl::InvalidArgumentError("pool.batch_size: a scripted run steps the pool in sync mode; leave it 0");
  }
  ASSIGN_OR_RETURN(auto pool, envs::EnvPool::Create(options));
  ScriptedRunResult result;
  ASSIGN_OR_RETURN(result.run_dir, MakeRunDirectory(config.runs_dir(), config.name()));

  // The resolved config, then one CSV row per finished episode.
  std::string text;
  google::protobuf::TextFormat::PrintToString(config, &text);
  const RunLayout run(result.run_dir);
  RETURN_IF_ERROR(WriteFileAtomically(run.config(), text));
  RowLog<EpisodeRow> episodes(run);
  RETURN_IF_ERROR(episodes.WriteHeader());

  const envs::EnvSpec& spec = pool->spec();
  const int n = pool->num_envs();
  std::vector<float> actions(size_t(n) * spec.action_size, 0.0f);
  std::vector<double> command(spec.action_size);
  std::vector<double> episode_return(n, 0.0);
  std::vector<int64_t> episode_end_frames;
  std::mt19937_64 rng(config.env().seed());
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);

  StatusLine status_line;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  ASSIGN_OR_RETURN(envs::EnvBatch batch, pool->Reset());
  while (result.frames < config.total_frames() && !(stop && stop->load())) {
    // Choose each env's action from its current state.
    for (int i = 0; i < n; ++i) {
      float* a = &actions[size_t(i) * spec.action_size];
      if (policy == config::ScriptedPolicyConfig::CONTROLLER &&
          pool->task().Controller(pool->model(), pool->data(i), command.data())) {
        for (int j = 0; j < spec.action_size; ++j) a[j] = float(command[j]);
      } else if (policy != config::ScriptedPolicyConfig::ZERO) {
        for (int j = 0; j < spec.action_size; ++j) a[j] = uniform(rng);
      }
    }
    ASSIGN_OR_RETURN(batch, pool->Step(actions));
    // Account frames and finished episodes.
    for (int i = 0; i < n; ++i) {
      if (batch.step_type[i] == uint8_t(envs::StepType::kFirst)) continue;
      result.frames += spec.action_repeat;
      episode_return[i] += batch.reward[i];
      if (batch.step_type[i] == uint8_t(envs::StepType::kLast)) {
        result.returns.push_back(episode_return[i]);
        episode_end_frames.push_back(result.frames);
        episodes.Append({.episode = int64_t(result.returns.size()),
                         .env = i,
                         .frames = result.frames,
                         .episode_return = episode_return[i],
                         .seconds = elapsed()});
        episode_return[i] = 0.0;
      }
    }
    const double seconds = elapsed();
    status_line.Update(absl::StrFormat(
        "%s | frames %d | %.0f fps | episodes %d | last return %s | physics errors %d", spec.task, result.frames,
        result.frames / std::max(seconds, 1e-9), result.returns.size(),
        result.returns.empty() ? "-" : absl::StrFormat("%.1f", result.returns.back()), pool->physics_errors()));
  }
  result.frames_per_second = result.frames / std::max(elapsed(), 1e-9);

  // Episode returns against env frames.
  PlotSeries curve{config.policy().kind() + " policy", {}, result.returns};
  for (const auto& end : episode_end_frames) curve.x.push_back(double(end));
  RETURN_IF_ERROR(WritePng(run.returns_plot(),
                           PlotLines({curve}, PlotOptions{640, 400, spec.task, "env frames", "episode return"})));
  result.physics_errors = pool->physics_errors();

  // What env 0 saw last: each stacked frame side by side.
  if (spec.pixel_bytes() > 0) {
    const int frames = spec.channels / 3;
    Image image(spec.width * frames, spec.height, 3);
    for (int y = 0; y < spec.height; ++y) {
      for (int x = 0; x < spec.width; ++x) {
        for (int f = 0; f < frames; ++f) {
          const uint8_t* src = batch.pixels.data() + (size_t(y) * spec.width + x) * spec.channels + 3 * f;
          std::copy(src, src + 3, image.at(f * spec.width + x, y));
        }
      }
    }
    RETURN_IF_ERROR(WritePng(result.run_dir + "/frames.png", image));
  }
  return result;
}

}  // namespace troupe::actors
