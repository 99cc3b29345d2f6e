// The evaluator: episodes with exploration off, whose mean return is the
// figure that counts.
#ifndef TROUPE_ACTORS_EVALUATOR_H_
#define TROUPE_ACTORS_EVALUATOR_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "actors/episode_recorder.h"
#include "actors/episode_stream.h"
#include "agents/policy.h"
#include "proto/config.pb.h"

namespace troupe::actors {

struct Evaluation {
  double mean_return = 0;
  // The fraction of action components the policy put at the bounds
  // (|a| >= kAtBound) over every step of every episode. Near 1, the actor's
  // tanh has saturated: it applies a bang-bang or constant action whatever
  // it sees, a failure the return alone does not name.
  double actions_at_bound = 0;
  static constexpr float kAtBound = 0.99f;
  // The share of actions at the bounds above which the learner warns.
  static constexpr double kSaturatedShare = 0.9;
};

// Episodes one evaluation may run at once (one env each, on one thread).
inline constexpr int kMaxEpisodes = 256;

// InvalidArgument naming the field ("evaluator.episodes 0: must be >= 1")
// for an evaluator section that cannot run.
absl::Status ValidateEvaluatorConfig(const config::EvaluatorConfig& evaluator);

// InvalidArgument naming evaluator.video_width or .video_height where
// evaluation videos are made at a size larger than config's task model's
// offscreen buffer can render (the env's task already known to exist).
absl::Status ValidateEvaluationVideoSize(const config::ExperimentConfig& config);

// Runs `episodes` full episodes of config's env (one env each, stepped
// together on one thread) with `policy`'s deterministic actions, seeded by
// `seed`. Errors: config and env errors. With a `publisher`, the first env's
// episode is published state by state (for `troupe view --live`), tagged
// with `parameter_version`. With a `recorder`, the first env's episode is
// queued as the video `video_path` (the recorder renders and encodes it on
// its own thread: Evaluate does not wait for it).
absl::StatusOr<Evaluation> Evaluate(const config::ExperimentConfig& config, agents::Policy& policy, int episodes,
                                    uint64_t seed, EpisodePublisher* publisher = nullptr,
                                    int64_t parameter_version = 0, EpisodeRecorder* recorder = nullptr,
                                    const std::string& video_path = "");

// The recorder for config's evaluation videos (evaluator.record_video,
// .video_width, .video_height), or null when they are off or the evaluator
// never runs; `on_video_written` (may be empty) is its
// RecorderOptions::on_video_written. Errors: EpisodeRecorder::Create's (no
// encoder, a size the task's model cannot render).
absl::StatusOr<std::unique_ptr<EpisodeRecorder>> MakeEvaluationRecorder(
    const config::ExperimentConfig& config,
    std::function<void(const std::string& path)> on_video_written = nullptr);

}  // namespace troupe::actors

#endif  // TROUPE_ACTORS_EVALUATOR_H_
