#include "learner/evaluator_thread.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "agents/policies.h"
#include "common/allocator.h"
#include "common/status_macros.h"

namespace troupe::learner {

absl::StatusOr<std::unique_ptr<EvaluatorThread>> EvaluatorThread::Create(
    const config::ExperimentConfig& config, const agents::ObservationSpec& spec, int action_size,
    const RunLayout& run, actors::EpisodePublisher* publisher,
    std::function<void(const std::string& path)> on_video_written, OnResult on_result) {
  std::unique_ptr<EvaluatorThread> evaluator(new EvaluatorThread(config, run, publisher, std::move(on_result)));
  ASSIGN_OR_RETURN(evaluator->policy_, agents::CreatePolicy(config, spec, action_size));
  ASSIGN_OR_RETURN(evaluator->recorder_, actors::MakeEvaluationRecorder(config, std::move(on_video_written)));
  evaluator->ScheduleAfter(0);
  return evaluator;
}

EvaluatorThread::~EvaluatorThread() { Wait(); }

void EvaluatorThread::ScheduleAfter(int64_t frames) {
  const int64_t every = std::max<int64_t>(config_.evaluator().every_frames(), 1);
  next_due_ = (frames / every + 1) * every;
}

bool EvaluatorThread::MaybeStart(int64_t frames, int64_t updates, const std::vector<float>& parameters, bool force) {
  if (config_.evaluator().every_frames() <= 0 || running_.load() || (frames < next_due_ && !force)) return false;
  ScheduleAfter(frames);
  thread_ = std::jthread();  // the previous one has finished (running_ is false)
  running_ = true;
  // A snapshot of the policy: training goes on.
  thread_ = std::jthread([this, snapshot = parameters, frames, updates] {
    Evaluate(frames, updates, snapshot);
    // What the evaluation freed (its env, renderer, episode buffers: tens of
    // MiB for pixels) goes back to the system: glibc kept freed memory in
    // this thread's arena, where the next evaluation, on a new thread, may
    // not find it, and a long run's resident memory stepped up by ~25-35 MiB
    // at each evaluation (docs/development.md "Soak"); tcmalloc keeps it in
    // its page heap.
    ReleaseFreeMemory();
    running_ = false;
  });
  return true;
}

void EvaluatorThread::Wait() { thread_ = std::jthread(); }

void EvaluatorThread::FlushVideos() {
  if (!recorder_) return;
  if (const absl::Status video = recorder_->Flush(); !video.ok()) {
    std::fprintf(stderr, "evaluator: video: %s\n", video.ToString().c_str());
  }
}

void EvaluatorThread::Evaluate(int64_t frames, int64_t updates, const std::vector<float>& parameters) {
  actors::Evaluation evaluation;
  absl::Status status = policy_->SetParameters(parameters);
  if (status.ok()) {
    auto result = actors::Evaluate(config_, *policy_, config_.evaluator().episodes(),
                                   config_.env().seed() + 7777 + uint64_t(updates), publisher_, updates,
                                   recorder_.get(), layout_.eval_video(frames));
    if (result.ok()) evaluation = *result;
    status = result.status();
  }
  if (!status.ok()) {
    std::fprintf(stderr, "evaluator: %s\n", status.ToString().c_str());
    return;
  }
  if (evaluation.actions_at_bound >= actors::Evaluation::kSaturatedShare) {
    std::fprintf(stderr,
                 "evaluator: %.0f%% of the policy's actions are at +-1 at %ld frames: its tanh has saturated "
                 "(%s)\n",
                 100 * evaluation.actions_at_bound, long(frames), agents::SaturationHint(config_).c_str());
  }
  if (on_result_) on_result_(frames, updates, evaluation);
}

}  // namespace troupe::learner
