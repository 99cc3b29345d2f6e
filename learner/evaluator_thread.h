// The RL learner's evaluator (rank 0): on a schedule of env frames, a
// snapshot of the policy is evaluated (actors/evaluator.h: episodes with
// exploration off, the first one published for `troupe view --live` and
// recorded as RunLayout::eval_video) on a thread of its own, while training
// goes on. Evaluations are due at the first frames at or past each multiple
// of evaluator.every_frames (0: never), so a resumed run keeps the grid a
// fresh one has. One evaluation runs at a time.
//
// Threads: MaybeStart, Wait and FlushVideos on one thread (the learner's);
// `on_result` is called on the evaluator's thread.
#ifndef TROUPE_LEARNER_EVALUATOR_THREAD_H_
#define TROUPE_LEARNER_EVALUATOR_THREAD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "actors/episode_recorder.h"
#include "actors/episode_stream.h"
#include "actors/evaluator.h"
#include "agents/policy.h"
#include "common/run_layout.h"
#include "proto/config.pb.h"

namespace troupe::learner {

class EvaluatorThread {
 public:
  // What one evaluation gave, at `frames` env frames and `updates` updates.
  using OnResult = std::function<void(int64_t frames, int64_t updates, const actors::Evaluation& evaluation)>;

  // The policy for `spec` and `action_size`, the video recorder
  // (evaluator.record_video; each written video is given to
  // `on_video_written`, which may be empty), and `publisher` (may be null)
  // for the episodes. Errors: the policy's and the recorder's (a missing
  // encoder, a bad video size), before training.
  static absl::StatusOr<std::unique_ptr<EvaluatorThread>> Create(
      const config::ExperimentConfig& config, const agents::ObservationSpec& spec, int action_size,
      const RunLayout& run, actors::EpisodePublisher* publisher,
      std::function<void(const std::string& path)> on_video_written, OnResult on_result);
  ~EvaluatorThread();  // joins a running evaluation (videos being encoded are not waited for)

  // The next evaluation is due at the first point after `frames` (a fresh
  // run: 0; a resumed one: its last evaluation's frames).
  void ScheduleAfter(int64_t frames);
  int64_t next_due() const { return next_due_; }

  // Starts an evaluation of `parameters` (the policy at `updates`) when one
  // is due at `frames` (or, with `force`, now) and none is running; the
  // next is then due after `frames`. Whether one started.
  bool MaybeStart(int64_t frames, int64_t updates, const std::vector<float>& parameters, bool force = false);
  // Waits for a running evaluation to finish.
  void Wait();
  // Waits for the videos still being encoded (an error is said on stderr).
  void FlushVideos();

 private:
  EvaluatorThread(const config::ExperimentConfig& config, const RunLayout& run, actors::EpisodePublisher* publisher,
                  OnResult on_result)
      : config_(config), layout_(run), publisher_(publisher), on_result_(std::move(on_result)) {}
  // The evaluation of `parameters` at `frames` and `updates`: the evaluator's thread.
  void Evaluate(int64_t frames, int64_t updates, const std::vector<float>& parameters);

  const config::ExperimentConfig config_;
  const RunLayout layout_;
  actors::EpisodePublisher* const publisher_;
  const OnResult on_result_;
  std::unique_ptr<agents::Policy> policy_;  // the evaluator's thread only
  // Evaluation videos (null when off): fed on the evaluator's thread,
  // rendered and encoded on the recorder's own.
  std::unique_ptr<actors::EpisodeRecorder> recorder_;
  int64_t next_due_ = 0;
  std::atomic<bool> running_{false};
  std::jthread thread_;  // last: joined first
};

}  // namespace troupe::learner

#endif  // TROUPE_LEARNER_EVALUATOR_THREAD_H_
